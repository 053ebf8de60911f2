"""Tensor parallelism against one GPU on the GPU machine: the same random-weights model at TP=1
and TP=N (NCCL; our all-reduce; our all-reduce with the fused decode GEMV forced on), compared
on prompt logits and on greedy decode.

bf16 sums partial products in another order when split, so logits differ by rounding: the
check reports the relative error of the logits and how many of the greedy tokens agree, and
fails (exit 1) when the logits differ by more than `--tolerance` relatively.

`PYTHONPATH=src python3 benchmarks/torch_tp_check.py --preset llama-3-8b --tp 2 --out tp.json`
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from openjarvis.runtime.torch.engine import TorchEngine, TorchSettings
from openjarvis.runtime.torch.model import config_for

__all__ = ["main"]


# (all-reduce, fused decode GEMV) of each TP run
VARIANTS = (("nccl", "off"), ("auto", "off"), ("peer", "on"))


def _run(
    preset: str, tp: int, all_reduce: str, fused_gemv: str, prompt: list[int], tokens: int,
    compile: bool,
) -> dict:  # fmt: skip
    settings = TorchSettings(
        tp=tp,
        all_reduce=all_reduce,  # type: ignore[arg-type]
        fused_gemv=fused_gemv,  # type: ignore[arg-type]
        compile=compile,
        max_seq_len=len(prompt) + tokens + 8,
    )
    engine = TorchEngine(preset, settings)
    try:
        logits = engine.logits(prompt)
        one_token = engine.logits(prompt[:1])  # one row: the decode path (fused GEMV if on)
        generated = [token for token, _ in engine.generate_tokens(prompt, tokens)]
        table = engine.settings_dict()["all_reduce_table"]
    finally:
        engine.close()
    return {
        "logits": logits, "one_token": one_token, "tokens": generated, "all_reduce_table": table
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="llama-3-8b")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--tolerance", type=float, default=2e-2)
    parser.add_argument("--out", type=Path, default=Path("tp_check.json"))
    parser.add_argument("--compile", action="store_true", help="torch.compile the decode step")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    vocab = config_for(args.preset).vocab_size
    prompt = torch.randint(0, vocab, (args.prompt,), generator=generator).tolist()
    reference = _run(args.preset, 1, "nccl", "off", prompt, args.tokens, args.compile)
    rows = []
    for all_reduce, fused_gemv in VARIANTS:
        result = _run(
            args.preset, args.tp, all_reduce, fused_gemv, prompt, args.tokens, args.compile
        )
        difference = (result["logits"] - reference["logits"]).norm()
        error = float(difference / reference["logits"].norm())
        one = result["one_token"] - reference["one_token"]
        one_token_error = float(one.norm() / reference["one_token"].norm())
        pairs = list(zip(result["tokens"], reference["tokens"], strict=True))
        same = sum(a == b for a, b in pairs)
        first_difference = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        rows.append(
            {
                "preset": args.preset,
                "tp": args.tp,
                "all_reduce": all_reduce,
                "fused_gemv": fused_gemv,
                "all_reduce_table": result["all_reduce_table"],
                "logits_relative_error": error,
                "one_token_logits_relative_error": one_token_error,
                "prompt_top1_agreement": float(
                    (result["logits"].argmax(-1) == reference["logits"].argmax(-1)).float().mean()
                ),
                "greedy_tokens_equal": same,
                "greedy_tokens": len(reference["tokens"]),
                "first_differing_token": first_difference,
            }
        )
        args.out.write_text(json.dumps(rows, indent=2))
    print(
        f"{'all-reduce':<18}{'logits rel err':>16}{'1-token rel err':>17}{'prompt top-1':>14}"
        f"{'greedy equal':>14}"
    )
    for row in rows:
        print(
            f"{row['all_reduce'] + ' gemv-' + row['fused_gemv']:<18}"
            f"{row['logits_relative_error']:16.2e}{row['one_token_logits_relative_error']:17.2e}"
            f"{row['prompt_top1_agreement']:14.3f}"
            f"{row['greedy_tokens_equal']:>9}/{row['greedy_tokens']}"
        )
    errors = ("logits_relative_error", "one_token_logits_relative_error")
    if any(row[error] > args.tolerance for row in rows for error in errors):
        sys.exit(1)


if __name__ == "__main__":
    main()
