"""Runtime benchmark, side by side in one run: our llama.cpp engine against llama-cpp-python's own
create_completion, and `jarvis serve` (through the official openai client) against in process:
one client, with the serving path's own cost per token (an engine whose tokens cost nothing),
or (--compare batch) as many clients at once as the engine batches.

Same GGUF, prompt, greedy decoding, max_tokens and threads; every request from a cold cache;
the contenders alternate in each round so that other load on the machine hits them alike.
Run: .venv/bin/python benchmarks/runtime_bench.py [--rounds 5] [--max-tokens 256]
     [--compare both|engine|serve|batch]
"""

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import llama_cpp
import openai

from openjarvis.runtime.llamacpp import LlamaCppEngine, LlamaCppSettings
from openjarvis.runtime.models import resolve_model
from openjarvis.runtime.types import (
    Completion,
    GenerationRequest,
    Request,
    StepLedger,
    StreamChunk,
    final_completion,
)
from openjarvis.serve import running_server

__all__: list[str] = []

PROMPT = (
    "from typing import List\n\n\n"
    "def merge_sort(values: List[int]) -> List[int]:\n"
    '    """Sort the values with merge sort and return a new list. Explain each step in\n'
    '    comments."""\n'
)


@dataclass(frozen=True, slots=True)
class Timing:
    ttft_s: float
    decode_tokens_per_s: float
    tokens: int
    text: str


def ours(engine: LlamaCppEngine, max_tokens: int) -> Timing:
    completion = engine.generate(GenerationRequest(PROMPT, max_tokens=max_tokens))
    assert completion.ttft_s is not None and completion.decode_tokens_per_s is not None
    return Timing(
        completion.ttft_s,
        completion.decode_tokens_per_s,
        completion.completion_tokens,
        completion.text,
    )


def _from_arrivals(start_s: float, arrivals_s: list[float], tokens: int, text: str) -> Timing:
    """TTFT and (tokens - 1) / (last - first), as METRICS.md defines them, from chunk times."""
    return Timing(
        arrivals_s[0] - start_s, (tokens - 1) / (arrivals_s[-1] - arrivals_s[0]), tokens, text
    )


def theirs(llama: llama_cpp.Llama, max_tokens: int, tokens: int) -> Timing:
    """create_completion streamed; one chunk per token here (ASCII output, no stop strings)."""
    llama.reset()
    start_s = time.monotonic()
    arrivals_s, pieces = [], []
    chunks = llama.create_completion(
        PROMPT, max_tokens=max_tokens, temperature=0.0, repeat_penalty=1.0, stream=True
    )
    assert not isinstance(chunks, dict), "stream=True gives an iterator of chunks"
    for chunk in chunks:
        arrivals_s.append(time.monotonic())
        pieces.append(chunk["choices"][0]["text"])
    return _from_arrivals(start_s, arrivals_s, tokens, "".join(pieces))


def served(client: openai.OpenAI, max_tokens: int, tokens: int) -> Timing:
    start_s = time.monotonic()
    arrivals_s, pieces = [], []
    stream = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=max_tokens, temperature=0, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            arrivals_s.append(time.monotonic())
            pieces.append(chunk.choices[0].text)
    return _from_arrivals(start_s, arrivals_s, tokens, "".join(pieces))


class InstantEngine:
    """Tokens as fast as Python yields them: a request's time through the server is then the
    serving path's own cost per token (thread hand-off, JSON, SSE, HTTP, the client's parse)."""

    kind = "instant"
    model_name = "instant"
    devices: tuple[int, ...] = ()
    concurrency = 1
    ledger: StepLedger | None = None  # one request at a time: nothing shared to split

    def settings_dict(self) -> dict[str, object]:
        return {}

    def stream(self, request: Request) -> Generator[StreamChunk]:
        count = request.max_tokens or 1
        start_s = time.monotonic()
        times_s = []
        for _ in range(count):
            times_s.append(time.monotonic())
            yield StreamChunk("x ", times_s[-1])
        end_s = time.monotonic()
        completion = Completion(
            text="x " * count,
            prompt_tokens=1,
            completion_tokens=count,
            finish_reason="length",
            wall_s=end_s - start_s,
            ttft_s=times_s[0] - start_s,
            decode_s=times_s[-1] - times_s[0],
        )
        yield StreamChunk("", end_s, completion)

    def generate(self, request: Request) -> Completion:
        return final_completion(self.stream(request))

    def close(self) -> None:
        pass


