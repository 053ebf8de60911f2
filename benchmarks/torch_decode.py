"""Batch-1 decode of the torch engine, random weights of a preset shape: 1 GPU without and
with torch.compile, N GPUs with NCCL, N GPUs with our all-reduce (and the fused decode GEMV);
tokens/s, GB/s, MBU, TTFT and joules per token (NVML).

`NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
 PYTHONPATH=src python3 benchmarks/torch_decode.py --preset llama-3-8b --out decode.json`
Each configuration runs in a fresh process (a clean CUDA and NCCL state). With `--profile`,
rank 0's GPU is also traced over some decode steps: kernels per step, the time they run, and
how much of a step the GPU sits between kernels (where a step's time goes).
"""

import argparse
import json
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openjarvis.runtime.torch.engine import TorchEngine

__all__ = ["main"]


def run_one(
    preset: str,
    tp: int,
    all_reduce: str,
    graphs: bool,
    compiled: str,  # "eager", "compiled" or "autotune" (compiled, matmuls tuned too)
    fused_gemv: str,  # "off", "auto" or "on"
    device: str,
    tokens: int,
    prompt: int,
    profile: bool,
) -> dict:
    import faulthandler

    import torch

    faulthandler.dump_traceback_later(450, exit=True)  # a hung collective ends the child

    from openjarvis.power import Meter
    from openjarvis.runtime.torch.config import TorchSettings
    from openjarvis.runtime.torch.engine import TorchEngine

    settings = TorchSettings(
        device=device,
        tp=tp,
        all_reduce=all_reduce,  # type: ignore[arg-type]  # a string from the command line
        fused_gemv=fused_gemv,  # type: ignore[arg-type]  # a string from the command line
        cuda_graphs=graphs,
        compile=compiled != "eager",
        compile_mode="max-autotune-no-cudagraphs" if compiled == "autotune" else "default",
        max_seq_len=prompt + tokens + 16,
    )
    started = time.monotonic()
    engine = TorchEngine(preset, settings)
    load_s = time.monotonic() - started
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, engine.config.vocab_size, (prompt,), generator=generator).tolist()
    list(engine.generate_tokens(ids, 32))  # warm-up: prefill kernels, graph replays
    meter = Meter.discover(scope="accelerator", estimate_cpu=False) if device == "cuda" else None
    if meter is not None:
        meter.start()
    start_s = time.monotonic()
    if meter is not None:
        with meter.window("decode") as window:
            times = [t for _, t in engine.generate_tokens(ids, tokens)]
        energy = window.result
    else:
        times = [t for _, t in engine.generate_tokens(ids, tokens)]
        energy = None
    decode_s = times[-1] - times[0]
    tokens_per_s = (len(times) - 1) / decode_s
    bytes_per_token = engine.weight_bytes() + engine.kv_bytes(prompt + tokens / 2)
    result = {
        "preset": preset,
        "tp": tp,
        "all_reduce": all_reduce,
        "settings": engine.settings_dict(),
        "load_s": load_s,
        "prompt_tokens": prompt,
        "tokens": len(times),
        "ttft_s": times[0] - start_s,
        "decode_tokens_per_s": tokens_per_s,
        "decode_gb_per_s": tokens_per_s * bytes_per_token / 1e9,
        "mbu": tokens_per_s * bytes_per_token / engine.bandwidth_bytes_per_s
        if engine.bandwidth_bytes_per_s
        else None,
    }
    if energy is not None:
        result["energy_j"] = energy.energy_j
        result["joules_per_token"] = energy.energy_j / len(times) if energy.energy_j else None
        result["window_s"] = energy.duration_s
        result["energy_by_source_j"] = {s.source: s.energy_j for s in energy.sources}
        result["energy_method"] = energy.method
    if meter is not None:
        meter.close()
    if profile and device == "cuda":
        result["profile"] = _decode_profile(engine, ids)
    # Reported before the engine closes: a slow teardown must not lose the measurement.
    print("RESULT " + json.dumps(result), flush=True)
    engine.close()
    return result


