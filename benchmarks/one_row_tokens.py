"""Greedy tokens with the one-row layer kernel against the step it replaces, on a real model:
the same prompts decoded one sequence at a time (every decode step one row) by an engine with
the kernel and by one without (the compiled step); where they first differ, how far apart the
top two logits were there without the kernel (a near tie that rounding in another order flips,
or not). Issue 29 asks that a faster step keep the greedy tokens; the tests check the logits on
random tiny models.

`PYTHONPATH=src python3 benchmarks/one_row_tokens.py --model FILE.gguf [--tokens 96]`
(the GGUF's tokenizer needs llama-cpp-python: on the GPU machine `gpu_setup.sh llama`)
"""

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

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

    states: list[str] = []
    runs: list[list[list[int]]] = []
    margins: list[float | None] = []
    choices: tuple[TimedChoice, ...] = ("on", "off")
    for choice in choices:
        settings = TorchSettings(max_seq_len=1024, concurrency=1, one_row_kernel=choice)
        engine = TorchEngine(args.model, settings)
        try:
            state = str(engine.settings_dict()["one_row_kernel_state"])
            assert state.startswith(choice), state
            assert engine.tokenizer is not None, "a .gguf model: its tokenizer encodes the prompts"
            prompts = [engine.tokenizer.encode(prompt) for prompt in PROMPTS]
            states.append(state)
            runs.append(
                [
                    [token for token, _ in engine.generate_tokens(prompt, args.tokens)]
                    for prompt in prompts
                ]
            )
            if choice == "off":  # the reference: how close its pick was where the two differ
                for prompt, mine, theirs in zip(prompts, *runs, strict=True):
                    differ = _first_difference(mine, theirs)
                    margins.append(
                        None
                        if differ is None or differ >= min(len(mine), len(theirs))
                        else _margin(engine.logits(prompt + theirs[:differ])[-1])
                    )
        finally:
            engine.close()
    (on, off), rows = runs, []
    for prompt, mine, theirs, margin in zip(PROMPTS, on, off, margins, strict=True):
        rows.append(
            {
                "prompt": prompt,
                "tokens": len(mine),
                "first_difference": _first_difference(mine, theirs),
                # Logits of the step's top two without the kernel, apart by this much there.
                "top_two_apart": None if margin is None else round(margin, 4),
            }
        )
    same = sum(row["first_difference"] is None for row in rows)
    print(json.dumps({"with": states[0], "without": states[1], "same": f"{same}/{len(rows)}"}))
    for row in rows:
        print(json.dumps(row))


def _first_difference(mine: list[int], theirs: list[int]) -> int | None:
    """The first position where they differ, or where one stopped (a stop token) first."""
    differ = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
    if differ is None and len(mine) != len(theirs):
        differ = min(len(mine), len(theirs))
    return differ


def _margin(logits: "torch.Tensor") -> float:
    top = logits.topk(2).values  # float32: TorchEngine.logits
    return float(top[0] - top[1])


if __name__ == "__main__":
    main()
