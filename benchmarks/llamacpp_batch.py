"""Does decoding several sequences per llama_decode pay on the CPU? N sequences decoded one after
another through llama-cpp-python's high-level path (a), against the same N decoded together (b:
one llama_decode per step, one token per sequence, distinct seq_ids in one context), and against
N requests sent at once from N threads to LlamaCppEngine, whose scheduler batches them (c).

Both sides sample with the chain the engine uses (llama-cpp-python's own, greedy at temperature
0), so the greedy tokens must match sequence by sequence; the script says whether they do. The
sides alternate within each round so that other load on the machine hits both alike.
Run: .venv/bin/python benchmarks/llamacpp_batch.py [--rounds 3] [--threads 1]
"""

import argparse
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import llama_cpp

    from openjarvis.runtime.llamacpp import LlamaCppEngine

__all__: list[str] = []

# Eight distinct code prompts of about 64 tokens each: one per sequence.
TASKS = (
    "merge overlapping intervals and return them sorted by their start",
    "parse an ISO 8601 date string into a year, month and day tuple",
    "count how often each word occurs in a text, ignoring case and punctuation",
    "return the n-th Fibonacci number using an iterative loop and constant memory",
    "check whether a string of brackets is balanced, for round, square and curly ones",
    "flatten a nested list of integers of any depth into one flat list",
    "find the longest common prefix of a list of strings, or an empty string",
    "rotate a square matrix given as a list of lists by ninety degrees clockwise",
)


def prompt(task: str) -> str:
    return (
        "import math\nfrom collections import Counter\n\n\n"
        f'def solve(data):\n    """Write a function to {task}.\n\n'
        "    Keep it short, explain each step in a comment, and handle the empty input.\n"
        '    """\n'
    )


@dataclass(frozen=True, slots=True)
class Timing:
    prefill_s: float  # prompts in until every sequence's first token
    decode_s: float  # first token until the last, summed over runs that follow one another
    tokens: list[list[int]]  # per sequence, the new tokens

    def decode_tokens_per_s(self) -> float:
        return sum(len(t) - 1 for t in self.tokens) / self.decode_s

    def total_tokens_per_s(self) -> float:
        return sum(len(t) for t in self.tokens) / (self.prefill_s + self.decode_s)


def one_after_another(
    llama: "llama_cpp.Llama", prompts: list[list[int]], max_tokens: int
) -> Timing:
    """What the engine does today: Llama.generate from a cold cache, one request at a time."""
    prefill_s = decode_s = 0.0
    outputs: list[list[int]] = []
    for tokens in prompts:
        llama.reset()
        arrivals: list[float] = []
        out: list[int] = []
        start_s = time.perf_counter()
        for token in llama.generate(tokens, temp=0.0, repeat_penalty=1.0, reset=True):
            arrivals.append(time.perf_counter())
            out.append(token)
            if len(out) == max_tokens:
                break
        prefill_s += arrivals[0] - start_s
        decode_s += arrivals[-1] - arrivals[0]
        outputs.append(out)
    return Timing(prefill_s, decode_s, outputs)


def together(
    llama: "llama_cpp.Llama",
    context: "llama_cpp._internals.LlamaContext",
    batch: "llama_cpp._internals.LlamaBatch",
    prompts: list[list[int]],
    max_tokens: int,
) -> Timing:
    """All prompts in one llama_decode (one seq_id each), then one llama_decode per step with
    one token per sequence; each sequence samples from its own row of logits."""
    context.kv_cache_clear()
    samplers = [llama._init_sampler(temp=0.0, repeat_penalty=1.0) for _ in prompts]
    start_s = time.perf_counter()
    batch.reset()
    rows: list[int] = []  # each sequence's logits row in the batch just decoded
    for seq_id, tokens in enumerate(prompts):
        batch.add_sequence(tokens, seq_id, logits_all=False)
        rows.append(batch.n_tokens() - 1)
    context.decode(batch)
    outputs = [[s.sample(context, row)] for s, row in zip(samplers, rows, strict=True)]
    first_s = time.perf_counter()
    raw = batch.batch
    for _ in range(max_tokens - 1):
        raw.n_tokens = len(prompts)
        for seq_id, (tokens, out) in enumerate(zip(prompts, outputs, strict=True)):
            raw.token[seq_id] = out[-1]
            raw.pos[seq_id] = len(tokens) + len(out) - 1
            raw.n_seq_id[seq_id] = 1
            raw.seq_id[seq_id][0] = seq_id
            raw.logits[seq_id] = True
        context.decode(batch)
        for seq_id, (sampler, out) in enumerate(zip(samplers, outputs, strict=True)):
            out.append(sampler.sample(context, seq_id))
    end_s = time.perf_counter()
    for sampler in samplers:
        sampler.close()
    return Timing(first_s - start_s, end_s - first_s, outputs)