def serving_cost_us(tokens: int = 2000, repeats: int = 5) -> float:
    """Median microseconds per token through `jarvis serve` and the openai client."""
    with running_server(InstantEngine(), None) as server:
        client = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0)
        rates = [served(client, tokens, tokens).decode_tokens_per_s for _ in range(repeats)]
    return 1e6 / statistics.median(rates)


def rounds(contenders: dict[str, Callable[[], Timing]], count: int) -> dict[str, list[Timing]]:
    results: dict[str, list[Timing]] = {name: [] for name in contenders}
    names = list(contenders)
    for index in range(count):
        for name in names if index % 2 == 0 else reversed(names):
            results[name].append(contenders[name]())
    return results


def _interval(ratios: list[float], resamples: int = 2000) -> tuple[float, float]:
    """95 % bootstrap interval of the geometric mean (pairs resampled, fixed seed)."""
    generator = random.Random(0)
    means = sorted(
        statistics.geometric_mean(generator.choices(ratios, k=len(ratios)))
        for _ in range(resamples)
    )
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def report(title: str, results: dict[str, list[Timing]], baseline: str) -> None:
    """Medians, and the median of per-round ratios: a round's contenders ran back to back, so
    pairing cancels most of the drift of other load on the machine."""
    print(f"\n{title}")
    print(
        "| contender | decode tok/s (median) | TTFT ms (median) | tokens "
        "| decode ratio (paired): median, geometric mean [95 % interval] (each pair) |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    base = results[baseline]
    for name, timings in results.items():
        rate = statistics.median(t.decode_tokens_per_s for t in timings)
        ttft_ms = 1000 * statistics.median(t.ttft_s for t in timings)
        paired = [
            t.decode_tokens_per_s / b.decode_tokens_per_s
            for t, b in zip(timings, base, strict=True)
        ]
        ratios = ", ".join(f"{r:.3f}" for r in paired)
        low, high = _interval(paired)
        print(
            f"| {name} | {rate:.1f} | {ttft_ms:.0f} | {timings[0].tokens} "
            f"| {statistics.median(paired):.3f}, {statistics.geometric_mean(paired):.3f} "
            f"[{low:.3f}-{high:.3f}] ({ratios}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="default: physical cores")
    parser.add_argument(
        "--compare",
        choices=("both", "engine", "serve", "batch"),
        default="both",
        help="engine: against llama-cpp-python; serve: jarvis serve against in process; "
        "batch: as many clients at once as the engine batches, through the server and not",
    )
    args = parser.parse_args()
    model = resolve_model(None)
    settings = LlamaCppSettings(n_ctx=2048, n_threads=args.threads, reuse_prompt_cache=False)
    engine = LlamaCppEngine(model.path, settings, name=model.name)
    reference = ours(engine, args.max_tokens)  # warm-up, and the token count for the others
    print(
        f"model {model.name}, {settings.resolved_threads()} decode / "
        f"{settings.resolved_batch_threads()} prefill threads, {reference.tokens} tokens per run"
    )
    print(f"load average at start: {os.getloadavg()[0]:.1f}")

    if args.compare in ("both", "engine"):
        llama = llama_cpp.Llama(
            model_path=str(model.path),
            n_ctx=2048,
            n_threads=settings.resolved_threads(),
            n_threads_batch=settings.resolved_batch_threads(),
            n_batch=settings.n_batch,
            verbose=False,
        )
        compare_engines(engine, llama, args.max_tokens, args.rounds, reference)
        llama.close()
    if args.compare in ("both", "serve"):
        compare_server(engine, args.max_tokens, args.rounds, reference)
    if args.compare == "batch":
        compare_batch(engine, args.max_tokens, args.rounds)

    final = engine.generate(GenerationRequest(PROMPT, max_tokens=args.max_tokens))
    bandwidth = engine.bandwidth
    print(
        f"\nroofline: bandwidth {bandwidth.gb_per_s:.1f} GB/s ({bandwidth.method}); "
        f"bytes/token {final.decode_bytes_per_token / 1e6:.1f} MB; "
        f"MBU {final.memory_bandwidth_utilisation:.1%}"
        if bandwidth and final.decode_bytes_per_token and final.memory_bandwidth_utilisation
        else "\nroofline: unknown"
    )
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    engine.close()


def compare_engines(
    engine: LlamaCppEngine, llama: llama_cpp.Llama, max_tokens: int, count: int, reference: Timing
) -> None:
    direct = rounds(
        {
            "OpenJarvis LlamaCppEngine": lambda: ours(engine, max_tokens),
            "llama-cpp-python create_completion": lambda: theirs(
                llama, max_tokens, reference.tokens
            ),
        },
        count,
    )
    for timing in direct["llama-cpp-python create_completion"]:
        assert timing.text == reference.text, "greedy outputs differ: the runs are not comparable"
    report("engine vs llama-cpp-python", direct, "llama-cpp-python create_completion")


def compare_batch(engine: LlamaCppEngine, max_tokens: int, count: int) -> None:
    """`engine.concurrency` requests at once, as threads in process and as openai clients
    through `jarvis serve`: total tokens over the wall time of the batch, paired by round."""
    width = engine.concurrency

    def at_once(one: Callable[[], int]) -> float:
        start_s = time.monotonic()
        with ThreadPoolExecutor(width) as pool:
            tokens = sum(pool.map(lambda _: one(), range(width)))
        return tokens / (time.monotonic() - start_s)

    request = GenerationRequest(PROMPT, max_tokens=max_tokens)
    with running_server(engine, None) as server:
        client = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0)

        def through() -> int:
            reply = client.completions.create(
                model="m", prompt=PROMPT, max_tokens=max_tokens, temperature=0
            )
            assert reply.usage is not None
            return reply.usage.completion_tokens

        inside: list[float] = []
        served_rates: list[float] = []
        for index in range(count):
            pair = [
                (inside, lambda: engine.generate(request).completion_tokens),
                (served_rates, through),
            ]
            for rates, one in pair if index % 2 == 0 else reversed(pair):
                rates.append(at_once(one))
    paired = [s / i for s, i in zip(served_rates, inside, strict=True)]
    print(f"\n{width} requests at once (the engine's concurrency), tokens/s over the batch's wall")
    print(f"| in process | {statistics.median(inside):.1f} |")
    print(
        f"| jarvis serve + openai clients | {statistics.median(served_rates):.1f} "
        f"| paired ratio median {statistics.median(paired):.3f} "
        f"({', '.join(f'{r:.3f}' for r in paired)}) |"
    )


def compare_server(engine: LlamaCppEngine, max_tokens: int, count: int, reference: Timing) -> None:
    """One client (the official openai client, streaming) through `jarvis serve` on loopback,
    server and client in this process, against the same engine called in process."""
    with running_server(engine, None) as server:
        client = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0)
        through = rounds(
            {
                "in process (LlamaCppEngine)": lambda: ours(engine, max_tokens),
                "jarvis serve + openai client": lambda: served(
                    client, max_tokens, reference.tokens
                ),
            },
            count,
        )
    for timing in through["jarvis serve + openai client"]:
        assert timing.text == reference.text, "the server's output differs from the engine's"
    report("jarvis serve vs in process", through, "in process (LlamaCppEngine)")
    cost_us = serving_cost_us()
    token_us = 1e6 / statistics.median(
        t.decode_tokens_per_s for t in through["in process (LlamaCppEngine)"]
    )
    print(
        f"\nserving path, an engine that costs nothing: {cost_us:.0f} us per token; against "
        f"{token_us / 1000:.1f} ms per token decoded in process, a ratio of at least "
        f"{token_us / (token_us + cost_us):.3f} were none of it to overlap the decode"
    )


if __name__ == "__main__":
    main()
