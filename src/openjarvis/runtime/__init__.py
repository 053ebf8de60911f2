"""Engines that turn requests into timed completions (llama.cpp in process, cloud APIs, torch),
and where their models come from (the catalog). Heavy libraries load only inside each engine.
"""

__all__: list[str] = []