def through_engine(
    engine: "LlamaCppEngine", texts: list[str], max_tokens: int
) -> tuple[int, float]:
    """N requests from N threads at once through the engine: new tokens, wall seconds."""
    from openjarvis.runtime.types import GenerationRequest

    counts: list[int] = []
    start = threading.Barrier(len(texts) + 1)

    def run(text: str) -> None:
        start.wait()
        counts.append(engine.generate(GenerationRequest(text, max_tokens)).completion_tokens)

    threads = [threading.Thread(target=run, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    start.wait()
    start_s = time.perf_counter()
    for thread in threads:
        thread.join()
    return sum(counts), time.perf_counter() - start_s


def batch_context(
    llama: "llama_cpp.Llama", sequences: int, per_sequence_ctx: int, unified: bool
) -> "llama_cpp._internals.LlamaContext":
    """A second context on the same weights, with room for `sequences` sequences."""
    import ctypes

    from llama_cpp import _internals

    params = type(llama.context_params)()
    ctypes.pointer(params)[0] = llama.context_params  # a copy, not the engine's own struct
    params.n_seq_max = sequences
    params.n_ctx = sequences * per_sequence_ctx
    params.kv_unified = unified
    return _internals.LlamaContext(model=llama._model, params=params, verbose=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="decode and prefill threads")
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--unified-kv", action="store_true", help="one KV buffer for all seqs")
    args = parser.parse_args()
    from llama_cpp import _internals

    from openjarvis.runtime.llamacpp import LlamaCppEngine, LlamaCppSettings
    from openjarvis.runtime.models import resolve_model

    model = resolve_model(None)
    settings = LlamaCppSettings(
        n_ctx=512,
        n_threads=args.threads,
        reuse_prompt_cache=False,
        concurrency=max(args.sequences),
    )
    engine = LlamaCppEngine(model.path, settings)  # our load path: threads, GPU placement
    llama = engine._llama
    prompts = [llama.tokenize(prompt(task).encode()) for task in TASKS]
    lengths = [len(p) for p in prompts]
    per_sequence_ctx = 256
    assert max(lengths) + args.max_tokens <= per_sequence_ctx
    print(
        f"model {model.name} ({Path(model.path).stat().st_size / 1e6:.0f} MB), {args.threads} "
        f"threads, prompts {min(lengths)}-{max(lengths)} tokens, {args.max_tokens} new tokens, "
        f"greedy, {'unified' if args.unified_kv else 'per-sequence'} KV cache"
    )
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    contexts = {
        n: batch_context(llama, n, per_sequence_ctx, args.unified_kv) for n in args.sequences
    }
    batch = _internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1, verbose=False)
    warm = prompts[:1]
    one_after_another(llama, warm, 4)
    for n in args.sequences:
        together(llama, contexts[n], batch, prompts[:1] * n, 4)
    texts = [prompt(task) for task in TASKS]
    through_engine(engine, texts[:1], 4)
    results: dict[int, dict[str, list[Timing]]] = {n: {"a": [], "b": []} for n in args.sequences}
    engine_rates: dict[int, list[float]] = {n: [] for n in args.sequences}
    # Process CPU seconds per new token (every thread, prefill included): less swayed than wall
    # time by other processes taking turns on the cores, though not by their memory traffic.
    cpu_per_token: dict[int, dict[str, list[float]]] = {
        n: {"a": [], "b": [], "c": []} for n in args.sequences
    }
    for index in range(args.rounds):
        for n in args.sequences:
            sides = ("a", "b", "c") if index % 2 == 0 else ("c", "b", "a")
            for side in sides:
                cpu_start_s = time.process_time()
                if side == "c":
                    tokens, wall_s = through_engine(engine, texts[:n], args.max_tokens)
                    engine_rates[n].append(tokens / wall_s)
                else:
                    if side == "a":
                        timing = one_after_another(llama, prompts[:n], args.max_tokens)
                    else:
                        timing = together(llama, contexts[n], batch, prompts[:n], args.max_tokens)
                    results[n][side].append(timing)
                    tokens = sum(len(t) for t in timing.tokens)
                cpu_per_token[n][side].append((time.process_time() - cpu_start_s) / tokens)
    print(f"load average at end: {os.getloadavg()[0]:.2f}\n")
    report(results)
    print("\n| N | (c) engine, N at once: end-to-end tok/s | ratio to (a) end to end | rounds |")
    print("| ---: | ---: | ---: | --- |")
    for n, rates in engine_rates.items():
        base = statistics.median(t.total_tokens_per_s() for t in results[n]["a"])
        rounds = ", ".join(
            f"{rate / t.total_tokens_per_s():.2f}"
            for rate, t in zip(rates, results[n]["a"], strict=True)
        )
        median = statistics.median(rates)
        print(f"| {n} | {median:.1f} | **{median / base:.2f}** | {rounds} |")
    print(
        "\n| N | CPU ms per new token, a / b / c | **CPU ratio (a)/(b)** | **CPU ratio (a)/(c)** |"
    )
    print("| ---: | --- | ---: | ---: |")
    for n, per_side in cpu_per_token.items():
        a_ms, b_ms, c_ms = (1000 * statistics.median(per_side[k]) for k in "abc")
        print(
            f"| {n} | {a_ms:.1f} / {b_ms:.1f} / {c_ms:.1f} | **{a_ms / b_ms:.2f}** "
            f"| **{a_ms / c_ms:.2f}** |"
        )
    batch.close()
    for context in contexts.values():
        context.close()
    engine.close()


def report(results: dict[int, dict[str, list[Timing]]]) -> None:
    """Medians over the rounds; ratios are of the medians, with each round's ratio listed."""
    print(
        "| N | one after another: decode tok/s | together: decode tok/s | **decode ratio** "
        "| rounds' ratios | prefill s, a / b | end to end tok/s, a / b | end-to-end ratio "
        "| greedy tokens as (a) |"
    )
    print("| ---: | ---: | ---: | ---: | --- | --- | --- | ---: | --- |")
    for n, sides in results.items():
        a, b = sides["a"], sides["b"]
        decode_a = statistics.median(t.decode_tokens_per_s() for t in a)
        decode_b = statistics.median(t.decode_tokens_per_s() for t in b)
        total_a = statistics.median(t.total_tokens_per_s() for t in a)
        total_b = statistics.median(t.total_tokens_per_s() for t in b)
        prefill_a = statistics.median(t.prefill_s for t in a)
        prefill_b = statistics.median(t.prefill_s for t in b)
        rounds = ", ".join(
            f"{y.decode_tokens_per_s() / x.decode_tokens_per_s():.2f}"
            for x, y in zip(a, b, strict=True)
        )
        equal = matching(a[0].tokens, [t.tokens for t in a[1:] + b])
        print(
            f"| {n} | {decode_a:.1f} | {decode_b:.1f} | **{decode_b / decode_a:.2f}** | "
            f"{rounds} | {prefill_a:.2f} / {prefill_b:.2f} | {total_a:.1f} / {total_b:.1f} | "
            f"{total_b / total_a:.2f} | {equal} |"
        )


def matching(reference: list[list[int]], others: list[list[list[int]]]) -> str:
    """How many sequences give the reference's tokens in every other run, and where the first
    of the others part from it (token index), e.g. "2/4 (apart at 2, 4)"."""
    apart = sorted(
        {
            next(i for i, (x, y) in enumerate(zip(want, got, strict=True)) if x != y)
            for run in others
            for want, got in zip(reference, run, strict=True)
            if want != got
        }
    )
    same = sum(all(run[i] == want for run in others) for i, want in enumerate(reference))
    where = f" (apart at {', '.join(map(str, apart))})" if apart else ""
    return f"{same}/{len(reference)}{where}"


if __name__ == "__main__":
    main()
