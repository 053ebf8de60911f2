"""The torch scheduler's host work per decode step, on the CPU, no model: building the step
(`next_step`, the rows, and `StepInputs.of`, its tensors) and recording it after the GPU
(`finish_step`: the step's tokens, pieces and ends; `deliver`: tokens handed to their
consumers, every delivery period, and at once for a first token or an end).

`--batch` sequences decode together; each asks for 100-256 tokens (seeded), so sequences end
every few steps and are replaced by new ones, as under a server's load; the clock between steps
advances by `--step-ms` (the delivery period depends on it). Prints the best of `--repeats`
runs, in microseconds per step. Run it at two commits to compare them (an older tree with
`PYTHONPATH=DIR/src`), interleaved: this machine's timings drift between runs.

`--chain` times the GPU engine's steady state instead: the same sequences decoding, each step
after the first built by `continued` before the last one's tokens are known.

Run: .venv/bin/python benchmarks/scheduler_host.py [--batch 64] [--steps 3000] [--step-ms 1.5]
[--chain]
"""

import argparse
import random
import time

import torch

from openjarvis.runtime.torch.paged import BLOCK_SIZE, BlockPool
from openjarvis.runtime.torch.scheduler import Scheduler, Sequence, Step
from openjarvis.runtime.torch.step_inputs import StepInputs

__all__: list[str] = []


def _recorded_s(scheduler: Scheduler, step: Step, end_s: float, step_s: float) -> float:
    """Seconds of recording `step`, which ended at `end_s` (finish_step + deliver); then the
    consumers take what they were handed (not timed)."""
    started = time.perf_counter()
    scheduler.finish_step(step, [7] * len(step.rows), end_s - step_s, end_s)
    scheduler.deliver(end_s)
    spent = time.perf_counter() - started
    for row in step.rows:
        outbox = row.sequence.outbox
        while not outbox.empty():
            outbox.get_nowait()
    return spent


def per_step_us(batch: int, steps: int, step_s: float, prompt: int = 160) -> tuple[float, float]:
    """Mean microseconds of building a decode step (next_step + StepInputs.of) and of
    recording it (finish_step + deliver), over the decode steps of one run."""
    rng = random.Random(0)
    max_seq_len = prompt + 260
    pool = BlockPool(1 + 2 * batch * -(-max_seq_len // BLOCK_SIZE), BLOCK_SIZE)
    scheduler = Scheduler(pool, batch, 2048, max_seq_len)

    def top_up() -> None:
        """New sequences for the ended ones, admitted with their prompts in the cache (the
        prefill is not what is timed) and a first token."""
        for _ in range(batch - len(scheduler.running) - len(scheduler.waiting)):
            prompt_tokens = [rng.randrange(1000) for _ in range(prompt)]
            scheduler.add(Sequence(prompt_tokens, rng.randrange(100, 257), frozenset()))
        scheduler._admit()
        for sequence in scheduler.running:
            if sequence.prefilling:
                sequence.cached = sequence.scheduled = prompt
                sequence.output.append(1)

    top_up()
    now_s = build_s = record_s = 0.0
    for _ in range(steps):
        started = time.perf_counter()
        step = scheduler.next_step()
        assert step is not None and step.kind == "decode"
        StepInputs.of(step, BLOCK_SIZE)
        build_s += time.perf_counter() - started
        now_s += step_s
        record_s += _recorded_s(scheduler, step, now_s, step_s)
        top_up()
    return build_s / steps * 1e6, record_s / steps * 1e6


def chained_us(batch: int, steps: int, step_s: float, prompt: int = 160) -> tuple[float, float]:
    """The same two means for the GPU engine's steady state: the step after each one built by
    `continued` (decided before its tokens are known, each row's token on the device) while
    the same `batch` sequences decode, none ending."""
    rng = random.Random(0)
    max_seq_len = prompt + steps + 2
    pool = BlockPool(1 + batch * -(-max_seq_len // BLOCK_SIZE), BLOCK_SIZE)
    scheduler = Scheduler(pool, batch, 2048, max_seq_len)
    for _ in range(batch):
        prompt_tokens = [rng.randrange(1000) for _ in range(prompt)]
        scheduler.add(Sequence(prompt_tokens, steps + 2, frozenset()))
    scheduler._admit()
    for sequence in scheduler.running:
        sequence.cached = sequence.scheduled = prompt
        sequence.output.append(1)
    step = scheduler.next_step()
    assert step is not None
    now_s = build_s = record_s = 0.0
    for _ in range(steps):
        started = time.perf_counter()
        chained = scheduler.continued(step)
        assert chained is not None, "nothing ends or waits: every step continues the last"
        after, kept = chained
        StepInputs.of(after, BLOCK_SIZE, torch.zeros(len(kept), 1, dtype=torch.long))
        build_s += time.perf_counter() - started
        now_s += step_s
        record_s += _recorded_s(scheduler, step, now_s, step_s)
        step = after
    return build_s / steps * 1e6, record_s / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--step-ms", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--chain",
        action="store_true",
        help="the GPU engine's steady state: each step built by `continued`, no sequence ending",
    )
    args = parser.parse_args()
    run = chained_us if args.chain else per_step_us
    runs = [run(args.batch, args.steps, args.step_ms / 1e3) for _ in range(args.repeats)]
    build, record = min(build for build, _ in runs), min(record for _, record in runs)
    built = "continued" if args.chain else "next_step"
    print(
        f"{args.batch} decoding sequences, us a step (best of {args.repeats}): "
        f"{built} + StepInputs.of {build:.1f}, finish_step + deliver {record:.1f}"
    )


if __name__ == "__main__":
    main()
