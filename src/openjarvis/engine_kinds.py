"""The one list of engine kinds, a leaf that the runtime (which opens them) and the report
(which tells measured runs from estimated ones) both read.
"""

__all__ = ["CLOUD_ENGINE_KINDS", "ENGINE_KINDS", "LOCAL_ENGINE_KINDS"]

LOCAL_ENGINE_KINDS = ("llamacpp", "torch")  # run here: the meter measures their energy
CLOUD_ENGINE_KINDS = ("openai", "anthropic")  # remote APIs: energy is an estimate
ENGINE_KINDS = (*LOCAL_ENGINE_KINDS, *CLOUD_ENGINE_KINDS)
