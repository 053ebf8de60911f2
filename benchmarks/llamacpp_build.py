"""llama.cpp built portable (GGML_NATIVE=OFF: AVX2, no AVX-512 or AMX) against built for this CPU
(GGML_NATIVE=ON, -march=native): prefill and decode tokens/s on the embedded model, side by side.

The venv's llama_cpp is the portable build; the native one is installed into a folder of its own:
  CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON" .venv/bin/pip install --no-deps \
      --no-cache-dir --target /tmp/native-llama llama-cpp-python==0.3.36
Each run is a child process (a fresh load, so a cold cache; the native one with that folder first
on PYTHONPATH); the builds alternate in each round so that other load hits both alike. Same
prompt, greedy, same threads, a fixed number of new tokens (end-of-text does not stop a run).
Run: .venv/bin/python benchmarks/llamacpp_build.py --native-site /tmp/native-llama [--rounds 5]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported for real in the child only, after PYTHONPATH picked the build
    import llama_cpp

__all__: list[str] = []

# 188 tokens, so that prefill runs the batched matrix kernels for a measurable time.
PROMPT = (
    "from dataclasses import dataclass\n\n\n@dataclass(frozen=True)\nclass Interval:\n"
    "    start: int\n    end: int\n\n\n"
    "def merge_intervals(intervals: list[Interval]) -> list[Interval]:\n"
    '    """Merge overlapping intervals and return them sorted by start.\n\n'
    "    Two intervals overlap when one starts before the other ends. The input may be in any\n"
    "    order and may contain duplicates; the result holds no two intervals that overlap or\n"
    "    touch. Explain each step in a comment, handle the empty list, and keep it O(n log n).\n\n"
    "    >>> merge_intervals([Interval(1, 3), Interval(2, 6), Interval(8, 10)])\n"
    "    [Interval(start=1, end=6), Interval(start=8, end=10)]\n    >>> merge_intervals([])\n"
    '    []\n    """\n'
)


@dataclass(frozen=True, slots=True)
class Run:
    library: str
    features: list[str]
    prompt_tokens: int
    ttft_s: float
    decode_tokens_per_s: float
    tokens: list[int]

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.ttft_s


def _timed_generation(
    llama: "llama_cpp.Llama", prompt: list[int], max_tokens: int
) -> tuple[float, list[tuple[float, int]]]:
    """Greedy generation from a cold cache: (start, [(arrival, token), ...])."""
    llama.reset()
    arrivals: list[tuple[float, int]] = []
    start_s = time.perf_counter()
    for token in llama.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0):
        arrivals.append((time.perf_counter(), token))
        if len(arrivals) == max_tokens:
            break
    return start_s, arrivals


def child(model_path: str, threads: int, max_tokens: int) -> None:
    """One build, one fresh load: a short warm-up, then the timed run; prints a JSON line."""
    import llama_cpp

    llama = llama_cpp.Llama(
        model_path=model_path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    prompt = llama.tokenize(PROMPT.encode())
    _timed_generation(llama, prompt, 2)  # thread pool and buffers set up outside the timing
    start_s, arrivals = _timed_generation(llama, prompt, max_tokens)
    cpu = llama_cpp.llama_print_system_info().decode().split("CPU :", 1)[-1].split("|")
    features = [part.split("=")[0].strip() for part in cpu if part.strip().endswith("= 1")]
    (first_s, _), (last_s, _) = arrivals[0], arrivals[-1]
    decode_rate = (len(arrivals) - 1) / (last_s - first_s)
    tokens = [token for _, token in arrivals]
    run = Run(llama_cpp.__file__, features, len(prompt), first_s - start_s, decode_rate, tokens)
    print(json.dumps(asdict(run)))


def run_build(native_site: Path | None, model: Path, threads: int, max_tokens: int) -> Run:
    env = dict(os.environ)
    if native_site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(native_site), env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--child", str(model), str(threads), str(max_tokens)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"the {'native' if native_site else 'portable'} run failed:\n{done.stderr}")
    run = Run(**json.loads(done.stdout.strip().splitlines()[-1]))
    # The child must have loaded the build we meant: PYTHONPATH goes before site-packages.
    assert (native_site is not None) == run.library.startswith(str(native_site)), run.library
    return run


def report(runs: dict[str, list[Run]]) -> None:
    """Medians per build, and portable / native of the medians, as a Markdown table."""
    medians = {
        name: (
            statistics.median(r.prefill_tokens_per_s for r in rs),
            statistics.median(r.decode_tokens_per_s for r in rs),
            1000 * statistics.median(r.ttft_s for r in rs),
        )
        for name, rs in runs.items()
    }
    portable, native = runs["portable"][0].features, runs["native"][0].features
    added = [feature for feature in native if feature not in portable]
    shown = {"portable": " ".join(portable), "native": "+ " + " ".join(added)}
    print(f"prompt {runs['portable'][0].prompt_tokens} tokens, median of {len(runs['native'])}")
    print("| build | ggml CPU features | prefill tok/s | decode tok/s | TTFT ms |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, (prefill, decode, ttft_ms) in medians.items():
        print(f"| {name} | {shown[name]} | {prefill:.0f} | {decode:.1f} | {ttft_ms:.0f} |")
    ratios = [p / n for p, n in zip(medians["portable"][:2], medians["native"][:2], strict=True)]
    print(f"| portable / native | | **{ratios[0]:.3f}** | **{ratios[1]:.3f}** | |")
    for name, rs in runs.items():
        prefills = ", ".join(f"{r.prefill_tokens_per_s:.0f}" for r in rs)
        decodes = ", ".join(f"{r.decode_tokens_per_s:.1f}" for r in rs)
        print(f"{name} rounds: prefill {prefills}; decode {decodes}")
    same = all(r.tokens == runs["portable"][0].tokens for rs in runs.values() for r in rs)
    print(f"greedy tokens identical across builds and rounds: {same}")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--native-site", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="decode and prefill threads")
    args = parser.parse_args()
    from openjarvis.runtime.models import resolve_model

    model = resolve_model(None)
    builds: dict[str, Path | None] = {"portable": None, "native": args.native_site.resolve()}
    print(f"model {model.name}, {args.threads} threads, {args.max_tokens} new tokens")
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    runs: dict[str, list[Run]] = {name: [] for name in builds}
    for index in range(args.rounds):
        for name in list(builds) if index % 2 == 0 else reversed(list(builds)):
            runs[name].append(run_build(builds[name], model.path, args.threads, args.max_tokens))
    print(f"load average at end: {os.getloadavg()[0]:.1f}\n")
    report(runs)


if __name__ == "__main__":
    main()
