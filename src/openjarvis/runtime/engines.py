"""Choosing and opening an engine from the command line's words: llamacpp, torch (local), or
openai and anthropic (cloud).

`ipw measure` and `jarvis serve` both come through here, so both accept the same engines.
"""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from openjarvis.engine_kinds import ENGINE_KINDS, LOCAL_ENGINE_KINDS
from openjarvis.errors import UserError
from openjarvis.runtime.models import ModelFile, resolve_model
from openjarvis.runtime.types import Engine

if TYPE_CHECKING:  # torch is imported only when the torch engine is opened
    from openjarvis.runtime.torch.config import TorchSettings

__all__ = [
    "CAPABILITIES",
    "EngineCapabilities",
    "EngineSpec",
    "open_engine",
    "resolve_engine_model",
    "torch_settings",
]


@dataclass(frozen=True, slots=True)
class EngineCapabilities:
    """What an engine kind can do on any machine: a run's options are checked against it before
    anything is opened or written (evals/config.py)."""

    concurrency: int  # requests in flight at once, at most
    logprobs: bool  # scores a given continuation (lm-eval's log-likelihood requests)


# llama.cpp's batch holds 4 sequences; the torch engine sizes its KV cache and graphs for at most
# 64; 8 API requests in flight stay inside common rate limits. Each engine's own `concurrency`
# says the same (tests/runtime/test_engine_capabilities.py holds them to it).
CAPABILITIES: dict[str, EngineCapabilities] = {
    "llamacpp": EngineCapabilities(concurrency=4, logprobs=True),
    "torch": EngineCapabilities(concurrency=64, logprobs=True),
    "openai": EngineCapabilities(concurrency=8, logprobs=False),
    "anthropic": EngineCapabilities(concurrency=8, logprobs=False),
}


@dataclass(frozen=True, slots=True)
class EngineSpec:
    kind: str = "llamacpp"
    model: str | None = None  # local: GGUF path or catalog name (None: embedded); cloud: name
    base_url: str | None = None  # cloud only; None: the provider's public API
    api_key_env: str | None = None  # cloud only; None: OPENAI_API_KEY / ANTHROPIC_API_KEY
    n_ctx: int = 4096
    threads: int | None = None
    n_gpu_layers: int = 0  # llamacpp only
    tp: int = 1  # torch only: tensor-parallel processes, one per GPU
    # Requests in flight at once (`ipw measure --concurrency`, `jarvis serve --max-concurrency`),
    # when fewer than the engine's own: the torch engine sizes its KV cache and the CUDA graphs
    # captured at start-up by it (its settings' concurrency).
    concurrency: int | None = None
    reuse_prompt_cache: bool = True
    timeout_s: float = 120.0  # cloud: longest wait for the next byte
    meter: str = "auto"  # openai: auto, local (a server on this machine) or estimate


def resolve_engine_model(spec: EngineSpec) -> ModelFile | None:
    """Check the spec before anything is opened: the GGUF for local engines, None for cloud."""
    if spec.kind not in ENGINE_KINDS:
        raise UserError(f"unknown engine {spec.kind!r}; use one of {', '.join(ENGINE_KINDS)}")
    if spec.tp != 1 and spec.kind != "torch":
        raise UserError("--tp is for --engine torch; drop it or use the torch engine")
    if spec.kind in LOCAL_ENGINE_KINDS:
        if spec.base_url or spec.api_key_env or spec.meter != "auto":
            raise UserError(
                "--base-url, --api-key-env and --meter are for cloud engines; drop them"
            )
        return resolve_model(spec.model)
    if not spec.model:
        raise UserError(f"--engine {spec.kind} needs --model NAME (the server's model name)")
    return None


def torch_settings(spec: EngineSpec) -> "TorchSettings":
    """The torch engine's settings for the spec (imports torch)."""
    from openjarvis.runtime.torch.config import TorchSettings

    settings = TorchSettings(
        tp=spec.tp, max_seq_len=spec.n_ctx, reuse_prompt_cache=spec.reuse_prompt_cache
    )
    if spec.concurrency is not None:
        settings = replace(settings, concurrency=min(spec.concurrency, settings.concurrency))
    return settings


def open_engine(spec: EngineSpec, model: ModelFile | None) -> Engine:
    """Load the model (local) or set up the client (cloud); the engine is the caller's."""
    if spec.kind == "torch":
        try:
            from openjarvis.runtime.torch.engine import TorchEngine
        except ImportError as error:
            raise UserError(
                f"the torch engine needs torch ({error}); "
                "install it: pip install 'openjarvis[torch]'"
            ) from None

        assert model is not None, "resolve_engine_model returns the GGUF for local engines"
        return TorchEngine(model.path, torch_settings(spec))
    if spec.kind == "llamacpp":
        from openjarvis.runtime.llamacpp import LlamaCppEngine, LlamaCppSettings

        assert model is not None, "resolve_engine_model returns the GGUF for local engines"
        settings = LlamaCppSettings(
            n_ctx=spec.n_ctx,
            n_threads=spec.threads,
            n_gpu_layers=spec.n_gpu_layers,
            reuse_prompt_cache=spec.reuse_prompt_cache,
        )
        return LlamaCppEngine(model.path, settings, name=model.name)
    from openjarvis.runtime.cloud import CloudEngine, CloudSettings

    return CloudEngine(
        CloudSettings(
            spec.kind,  # type: ignore[arg-type]  # the CLI's str; checked in resolve_engine_model
            spec.model or "",
            base_url=spec.base_url,
            api_key_env=spec.api_key_env,
            timeout_s=spec.timeout_s,
            meter=spec.meter,  # type: ignore[arg-type]  # the CLI's str; CloudEngine checks it
        )
    )
