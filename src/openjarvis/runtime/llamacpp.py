"""The llama.cpp engine: llama-cpp-python in process, model loaded once, tokens timed one by one.

llama-cpp-python reports token counts but no timings, so generation runs token by token
here: TTFT, decode time and stop sequences are measured and applied on our side. Requests from
several threads share each decode step (runtime/llamacpp_batch.py).
"""

import ctypes
import json
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import psutil

from openjarvis.errors import UserError
from openjarvis.runtime.chat_template import ChatTemplate
from openjarvis.runtime.gguf import read_gguf_header
from openjarvis.runtime.ledger import StepLedger
from openjarvis.runtime.llamacpp_batch import BatchScheduler, Sequence
from openjarvis.runtime.llamacpp_probe import check_llama_cpp_runs
from openjarvis.runtime.models import check_gguf
from openjarvis.runtime.roofline import Bandwidth, decode_bytes_per_token, host_bandwidth
from openjarvis.runtime.streaming import Outcome, singly, stream_text
from openjarvis.runtime.types import (
    ChatRequest,
    Completion,
    Request,
    StreamChunk,
    WorkPiece,
    final_completion,
)

__all__ = ["LlamaCppEngine", "LlamaCppSettings"]


@dataclass(frozen=True, slots=True)
class LlamaCppSettings:
    n_ctx: int = 4096  # per sequence; 0: the model's training context; capped at it
    n_threads: int | None = None  # decode; None: physical cores (decode stops scaling past them)
    # Prefill; None: n_threads when that is set, else every logical core (prefill still scales).
    # llama-cpp-python's own default is every logical core even when n_threads is smaller.
    n_threads_batch: int | None = None
    n_gpu_layers: int = 0  # -1 offloads every layer
    n_batch: int = 512
    # Reusing the KV cache of a shared prompt prefix speeds chat up, but a benchmark measures
    # every request from a cold cache so that each sample pays for its own prefill.
    reuse_prompt_cache: bool = True
    # Sequences decoded together, one token each per llama_decode; each holds n_ctx KV cells.
    # On 2 CPU cores 4 requests at once run 1.2-1.4x the tokens/s of one after another, 8
    # 1.5-1.7x, 2 nothing (docs/benchmarks.md); 1 takes requests strictly in turn.
    concurrency: int = 4

    def resolved_threads(self) -> int:
        return self.n_threads or psutil.cpu_count(logical=False) or psutil.cpu_count() or 1

    def resolved_batch_threads(self) -> int:
        return self.n_threads_batch or self.n_threads or psutil.cpu_count() or 1


_SILENT_LOG: list[object] = []  # keeps the ctypes callback alive while llama.cpp holds it


def _silence_llama_cpp(llama_cpp: ModuleType) -> None:
    """Turn llama.cpp's own logging off: load errors reach the user as one UserError line."""
    if not _SILENT_LOG:
        callback = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
        llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
        _SILENT_LOG.append(callback)


def _import_llama_cpp() -> ModuleType:
    try:
        import llama_cpp
    except ImportError as error:
        raise UserError(
            "llama-cpp-python is not installed: pip install llama-cpp-python"
        ) from error
    _silence_llama_cpp(llama_cpp)
    return llama_cpp


# enum ggml_backend_dev_type (ggml-backend.h): CPU, GPU, IGPU, ACCEL, META.
_GGML_DEVICE_TYPE_GPU = 1


def _gpu_placement(llama_cpp: ModuleType, n_gpu_layers: int) -> dict[str, int]:
    """With no layer on a GPU, keep llama.cpp off every GPU. Otherwise a GPU build still opens
    each visible GPU and sends large prompt batches to the first one (op offload, on by default),
    work that an energy scope of the engine's devices would leave out."""
    if n_gpu_layers != 0:
        return {}
    # Split mode "none" keeps only `main_gpu`, and a negative one keeps no GPU at all.
    return {"split_mode": llama_cpp.LLAMA_SPLIT_MODE_NONE, "main_gpu": -1}


def _gpu_devices(llama_cpp: ModuleType, n_gpu_layers: int) -> tuple[int, ...]:
    """The GPUs llama.cpp computes on, as CUDA indices: none without layers on a GPU (see
    `_gpu_placement`) or without a GPU build. With layers offloaded, llama.cpp's default device
    selection takes every GPU it sees and splits the layers across all of them (split mode
    "layer"), so every visible GPU is in use."""
    if n_gpu_layers == 0 or not llama_cpp.llama_supports_gpu_offload():
        return ()
    return tuple(range(_ggml_gpu_count()))


