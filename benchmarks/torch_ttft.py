"""Where a torch-engine request's time to the first token goes, with and without a cached prefix.

Three chat requests that share jarvis's ~1,000-token system prompt (as benchmarks/
assistant_prefix.py sends them), each with one token out, on an engine that keeps prompt blocks:
for each, the tokenizing time, the wait from submission to its first step (the engine tokenizes
again inside it), its prefill steps (from the completion's work pieces), and from the last
step's end to the token in hand. Unless --eager-prefill, the first 32 greedy tokens of each
request are then checked against an engine that prefills eagerly.

Run (GPU): python3 benchmarks/torch_ttft.py --model FILE.gguf [--no-compile] [--eager-prefill]
     [--in-process]
"""

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from openjarvis.runtime.torch.engine import TorchEngine, TorchSettings
from openjarvis.runtime.types import ChatMessage, ChatRequest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from assistant_prefix import QUESTIONS, _system  # a sibling script

__all__: list[str] = []


def one(engine: TorchEngine, question: str) -> None:
    messages = (ChatMessage("system", _system()), ChatMessage("user", question))
    assert engine.tokenizer is not None
    started = time.monotonic()
    prompt = engine.tokenizer.chat_prompt(messages)
    tokenized = time.monotonic()
    completion = engine.generate(ChatRequest(messages, max_tokens=1))
    done = time.monotonic()
    steps = completion.work
    ttft_ms = (completion.ttft_s or float("nan")) * 1e3
    print(
        f"prompt {len(prompt)} cached {completion.cached_tokens} | tokenize "
        f"{(tokenized - started) * 1e3:.1f} ms | ttft {ttft_ms:.1f} ms | submit->step "
        f"{(steps[0].start_s - tokenized) * 1e3:.1f} ms | steps {len(steps)}: "
        f"{[round((p.end_s - p.start_s) * 1e3, 2) for p in steps]} ms | step end->returned "
        f"{(done - steps[-1].end_s) * 1e3:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--no-compile", action="store_true", help="an eager decode step (the GPU compiles it)"
    )
    parser.add_argument("--eager-prefill", action="store_true", help="prefill without graphs")
    parser.add_argument(
        "--in-process", action="store_true", help="the engine's core in this process, not its own"
    )
    args = parser.parse_args()
    graphs = not args.eager_prefill
    compile = False if args.no_compile else None  # None: the engine's default
    settings = TorchSettings(
        max_seq_len=4096,
        compile=compile,
        prefill_graphs=graphs,
        engine_process=False if args.in_process else None,
    )
    engine = TorchEngine(args.model, settings)
    try:
        for question in QUESTIONS:
            one(engine, question)
        replies = [_greedy(engine, question) for question in QUESTIONS] if graphs else []
    finally:
        engine.close()
    if replies:
        eager = TorchEngine(args.model, replace(settings, prefill_graphs=False))
        try:
            same = replies == [_greedy(eager, question) for question in QUESTIONS]
        finally:
            eager.close()
        print(f"greedy tokens with prefill graphs == eager prefill: {same}")


def _greedy(engine: TorchEngine, question: str) -> str:
    messages = (ChatMessage("system", _system()), ChatMessage("user", question))
    return engine.generate(ChatRequest(messages, max_tokens=32, temperature=0.0)).text


if __name__ == "__main__":
    main()