def _decode_profile(engine: "TorchEngine", ids: list[int], tokens: int = 40) -> dict:
    """Rank 0's kernels over `tokens` decode steps, from a torch profiler trace: a step is the
    kernels of one CUDA graph launch (they share its correlation id)."""
    import tempfile
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        times = [t for _, t in engine.generate_tokens(ids, tokens)]
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        profiler.export_chrome_trace(trace.name)
        events = json.loads(Path(trace.name).read_text()).get("traceEvents", [])
    launches = {
        e["args"]["correlation"]
        for e in events
        if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e.get("name", "")
    }
    steps: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in launches:
            steps[e["args"]["correlation"]].append(e)
    if len(steps) < 3:
        return {"error": f"{len(steps)} graph launches with kernels in the trace"}
    ordered = sorted(steps.values(), key=lambda kernels: min(k["ts"] for k in kernels))[1:]
    starts = [min(k["ts"] for k in kernels) for kernels in ordered]
    spans = [max(k["ts"] + k["dur"] for k in ks) - min(k["ts"] for k in ks) for ks in ordered]
    busy = [sum(k["dur"] for k in kernels) for kernels in ordered]
    by_name: dict[str, float] = defaultdict(float)
    count_by_name: dict[str, int] = defaultdict(int)
    for kernels in ordered:
        for k in kernels:
            by_name[k["name"][:90]] += k["dur"] / len(ordered)
            count_by_name[k["name"][:90]] += 1
    top = sorted(by_name.items(), key=lambda item: -item[1])[:15]
    period = [b - a for a, b in pairwise(starts)]
    host_gap = [(b - a) * 1e6 for a, b in pairwise(times[1:])]
    return {
        "steps": len(ordered),
        "kernels_per_step": sum(len(k) for k in ordered) / len(ordered),
        "kernel_us_per_step": sum(busy) / len(busy),
        "graph_span_us": sum(spans) / len(spans),
        "step_period_us": sum(period) / len(period) if period else None,
        "host_token_interval_us": sorted(host_gap)[len(host_gap) // 2] if host_gap else None,
        "top_kernels": [
            {"name": name, "us_per_step": us, "calls_per_step": count_by_name[name] / len(ordered)}
            for name, us in top
        ],
    }


def _run_child(args: argparse.Namespace, configuration: str) -> dict:
    command = [sys.executable, __file__, "--one", configuration]
    command += ["--preset", args.preset, "--tokens", str(args.tokens)]
    command += ["--prompt", str(args.prompt), "--device", args.device]
    command += ["--profile"] if args.profile else []
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        stdout, stderr = child.stdout, child.stderr
    except subprocess.TimeoutExpired as expired:  # the result may be out before a stuck close
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else ""
        stderr = f"timed out after {args.timeout} s"
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        print(f"{configuration}: failed\n{stderr[-3000:]}")
        return {"configuration": configuration, "error": stderr[-3000:]}
    return json.loads(lines[-1].removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="llama-3-8b")
    parser.add_argument("--tp", type=int, default=2, help="the multi-GPU world size")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("decode.json"))
    parser.add_argument("--timeout", type=int, default=480, help="seconds per configuration")
    parser.add_argument(
        "--configurations",
        default="1:nccl:graphs:eager,1:nccl:graphs:compiled,{tp}:nccl:graphs:compiled,"
        "{tp}:auto:graphs:compiled",
        help="comma-separated tp:all_reduce:graphs|nograph:eager|compiled|autotune[:gemv], "
        "where gemv (the fused decode GEMV + all-reduce) is off (default), auto or on",
    )
    parser.add_argument("--profile", action="store_true", help="trace rank 0's decode kernels")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one configuration, in a child
    args = parser.parse_args()
    if args.one:
        tp, all_reduce, graphs, compiled, *rest = args.one.split(":")
        run_one(
            args.preset, int(tp), all_reduce, graphs == "graphs", compiled,
            rest[0] if rest else "off", args.device, args.tokens, args.prompt, args.profile,
        )  # fmt: skip
        return
    configurations = args.configurations.format(tp=args.tp).split(",")
    results = []
    for configuration in configurations:
        results.append(_run_child(args, configuration))
        args.out.write_text(json.dumps(results, indent=2))  # after each: a later stop loses less
    print(f"{'config':<28}{'tok/s':>9}{'GB/s':>9}{'MBU':>7}{'TTFT ms':>9}{'J/tok':>8}{'vs 1':>7}")
    base = next((r["decode_tokens_per_s"] for r in results if "decode_tokens_per_s" in r), None)
    for r in results:
        if "error" in r:
            print(f"{r['configuration']:<28} failed")
            continue
        graph = "graph" if r["settings"]["cuda_graphs"] else "nograph"
        compiled = "eager"
        if r["settings"]["compile"]:
            autotuned = r["settings"]["compile_mode"] != "default"
            compiled = "autotune" if autotuned else "compiled"
        name = f"tp{r['tp']}:{r['all_reduce']}:{graph}:{compiled}"
        if r["tp"] > 1:
            name += f":gemv-{r['settings']['fused_gemv']}"
        mbu = f"{r['mbu']:.2f}" if r["mbu"] else "—"
        joules = r.get("joules_per_token")
        joules_text = f"{joules:.3f}" if joules else "—"
        ratio = r["decode_tokens_per_s"] / base if base else float("nan")
        print(
            f"{name:<28}{r['decode_tokens_per_s']:9.1f}{r['decode_gb_per_s']:9.0f}{mbu:>7}"
            f"{r['ttft_s'] * 1e3:9.1f}{joules_text:>8}{ratio:6.2f}x"
        )
        if r["settings"].get("fused_gemv_table"):
            print(f"    fused GEMV: {r['settings']['fused_gemv_table']}")
    for r in results:
        profile = r.get("profile")
        if profile and "error" not in profile:
            print(
                f"\n{r['tp']} GPU(s), rank 0 per decode step: {profile['kernels_per_step']:.0f} "
                f"kernels, {profile['kernel_us_per_step']:.0f} µs in kernels, graph span "
                f"{profile['graph_span_us']:.0f} µs, step period {profile['step_period_us']:.0f}"
                f" µs, host token interval {profile['host_token_interval_us']:.0f} µs"
            )
            for kernel in profile["top_kernels"]:
                print(
                    f"  {kernel['us_per_step']:8.1f} µs {kernel['calls_per_step']:5.0f}x "
                    f"{kernel['name']}"
                )
        elif profile:
            print(f"\nprofile of tp{r['tp']}: {profile['error']}")


if __name__ == "__main__":
    main()
