"""Score code completions by running their suite's tests in the sandbox, and estimate pass@k.

Programs run in parallel, one sandboxed subprocess per worker thread.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from openjarvis.evals.sandbox import Sandbox
from openjarvis.evals.types import ExecutionResult, Task

__all__ = ["build_program", "pass_at_k", "score_completions"]


def build_program(task: Task, completion: str) -> str:
    """The prompt, the model's completion, the task's tests, and the call that runs them."""
    # Newlines between the parts keep a completion without a final newline from running into
    # the test code; a test block indented under the completion would change its meaning.
    return f"{task.prompt}{completion}\n\n{task.test}\n\ncheck({task.entry_point})\n"


def score_completions(
    items: list[tuple[Task, str]],
    sandbox: Sandbox,
    timeout_s: float = 10.0,
    workers: int | None = None,
) -> list[ExecutionResult]:
    """Run each (task, completion) in the sandbox; results come back in the order given.

    The timeout is per program and generous on purpose: a loaded machine must not turn a
    correct but slow solution into a failure.
    """
    if not items:
        return []
    workers = workers or os.cpu_count() or 1
    # Threads only wait on subprocesses, so the GIL is no bottleneck here.
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(
            pool.map(lambda item: sandbox.run_python(build_program(*item), timeout_s), items)
        )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the huge binomials.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0  # every choice of k samples contains a passing one
    failure = 1.0
    for i in range(n - c + 1, n + 1):
        failure *= 1.0 - k / i
    return 1.0 - failure
