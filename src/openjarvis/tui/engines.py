"""Which model the assistant talks to: the embedded default, a local GGUF, or a cloud model.

`/model SPEC` and `jarvis --model SPEC` both come through `open_model`, which opens engines the
way `ipw measure` and `jarvis serve` do (runtime.engines).
"""

from collections.abc import Callable
from dataclasses import dataclass

from openjarvis.engine_kinds import CLOUD_ENGINE_KINDS
from openjarvis.errors import UserError
from openjarvis.runtime.engines import EngineSpec, open_engine, resolve_engine_model
from openjarvis.runtime.llamacpp import LlamaCppEngine
from openjarvis.runtime.model_kind import base_model_note, read_model_kind
from openjarvis.runtime.types import Engine

__all__ = ["LoadedModel", "ModelOpener", "engine_spec", "open_model"]


@dataclass(frozen=True, slots=True)
class LoadedModel:
    engine: Engine
    context_tokens: int | None  # None when the engine does not say (the status bar shows "?")
    spec: str | None  # what reopens it; None is the embedded default
    note: str | None = None  # shown once when it loads: a base model is no chat model

    @property
    def name(self) -> str:
        return self.engine.model_name

    @property
    def is_cloud(self) -> bool:
        return self.engine.kind in CLOUD_ENGINE_KINDS


ModelOpener = Callable[[str | None], LoadedModel]


def engine_spec(spec: str | None) -> EngineSpec:
    """`default` or nothing: the embedded model; `PATH.gguf` or a cached name: that GGUF;
    `openai:MODEL` or `anthropic:MODEL`, optionally `@BASE_URL` (any OpenAI-compatible server)."""
    if spec is None or spec == "default":
        return EngineSpec()
    provider, colon, rest = spec.partition(":")
    if colon and provider in CLOUD_ENGINE_KINDS:
        model, at, base_url = rest.partition("@")
        if not model:
            raise UserError(f"{spec!r} names no model; write {provider}:MODEL[@BASE_URL]")
        return EngineSpec(kind=provider, model=model, base_url=base_url if at else None)
    return EngineSpec(model=spec)


def open_model(spec: str | None) -> LoadedModel:
    """Load the model `spec` names (see `engine_spec`). Slow (seconds): call it from a worker."""
    engine_settings = engine_spec(spec)
    model_file = resolve_engine_model(engine_settings)
    engine = open_engine(engine_settings, model_file)
    # tui/launch.py meters no GPU: an engine on one would draw energy the replies never show.
    assert not engine.devices, f"{engine.kind} runs on GPUs {engine.devices}; meter them"
    # A local engine knows its context; cloud APIs do not report theirs (runtime could add it).
    context_tokens = engine.n_ctx if isinstance(engine, LlamaCppEngine) else None
    kind = read_model_kind(model_file.path) if model_file is not None else None
    return LoadedModel(engine, context_tokens, spec, base_model_note(engine.model_name, kind))
