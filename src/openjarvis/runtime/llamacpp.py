"""The llama.cpp engine: llama-cpp-python in process, model loaded once, tokens timed one by one.

llama-cpp-python reports token counts but no timings, so generation runs token by token
here: TTFT, decode time and stop sequences are measured and applied on our side.
"""

import ctypes
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import psutil

from openjarvis.errors import UserError
from openjarvis.runtime.models import check_gguf
from openjarvis.runtime.types import Completion, GenerationRequest, StreamChunk

__all__ = ["LlamaCppEngine", "LlamaCppSettings"]


@dataclass(frozen=True, slots=True)
class LlamaCppSettings:
    n_ctx: int = 4096  # capped at the model's training context when that is smaller
    n_threads: int | None = None  # None: physical cores (decode stops scaling past them)
    n_gpu_layers: int = 0
    n_batch: int = 512
    # Reusing the KV cache of a shared prompt prefix speeds chat up, but a benchmark measures
    # every request from a cold cache so that each sample pays for its own prefill.
    reuse_prompt_cache: bool = True

    def resolved_threads(self) -> int:
        return self.n_threads or psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


_SILENT_LOG: list[object] = []  # keeps the ctypes callback alive while llama.cpp holds it


def _silence_llama_cpp(llama_cpp: ModuleType) -> None:
    """Turn llama.cpp's own logging off: load errors reach the user as one UserError line."""
    if not _SILENT_LOG:
        callback = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
        llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
        _SILENT_LOG.append(callback)


class LlamaCppEngine:
    """Greedy (or seeded sampled) plain-text completion over a GGUF file."""

    def __init__(self, model_path: Path, settings: LlamaCppSettings | None = None) -> None:
        check_gguf(model_path)
        try:
            import llama_cpp
        except ImportError as error:
            raise UserError(
                "llama-cpp-python is not installed: pip install llama-cpp-python"
            ) from error
        _silence_llama_cpp(llama_cpp)
        self.settings = settings or LlamaCppSettings()
        self._path = model_path
        try:
            self._llama = llama_cpp.Llama(
                model_path=str(model_path),
                n_ctx=self.settings.n_ctx,
                n_threads=self.settings.resolved_threads(),
                n_gpu_layers=self.settings.n_gpu_layers,
                n_batch=self.settings.n_batch,
                verbose=False,
            )
        except (ValueError, RuntimeError) as error:
            raise UserError(
                f"llama.cpp could not load {model_path}: the file is damaged or its architecture "
                "is not supported by this llama-cpp-python; re-download the model or upgrade "
                "llama-cpp-python"
            ) from error
        self._is_end_of_generation = lambda token: llama_cpp.llama_vocab_is_eog(
            self._llama._model.vocab, token
        )
        train_ctx = self._llama._model.n_ctx_train()
        self.n_ctx = min(self._llama.n_ctx(), train_ctx) if train_ctx > 0 else self._llama.n_ctx()

    @property
    def model_name(self) -> str:
        return self._path.stem

    def settings_dict(self) -> dict[str, object]:
        return {
            "n_ctx": self.n_ctx,
            "n_threads": self.settings.resolved_threads(),
            "n_gpu_layers": self.settings.n_gpu_layers,
            "n_batch": self.settings.n_batch,
            "reuse_prompt_cache": self.settings.reuse_prompt_cache,
        }

    def generate(self, request: GenerationRequest) -> Completion:
        start_s = time.monotonic()
        run = _Generation(self, request)
        token_times_s = list(run)
        end_s = time.monotonic()
        first_s = token_times_s[0] if token_times_s else None
        return Completion(
            text=run.text,
            prompt_tokens=run.prompt_tokens,
            completion_tokens=len(token_times_s),
            finish_reason=run.finish_reason,
            wall_s=end_s - start_s,
            ttft_s=None if first_s is None else first_s - start_s,
            decode_s=None if first_s is None else token_times_s[-1] - first_s,
        )

    def stream(self, request: GenerationRequest) -> Iterator[StreamChunk]:
        """Yield text as it is decided: text that may still become a stop sequence is held."""
        run = _Generation(self, request)
        emitted = 0
        for time_s in run:
            safe = len(run.text) - _held_back(run.text, request.stop)
            if safe > emitted:
                yield StreamChunk(run.text[emitted:safe], time_s)
                emitted = safe
        if len(run.text) > emitted:
            yield StreamChunk(run.text[emitted:], time.monotonic())

    def close(self) -> None:
        self._llama.close()


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters could still be the start of a stop sequence."""
    held = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                held = max(held, size)
                break
    return held


class _Generation:
    """One request, decoded token by token. Iterating yields each token's arrival time;
    afterwards `text` (cut before any stop sequence) and `finish_reason` hold the outcome."""

    def __init__(self, engine: LlamaCppEngine, request: GenerationRequest) -> None:
        self._llama = engine._llama
        self._is_end = engine._is_end_of_generation
        if not engine.settings.reuse_prompt_cache:
            self._llama.reset()
        self._request = request
        self._prompt = self._llama.tokenize(request.prompt.encode("utf-8"), add_bos=True)
        self.prompt_tokens = len(self._prompt)
        if self.prompt_tokens + request.max_tokens > engine.n_ctx:
            raise UserError(
                f"prompt ({self.prompt_tokens} tokens) plus max_tokens ({request.max_tokens}) "
                f"exceeds the model context of {engine.n_ctx} tokens; raise --n-ctx or lower "
                "max_tokens"
            )
        self.text = ""
        self.finish_reason = "length"

    def __iter__(self) -> Iterator[float]:
        llama, request = self._llama, self._request
        if request.seed is not None:
            llama.set_seed(request.seed)
        generated: list[int] = []
        # temp 0 selects llama.cpp's greedy sampler; repeat_penalty 1 leaves logits untouched.
        tokens = llama.generate(
            self._prompt, temp=request.temperature, repeat_penalty=1.0, reset=True
        )
        for token in tokens:
            now_s = time.monotonic()
            if self._is_end(token):
                self.finish_reason = "stop"
                return
            generated.append(token)
            self.text = llama.detokenize(generated).decode("utf-8", errors="ignore")
            cut = min((i for stop in request.stop if (i := self.text.find(stop)) >= 0), default=-1)
            if cut >= 0:
                self.text = self.text[:cut]
                self.finish_reason = "stop"
            yield now_s
            if self.finish_reason == "stop" or len(generated) >= request.max_tokens:
                return
