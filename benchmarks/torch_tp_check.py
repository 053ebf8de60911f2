"""Tensor parallelism against one process: the same random-weights model at TP=1 and TP=N
(NCCL; our all-reduce; our all-reduce with the fused decode GEMV forced on), compared on
prompt logits, one-token logits (the decode path) and greedy decode.

In bf16 a split model rounds differently (each process rounds its partial products before
they are summed), so TP and one process differ by rounding, which random weights amplify
layer by layer. The yardstick is one process's own bf16 rounding: each run is compared with
the same model in float32 on one process, and the check fails (exit 1) when a TP run is
further from float32 than `--factor` times one bf16 process is.

GPU: `NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
 PYTHONPATH=src python3 benchmarks/torch_tp_check.py --preset llama-3-8b --tp 2`
CPU (gloo, no peer kernels): `... --device cpu --preset llama-3.2-1b`
Each run is its own process: a second TP engine in one process would meet the first one's
symmetric-memory state.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

__all__ = ["main"]

# (tp, dtype, all-reduce, fused decode GEMV); tp 0 stands for --tp. The first is the reference.
RUNS = (
    (1, "float32", "nccl", "off"),
    (1, "bfloat16", "nccl", "off"),
    (0, "bfloat16", "nccl", "off"),
    (0, "bfloat16", "auto", "off"),
    (0, "bfloat16", "peer", "on"),
)


def _one(arguments: list[str]) -> None:
    """In a child: one engine, its logits and greedy tokens saved to a file."""
    from openjarvis.runtime.torch.config import TorchSettings
    from openjarvis.runtime.torch.engine import TorchEngine

    preset, tp, dtype, all_reduce, fused_gemv, device, path = arguments[:7]
    prompt = [int(t) for t in arguments[7].split(",")]
    tokens = int(arguments[8])
    settings = TorchSettings(
        device=device, dtype=dtype, tp=int(tp), all_reduce=all_reduce, fused_gemv=fused_gemv,  # type: ignore[arg-type]  # CONFIGS' strings, through argv
        compile=False, max_seq_len=len(prompt) + tokens + 8,
    )  # fmt: skip
    engine = TorchEngine(preset, settings)
    try:
        result = {
            "logits": engine.logits(prompt),
            "one_token": engine.logits(prompt[:1]),  # one row: the decode path
            "tokens": [token for token, _ in engine.generate_tokens(prompt, tokens)],
            "all_reduce_table": engine.settings_dict()["all_reduce_table"],
        }
    finally:
        engine.close()
    torch.save(result, path)


def _run(args: argparse.Namespace, run: tuple, prompt: list[int], folder: Path) -> dict | None:
    tp, dtype, all_reduce, fused_gemv = run
    if args.device == "cpu" and all_reduce != "nccl":
        return None  # the peer kernels are GPU-only
    path = folder / f"{tp}-{dtype}-{all_reduce}-{fused_gemv}.pt"
    command = [sys.executable, __file__, "--one", args.preset, str(tp or args.tp), dtype]
    command += [all_reduce, fused_gemv, args.device, str(path)]
    command += [",".join(map(str, prompt)), str(args.tokens)]
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"{run}: timed out after {args.timeout} s")
        return None
    if child.returncode or not path.exists():
        print(f"{run}: failed\n{child.stderr[-2000:]}")
        return None
    return torch.load(path)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        _one(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="llama-3-8b")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run")
    parser.add_argument("--out", type=Path, default=Path("tp_check.json"))
    args = parser.parse_args()
    from openjarvis.runtime.torch.model import config_for

    generator = torch.Generator().manual_seed(0)
    vocab = config_for(args.preset).vocab_size
    prompt = torch.randint(0, vocab, (args.prompt,), generator=generator).tolist()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as folder:
        reference = _run(args, RUNS[0], prompt, Path(folder))
        if reference is None:
            sys.exit("the float32 reference failed")
        one_bf16 = None
        for run in RUNS[1:]:
            result = _run(args, run, prompt, Path(folder))
            if result is None:
                continue
            tp, dtype, all_reduce, fused_gemv = run
            row = {
                "preset": args.preset, "device": args.device, "tp": tp or args.tp,
                "dtype": dtype, "all_reduce": all_reduce, "fused_gemv": fused_gemv,
                "all_reduce_table": result["all_reduce_table"],
                "logits_vs_float32": _relative(result["logits"], reference["logits"]),
                "one_token_vs_float32": _relative(result["one_token"], reference["one_token"]),
                "top1_vs_float32": float(
                    (result["logits"].argmax(-1) == reference["logits"].argmax(-1)).float().mean()
                ),
                "greedy_equal_float32": sum(
                    a == b for a, b in zip(result["tokens"], reference["tokens"], strict=True)
                ),
                "greedy_tokens": len(reference["tokens"]),
            }  # fmt: skip
            if one_bf16 is None:
                one_bf16 = result
            else:
                row["logits_vs_one_process"] = _relative(result["logits"], one_bf16["logits"])
            rows.append(row)
            args.out.write_text(json.dumps(rows, indent=2))
    print(
        f"{'run':<30}{'logits vs fp32':>16}{'1-token vs fp32':>17}{'top-1':>7}"
        f"{'greedy = fp32':>15}{'vs 1 bf16':>11}"
    )
    for row in rows:
        name = f"tp{row['tp']} {row['dtype']} {row['all_reduce']} gemv-{row['fused_gemv']}"
        versus = row.get("logits_vs_one_process")
        versus_text = "—" if versus is None else f"{versus:.2e}"
        print(
            f"{name:<30}{row['logits_vs_float32']:16.2e}{row['one_token_vs_float32']:17.2e}"
            f"{row['top1_vs_float32']:7.3f}{row['greedy_equal_float32']:>10}/"
            f"{row['greedy_tokens']:<4}{versus_text:>11}"
        )
    if not rows or rows[0]["tp"] != 1:
        sys.exit("the one-process bf16 run failed: nothing to compare with")
    keys = ("logits_vs_float32", "one_token_vs_float32")
    limit = {key: args.factor * rows[0][key] for key in keys}
    failed = [row for row in rows[1:] if any(row[key] > limit[key] for key in limit)]
    if failed or len(rows) == 1:
        sys.exit(f"{len(failed)} TP run(s) beyond {args.factor}x one bf16 process's rounding")


if __name__ == "__main__":
    main()
