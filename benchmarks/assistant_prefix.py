"""What reusing a prompt's prefix saves an assistant: prefill joules per turn with and without.

A. A scripted five-turn `jarvis` session (its own system prompt with this repository's map,
   five questions, each turn's reply kept in the history) on the embedded model, or on the
   GGUF given with --model: for each turn the prompt tokens, the tokens taken from the cache,
   the time to the first token and the prefill energy (a window around the turn's prompt with
   one token out; the reply is then generated outside it), with the engine's prompt cache off
   and then on. Ratios: each turn's prefill joules against turn 1's cold prefill.
B. Two requests to `jarvis serve` (real HTTP) that share a prefix of about 1,000 tokens: the
   second's `usage.prompt_tokens_details.cached_tokens` as a share of its prompt, and its prompt
   phase (`timings.ttft_s`) against the first's.

Run: .venv/bin/python benchmarks/assistant_prefix.py [--engine llamacpp|torch] [--model PATH]
     [--part session|serve|both] [--out results.json]
"""

import argparse
import json
import platform
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from openjarvis.power import Meter
from openjarvis.runtime.engines import EngineSpec, open_engine, resolve_engine_model
from openjarvis.runtime.types import ChatMessage, ChatRequest, Engine
from openjarvis.serve import running_server
from openjarvis.tui.protocol import system_prompt
from openjarvis.tui.repomap import repo_map
from openjarvis.tui.workspace import Workspace

__all__: list[str] = []

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "Where is the energy of a reply measured?",
    "Which module keeps the KV cache blocks of the torch engine?",
    "How does the assistant run the project's tests?",
    "What does the repository map rank first?",
    "Summarise what you told me in one sentence.",
]
REPLY_TOKENS = 24
CONTEXT = 4096


@dataclass(frozen=True, slots=True)
class Turn:
    turn: int
    reuse: bool
    prompt_tokens: int
    cached_tokens: int | None
    ttft_s: float | None
    prefill_j: float | None
    method: str | None


def _engine(kind: str, model: str | None, reuse: bool) -> Engine:
    spec = EngineSpec(kind=kind, model=model, n_ctx=CONTEXT, reuse_prompt_cache=reuse)
    return open_engine(spec, resolve_engine_model(spec))


def _system() -> str:
    """jarvis's own system prompt in this repository, its map included (about 1,000 tokens)."""
    workspace = Workspace(ROOT / "src")
    return system_prompt(str(ROOT), repo_map(workspace.project_files(), workspace.root, 1024))


def session(kind: str, model: str | None, reuse: bool, meter: Meter) -> list[Turn]:
    engine = _engine(kind, model, reuse)
    history: list[ChatMessage] = [ChatMessage("system", _system())]
    turns: list[Turn] = []
    try:
        for number, question in enumerate(QUESTIONS, start=1):
            history.append(ChatMessage("user", question))
            # The prompt alone (and its first token) in a window of its own: its joules are
            # the prefill's, with no split to place. The reply follows, outside any window
            # (with reuse it takes the whole prompt from the cache).
            with meter.window(f"turn {number} prefill") as window:
                prefill = engine.generate(ChatRequest(tuple(history), max_tokens=1))
            energy = window.result
            reply = engine.generate(ChatRequest(tuple(history), max_tokens=REPLY_TOKENS))
            turns.append(
                Turn(
                    number,
                    reuse,
                    prefill.prompt_tokens,
                    prefill.cached_tokens,
                    prefill.ttft_s,
                    energy.energy_j,
                    energy.method,
                )
            )
            history.append(ChatMessage("assistant", reply.text))
    finally:
        engine.close()
    return turns


def _ratio(value: float | None, base: float | None) -> str:
    return "—" if value is None or not base else f"{value / base:.2f}"


def print_session(turns: list[Turn]) -> None:
    cold = next((t.prefill_j for t in turns if t.turn == 1 and not t.reuse), None)
    print("turn reuse prompt cached  ttft_s  prefill_J  x turn-1-cold  method")
    for t in turns:
        cached = "—" if t.cached_tokens is None else str(t.cached_tokens)
        ttft = "—" if t.ttft_s is None else f"{t.ttft_s:.3f}"
        joules = "—" if t.prefill_j is None else f"{t.prefill_j:.3f}"
        print(
            f"{t.turn:>4} {'on' if t.reuse else 'off':>5} {t.prompt_tokens:>6} {cached:>6} "
            f"{ttft:>7} {joules:>10} {_ratio(t.prefill_j, cold):>13}  {t.method}"
        )


def serve_pair(kind: str, model: str | None) -> dict[str, object]:
    """Two chat requests sharing the ~1,000-token system prompt, one after the other."""
    engine = _engine(kind, model, reuse=True)
    replies: list[dict[str, Any]] = []
    try:
        with running_server(engine, None) as server, httpx.Client(timeout=600) as client:
            for question in QUESTIONS[:2]:
                body = {
                    "model": engine.model_name,
                    "messages": [
                        {"role": "system", "content": _system()},
                        {"role": "user", "content": question},
                    ],
                    "max_tokens": 8,
                    "temperature": 0,
                }
                answer = client.post(f"{server.url}/chat/completions", json=body)
                answer.raise_for_status()
                replies.append(answer.json())
    finally:
        engine.close()
    usage = [reply["usage"] for reply in replies]
    ttft_s = [reply["timings"]["ttft_s"] for reply in replies]
    cached = (usage[1].get("prompt_tokens_details") or {}).get("cached_tokens")
    prompt = usage[1]["prompt_tokens"]
    return {
        "engine": kind,
        "prompt_tokens": [u["prompt_tokens"] for u in usage],
        "second_cached_tokens": cached,
        "second_cached_share": None if cached is None else cached / prompt,
        "ttft_s": ttft_s,
        "second_ttft_ratio": ttft_s[1] / ttft_s[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="llamacpp", choices=["llamacpp", "torch"])
    parser.add_argument("--model", default=None, help="a GGUF (default: the embedded model)")
    parser.add_argument("--part", default="both", choices=["session", "serve", "both"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, object] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "engine": args.engine,
        "model": args.model or "embedded",
    }
    if args.part in ("session", "both"):
        turns: list[Turn] = []
        with Meter.discover(scope="system") as meter:
            for reuse in (False, True):  # cold first: the cache starts empty either way
                turns += session(args.engine, args.model, reuse, meter)
        print(f"A. five-turn session, {args.engine}, {results['model']}")
        print_session(turns)
        results["session"] = [asdict(t) for t in turns]
    if args.part in ("serve", "both"):
        pair = serve_pair(args.engine, args.model)
        share = pair["second_cached_share"]
        print(f"B. jarvis serve, two requests sharing a prefix ({args.engine})")
        print(
            f"prompt tokens {pair['prompt_tokens']}, second cached "
            f"{pair['second_cached_tokens']} ({'—' if share is None else f'{share:.0%}'}), "
            f"ttft {pair['ttft_s']} s, second/first {pair['second_ttft_ratio']:.2f}"
        )
        results["serve"] = pair
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
