"""What the `jarvis` app costs a reply: decode tokens/s through the app vs the engine alone, and
the time from a key press to its echo while a reply streams.

Run: `.venv/bin/python benchmarks/tui_bench.py --pairs 3 --out tui.json`

- Decode: the embedded model, greedy, the same chat request (the app's system prompt and one
  question) streamed (a) straight from the engine and drained in a thread, and (b) through the
  app driven headless by Textual's pilot, into the chat's Markdown with the status bar ticking.
  Pairs alternate their order so that drift on a shared machine hits both sides alike; the
  engine's own timings (first to last token) give each side's decode rate. Goal: ratio >= 0.95.
- Echo: while a reply streams through the app, keys are sent one at a time as the terminal
  driver sends them, and the time until the input box holds each one is taken (the paint that
  follows is not included). Goal: under 50 ms.
- UI CPU: the UI thread's CPU time while each reply ran, as a share of one core: on a small
  machine this is what the app takes from the model's threads, and unlike the decode ratio it
  does not swing with other tenants' load.
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from textual import events

from openjarvis.power import Meter
from openjarvis.runtime.llamacpp import LlamaCppEngine
from openjarvis.runtime.models import resolve_model
from openjarvis.runtime.types import Completion, Request, StreamChunk, final_completion
from openjarvis.store import open_store
from openjarvis.tui import AssistantApp
from openjarvis.tui.conversation import Conversation
from openjarvis.tui.engines import LoadedModel
from openjarvis.tui.protocol import system_prompt
from openjarvis.tui.widgets import HistoryInput, ReplyView

__all__ = ["main"]

QUESTION = "Explain in a short paragraph how a Python dictionary stores its keys and values."


class Recording:
    """The engine, passed through, keeping each completion: both sides read the first reply's
    decode rate from it (the app may go on to a tool round that the direct side never runs)."""

    def __init__(self, engine: LlamaCppEngine) -> None:
        self.engine = engine
        self.completions: list[Completion] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)

    def stream(self, request: Request) -> Iterator[StreamChunk]:
        for chunk in self.engine.stream(request):
            if chunk.completion is not None:
                self.completions.append(chunk.completion)
            yield chunk

    def first_rate(self) -> float:
        rate = self.completions[0].decode_tokens_per_s
        assert rate is not None, "the reply was under two tokens"
        self.completions.clear()
        return rate


def direct_decode_tokens_per_s(engine: Recording, folder: Path, max_tokens: int) -> float:
    """Drained in a worker thread, as the app does: here decode ran 2-5x slower in a process's
    main thread than in any other (docs/benchmarks.md), which is no cost of the app's."""
    conversation = Conversation(system_prompt(str(folder.resolve())))
    conversation.add("user", QUESTION)
    worker = threading.Thread(
        target=lambda: final_completion(engine.stream(conversation.request(max_tokens)))
    )
    worker.start()
    worker.join()
    return engine.first_rate()


def _grown(prompt: HistoryInput, before: int) -> bool:
    return len(prompt.value) > before


async def _wait(condition: Callable[[], bool], timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not get there in time")
        await asyncio.sleep(0.001)


async def app_run(
    engine: Recording, folder: Path, meter: Meter, keys: int, max_tokens: int
) -> tuple[float, list[float], float]:
    """One reply through the app; returns its decode rate, the echo times (s) of `keys` key
    presses made while it streamed, and the UI thread's CPU time as a share of the wall time
    while the reply ran (what the app takes from the model's cores)."""
    with open_store(str(folder / "bench.db")) as store:
        app = AssistantApp(
            opener=lambda spec: LoadedModel(engine, engine.engine.n_ctx, spec),  # type: ignore[arg-type]  # Recording passes the engine through
            model_spec=None,
            meter=meter,
            store=store,
            working_dir=folder,
            reply_tokens=max_tokens,
        )
        echoes: list[float] = []
        async with app.run_test(size=(120, 40), notifications=False) as pilot:
            await _wait(lambda: app.model is not None and not app.busy)
            prompt = app.query_one(HistoryInput)
            prompt.value = QUESTION
            cpu_start_s, wall_start_s = time.thread_time(), time.monotonic()
            await pilot.press("enter")
            await _wait(lambda: bool(app.query(ReplyView)) and bool(app.query_one(ReplyView).text))
            for _ in range(keys):
                if not app.busy:
                    break
                before = len(prompt.value)
                start_s = time.perf_counter()
                # What a terminal driver does with a key; the pilot's press would also wait
                # for the whole app to go idle, which a streaming reply never lets it do.
                assert app._driver is not None, "run_test's app has its headless driver"
                app._driver.send_message(events.Key("x", "x"))
                await _wait(partial(_grown, prompt, before), 10.0)
                echoes.append(time.perf_counter() - start_s)
                await asyncio.sleep(0.2)
            await _wait(lambda: not app.busy)
            # The pilot runs in the app's event loop: this thread is the UI thread.
            ui_share = (time.thread_time() - cpu_start_s) / (time.monotonic() - wall_start_s)
        return engine.first_rate(), echoes, ui_share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--keys", type=int, default=10, help="key presses in the echo run")
    parser.add_argument("--max-tokens", type=int, default=96, help="each reply's token budget")
    parser.add_argument("--out", type=Path, help="write the numbers as JSON")
    args = parser.parse_args()

    engine = Recording(LlamaCppEngine(resolve_model(None).path))
    with tempfile.TemporaryDirectory() as temporary, Meter.discover(scope="system") as meter:
        folder = Path(temporary)
        budget = args.max_tokens
        asyncio.run(app_run(engine, folder, meter, 0, budget))  # warms the prompt cache
        direct_rates, app_rates, ui_shares = [], [], []
        for pair in range(args.pairs):
            for side in ("direct", "app") if pair % 2 == 0 else ("app", "direct"):
                if side == "direct":
                    rate = direct_decode_tokens_per_s(engine, folder, budget)
                    direct_rates.append(rate)
                else:
                    rate, _, ui_share = asyncio.run(app_run(engine, folder, meter, 0, budget))
                    app_rates.append(rate)
                    ui_shares.append(ui_share)
                print(f"pair {pair + 1} {side}: {rate:.2f} tok/s")
        _, echoes, _ = asyncio.run(app_run(engine, folder, meter, args.keys, budget))
    engine.engine.close()

    direct, through_app = statistics.median(direct_rates), statistics.median(app_rates)
    ratio = through_app / direct
    echo_ms = [seconds * 1000 for seconds in echoes]
    print(f"\ndecode tokens/s, median of {args.pairs}: engine {direct:.2f}, app {through_app:.2f}")
    pair_ratios = [round(a / d, 3) for a, d in zip(app_rates, direct_rates, strict=True)]
    print(f"ratio app / engine: {ratio:.3f} (goal >= 0.95); per pair: {pair_ratios}")
    print(
        f"UI thread CPU while a reply streams: median {statistics.median(ui_shares):.1%} of a core"
    )
    if echo_ms:
        median_ms = statistics.median(echo_ms)
        print(
            f"key echo while streaming, {len(echo_ms)} keys: median {median_ms:.1f} ms, "
            f"max {max(echo_ms):.1f} ms (goal < 50 ms)"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "direct_tokens_per_s": direct_rates,
                    "app_tokens_per_s": app_rates,
                    "ratio": ratio,
                    "pair_ratios": pair_ratios,
                    "ui_thread_cpu_share": ui_shares,
                    "echo_ms": echo_ms,
                    "reply_budget_tokens": budget,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
