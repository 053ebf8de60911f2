"""Greedy tokens with the one-row layer kernel against the step it replaces, on a real model:
the same prompts decoded one sequence at a time (every decode step one row) by an engine with
the kernel and by one without (the compiled step), and where they first differ. Issue 29 asks
that a faster step keep the greedy tokens; the tests check the logits on random tiny models.

`PYTHONPATH=src python3 benchmarks/one_row_tokens.py --model FILE.gguf [--tokens 96]`
(the GGUF's tokenizer needs llama-cpp-python: on the GPU machine `gpu_setup.sh llama`)
"""

import argparse
import json

__all__ = ["main"]

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Write a haiku about the sea.",
    "List three uses of a paperclip:\n1.",
    "In 1905, Albert Einstein published",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    from openjarvis.runtime.torch.config import TimedChoice
    from openjarvis.runtime.torch.engine import TorchEngine, TorchSettings

    runs: dict[str, list[list[int]]] = {}
    choices: tuple[TimedChoice, ...] = ("on", "off")
    for choice in choices:
        settings = TorchSettings(max_seq_len=1024, concurrency=1, one_row_kernel=choice)
        engine = TorchEngine(args.model, settings)
        try:
            state = str(engine.settings_dict()["one_row_kernel_state"])
            assert state.startswith(choice), state
            assert engine.tokenizer is not None, "a .gguf model: its tokenizer encodes the prompts"
            tokens = [engine.tokenizer.encode(prompt) for prompt in PROMPTS]
            runs[state] = [
                [token for token, _ in engine.generate_tokens(prompt, args.tokens)]
                for prompt in tokens
            ]
        finally:
            engine.close()
    (on_state, on), (off_state, off) = runs.items()
    rows = []
    for prompt, mine, theirs in zip(PROMPTS, on, off, strict=True):
        # The first position where they differ, or where one stopped (a stop token) first.
        pairs = zip(mine, theirs, strict=False)
        differ = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        if differ is None and len(mine) != len(theirs):
            differ = min(len(mine), len(theirs))
        rows.append({"prompt": prompt, "tokens": len(mine), "first_difference": differ})
    same = sum(row["first_difference"] is None for row in rows)
    print(json.dumps({"with": on_state, "without": off_state, "same": f"{same}/{len(rows)}"}))
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