def _ggml_gpu_count() -> int:
    """Discrete GPUs in ggml's device list, the one llama.cpp picks from. llama-cpp-python's
    bindings do not offer that list, so ggml's own library is asked (it loads with llama_cpp)."""
    from llama_cpp._ggml import libggml

    libggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    libggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    libggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    libggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    libggml.ggml_backend_dev_type.restype = ctypes.c_int
    devices = [libggml.ggml_backend_dev_get(i) for i in range(libggml.ggml_backend_dev_count())]
    return sum(libggml.ggml_backend_dev_type(d) == _GGML_DEVICE_TYPE_GPU for d in devices)


class LlamaCppEngine:
    """Chat and plain completions over one GGUF file; up to `concurrency` requests share each
    decode step."""

    kind = "llamacpp"

    def __init__(
        self, model_path: Path, settings: LlamaCppSettings | None = None, name: str | None = None
    ) -> None:
        check_gguf(model_path)
        self.settings = settings or LlamaCppSettings()
        if self.settings.concurrency < 1:
            raise UserError(f"concurrency must be at least 1, not {self.settings.concurrency}")
        check_llama_cpp_runs(model_path, self.settings.n_gpu_layers)
        self._name = name or model_path.stem
        self._header = read_gguf_header(model_path)
        llama_cpp = _import_llama_cpp()
        self._llama_cpp = llama_cpp
        self._path = model_path
        self._weights_bytes = model_path.stat().st_size
        try:
            self._llama = llama_cpp.Llama(
                model_path=str(model_path),
                n_ctx=self.settings.n_ctx,
                n_threads=self.settings.resolved_threads(),
                n_threads_batch=self.settings.resolved_batch_threads(),
                n_gpu_layers=self.settings.n_gpu_layers,
                n_batch=self.settings.n_batch,
                verbose=False,
                **_gpu_placement(llama_cpp, self.settings.n_gpu_layers),
            )
        except (ValueError, RuntimeError) as error:
            raise UserError(
                f"llama.cpp could not load {model_path}: the file is damaged or its architecture "
                "is not supported by this llama-cpp-python; re-download the model or upgrade "
                "llama-cpp-python"
            ) from error
        model = self._llama._model
        self._is_end_of_generation = lambda token: llama_cpp.llama_vocab_is_eog(model.vocab, token)
        train_ctx = model.n_ctx_train()
        self.n_ctx = min(self._llama.n_ctx(), train_ctx) if train_ctx > 0 else self._llama.n_ctx()
        self.chat_template = ChatTemplate.for_model(
            llama_cpp,
            self._llama.metadata,
            self._header.architecture or "",
            bos=model.token_get_text(self._llama.token_bos()),
            eos=model.token_get_text(self._llama.token_eos()),
        )
        # Measured before any request, so that no energy window pays for it. With layers on a
        # GPU, host memory bandwidth is the wrong roof: MBU stays unknown there.
        self.bandwidth: Bandwidth | None = (
            host_bandwidth() if self.settings.n_gpu_layers == 0 else None
        )
        self._lock = threading.Lock()  # logits() evaluates in Llama's own context
        self._devices = _gpu_devices(llama_cpp, self.settings.n_gpu_layers)
        self._scheduler = BatchScheduler(
            llama_cpp,
            self._llama,
            n_ctx=self.n_ctx,
            concurrency=self.settings.concurrency,
            reuse_prompt_cache=self.settings.reuse_prompt_cache,
            is_end=self._is_end_of_generation,
        )

    @property
    def concurrency(self) -> int:
        return self.settings.concurrency

    @property
    def ledger(self) -> StepLedger:
        return self._scheduler.ledger

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def devices(self) -> tuple[int, ...]:
        return self._devices

    def settings_dict(self) -> dict[str, object]:
        return {
            "n_ctx": self.n_ctx,
            "n_threads": self.settings.resolved_threads(),
            "n_threads_batch": self.settings.resolved_batch_threads(),
            "n_gpu_layers": self.settings.n_gpu_layers,
            "n_batch": self.settings.n_batch,
            "reuse_prompt_cache": self.settings.reuse_prompt_cache,
            "concurrency": self.settings.concurrency,
            "chat_template": self.chat_template.name,
            "memory_bandwidth_gb_per_s": self.bandwidth.gb_per_s if self.bandwidth else None,
        }

    def generate(self, request: Request) -> Completion:
        return final_completion(self.stream(request))

    def stream(self, request: Request) -> Generator[StreamChunk]:
        """Yield text as it is decided: text that may still become a stop sequence is held.

        The request holds one of the scheduler's sequences until the stream is drained or
        closed; beyond `concurrency` streams, a stream waits for a free one.
        """
        start_s = time.monotonic()
        run = _Generation(self, request)
        sequence = Sequence(
            run.prompt, run.max_tokens, request.temperature, request.seed, run.grammar
        )
        yield from stream_text(
            singly(self._scheduler.submit(sequence, request.ledger_key)),
            piece=lambda token: self._llama.detokenize([token]),
            is_end=self._is_end_of_generation,
            stop=request.stop,
            max_tokens=run.max_tokens,
            start_s=start_s,
            clock=time.monotonic,
            finish=lambda outcome: self._completion(
                outcome, run.prompt_tokens, tuple(sequence.work), sequence.reused
            ),
        )

    def _completion(
        self, outcome: Outcome, prompt_tokens: int, work: tuple[WorkPiece, ...], reused: int
    ) -> Completion:
        generated = len(outcome.token_times_s)
        context_tokens = prompt_tokens + generated / 2  # mean context over the decode
        return outcome.completion(
            prompt_tokens,
            decode_bytes_per_token=decode_bytes_per_token(
                self._header, self._weights_bytes, context_tokens
            ),
            bandwidth_bytes_per_s=self.bandwidth.bytes_per_s if self.bandwidth else None,
            work=work,
            cached_tokens=reused,
        )

    # ---- log-likelihood (lm-eval's loglikelihood requests use these) ------------------------

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """The model's tokens for text; `special` parses special tokens written as text (a
        rendered chat template's), as a chat request's prompt is parsed."""
        return list(self._llama.tokenize(text.encode("utf-8"), add_bos, special))

    def logits(self, prompt: list[int], first: int = 0) -> np.ndarray:
        """Float32 logits after each prompt position from `first` on, [len(prompt) - first,
        vocab]: row i predicts the token after prompt[first + i].

        The context keeps only its last position's logits (keeping every position's, llama.cpp's
        logits_all, costs n_ctx x vocab floats), so the prompt up to `first` is evaluated as one
        batch and the rest one token at a time: cheap for the few tokens of a continuation.
        """
        if not 0 <= first < len(prompt):
            raise ValueError(f"first={first} is outside a prompt of {len(prompt)} tokens")
        if len(prompt) > self.n_ctx:
            raise UserError(
                f"prompt ({len(prompt)} tokens) exceeds the model context of {self.n_ctx} "
                "tokens; raise --n-ctx"
            )
        vocab = self._llama.n_vocab()
        rows: list[np.ndarray] = []
        with self._lock:
            self._llama.reset()
            for start, end in [
                (0, first + 1),
                *((p, p + 1) for p in range(first + 1, len(prompt))),
            ]:
                self._llama.eval(prompt[start:end])
                last = self._llama_cpp.llama_get_logits_ith(self._llama.ctx, -1)
                rows.append(np.ctypeslib.as_array(last, shape=(vocab,)).copy())
        return np.stack(rows)

    def close(self) -> None:
        """Ends open streams, then frees the contexts and the weights."""
        self._scheduler.close()
        with self._lock:
            self._llama.close()


