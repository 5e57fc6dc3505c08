"""The loop an agent runs around Kiln, on the Python SDK (sdk/python).

A model writes a program for a task; Kiln runs it in a sandbox. When the run
fails with an error that changed code can fix (the result's error category:
syntax_error, runtime_error, timeout, memory_limit, output_limit), the model is
shown the category and the output and asked for a fix, at most three times,
within an execution budget: the total wall time the loop may spend. A platform
fault (retryable) is run again unchanged; anything else ends the loop.

Both caps are a Kiln budget (POST /v1/budgets) that every run names: the
server refuses a run past it (kiln.BudgetExhausted), so the cap holds even if
this loop is buggy or runs in several processes.

The model is any callable ``model(task, attempts) -> code``; plug an LLM in
there. Run ``python3 examples/agent_loop.py`` from the repository root to see it
with a scripted model, against the API at $KILN_SERVER (default
http://127.0.0.1:8080, e.g. ``make up``; $KILN_API_KEY when it has keys). The SDK
is imported from sdk/python when it is not installed (``pip install ./sdk/python``).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

try:
    import kiln
except ImportError:  # a checkout: the SDK beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sdk" / "python"))
    import kiln

MAX_RETRIES = 3


@dataclass
class Attempt:
    code: str
    result: Optional[kiln.Result]  # None when the budget ran out before it finished

    def feedback(self) -> str:
        """What the model is told about this attempt."""
        r = self.result
        if r is None:
            return "the run did not finish within the execution budget"
        cat = r.error.category if r.error else "none"
        return f"status={r.status} exit_code={r.exit_code} category={cat}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"


@dataclass
class Outcome:
    ok: bool
    reason: str  # "succeeded", "retries exhausted", "budget exhausted", or the unfixable category
    attempts: List[Attempt] = field(default_factory=list)

    @property
    def result(self) -> Optional[kiln.Result]:
        return self.attempts[-1].result if self.attempts else None


Model = Callable[[str, List[Attempt]], str]


def solve(client: kiln.Client, model: Model, task: str, *, budget_s: float = 60.0,
          max_retries: int = MAX_RETRIES) -> Outcome:
    """Run the model's program for task; fix and retry at most max_retries times within budget_s."""
    deadline = time.monotonic() + budget_s
    # The server-side cap: the first run and max_retries retries, and budget_s
    # of run time in all.
    budget = client.create_budget(max_runs=max_retries + 1, max_wall_ms=int(budget_s * 1000),
                                  expires_s=int(budget_s) + 600)["id"]
    attempts: List[Attempt] = []
    code = model(task, attempts)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Outcome(False, "budget exhausted", attempts)
        # The sandbox's own timeout never outlasts the budget.
        limit_ms = max(1000, int(remaining * 1000))
        try:
            res = client.run(code, limits=kiln.Limits(timeout_ms=min(limit_ms, 300_000)), timeout=remaining + 5,
                             budget=budget)
        except kiln.BudgetExhausted:
            return Outcome(False, "budget exhausted", attempts)
        except kiln.WaitTimeout as e:
            if e.job is not None and e.job.id:
                client.cancel(e.job.id)
            attempts.append(Attempt(code, None))
            return Outcome(False, "budget exhausted", attempts)
        attempts.append(Attempt(code, res))
        if res.ok:
            return Outcome(True, "succeeded", attempts)
        # The budget counts runs; an answer from the result cache is not one,
        # so the attempts are counted here too.
        b = client.get_budget(budget)
        if b["used"]["runs"] + b["reserved"]["runs"] >= b["max_runs"] or len(attempts) > max_retries:
            return Outcome(False, "retries exhausted", attempts)
        if res.error is not None and res.error.retryable:
            continue  # a platform fault: the same code may well succeed
        if res.error is None or not res.error.fixable:
            return Outcome(False, res.error.category if res.error else res.status, attempts)
        code = model(task, attempts)


def _scripted_model(task: str, attempts: List[Attempt]) -> str:
    if not attempts:
        return "numbers = [3, 1, 2]\nprint(sorted(numbers)[3])\n"  # an off-by-one
    print(f"--- attempt {len(attempts)} failed:\n{attempts[-1].feedback()}")
    return "numbers = [3, 1, 2]\nprint(sorted(numbers)[-1])\n"


if __name__ == "__main__":
    out = solve(kiln.Client(), _scripted_model, "print the largest number", budget_s=60)
    print(f"--- {out.reason} after {len(out.attempts)} attempt(s)")
    if out.result is not None:
        print(out.result.stdout, end="")