class _Generation:
    """One request's prompt, checked against the context, and its grammar."""

    def __init__(self, engine: LlamaCppEngine, request: Request) -> None:
        if isinstance(request, ChatRequest):
            prompt = engine.chat_template.render(request.messages)
            # The template writes special tokens as text; they must parse back into tokens.
            add_bos, special = not engine.chat_template.prompt_has_bos(prompt), True
        else:
            prompt, add_bos, special = request.prompt, True, False
        self.prompt = engine.encode(prompt, add_bos, special)
        self.prompt_tokens = len(self.prompt)
        # Never truncate a prompt: too long is an error that says what to change.
        if request.max_tokens is None:
            self.max_tokens = engine.n_ctx - self.prompt_tokens
            if self.max_tokens < 1:
                raise UserError(
                    f"prompt ({self.prompt_tokens} tokens) fills the model context of "
                    f"{engine.n_ctx} tokens; raise --n-ctx or shorten the prompt"
                )
        elif self.prompt_tokens + request.max_tokens > engine.n_ctx:
            raise UserError(
                f"prompt ({self.prompt_tokens} tokens) plus max_tokens ({request.max_tokens}) "
                f"exceeds the model context of {engine.n_ctx} tokens; raise --n-ctx or lower "
                "max_tokens"
            )
        else:
            self.max_tokens = request.max_tokens
        self.grammar = _grammar(engine._llama_cpp, request.json_schema)


def _grammar(llama_cpp: ModuleType, schema: dict[str, object] | None) -> object | None:
    if schema is None:
        return None
    try:
        return llama_cpp.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
    except (ValueError, TypeError, KeyError, RecursionError) as error:
        raise UserError(
            f"cannot turn the JSON schema into a grammar ({error}); simplify the schema"
        ) from error
