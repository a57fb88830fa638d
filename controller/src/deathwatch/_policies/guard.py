"""A time bound for third-party policies: a judge() that takes too long is abandoned.

The engine already contains a policy that raises or returns garbage (engine._judge); what it
cannot do from inside a call is stop one that never returns, and a policy runs on the
operator's event loop. So each plugin gets its own single thread: a call waits at most
`budget`; a call still running after that is abandoned (Python cannot stop a thread) and
every later call fails at once with PolicyTimeout until it returns, so a hung plugin costs
its own pods their policy and the event loop one budget, not more. Built-in policies are
trusted and called directly.
"""

from __future__ import annotations

import concurrent.futures

from deathwatch._engine.contract import Decision, Policy, PolicySettings, Situation
from deathwatch._engine.podview import PodView

DEFAULT_BUDGET = 0.05  # seconds: a policy decides from data in memory; 50 ms is generous


class PolicyTimeout(Exception):
    """judge() did not return within its budget, or an earlier call still has not."""


class Guarded:
    def __init__(self, policy: Policy, budget: float = DEFAULT_BUDGET) -> None:
        self.policy = policy
        self.budget = budget
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"policy-{policy.name}"
        )
        self._stuck: concurrent.futures.Future[Decision] | None = None

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def ready_means_running(self) -> bool:
        """What the plugin declares the engine may infer for it (contract.py)."""
        return getattr(self.policy, "ready_means_running", False) is True

    @property
    def busy(self) -> bool:
        """An abandoned call is still running."""
        return self._stuck is not None and not self._stuck.done()

    def applies(self, pod: PodView, settings: PolicySettings) -> bool:
        return self.policy.applies(pod, settings)

    def judge(self, situation: Situation) -> Decision:
        if self.busy:
            raise PolicyTimeout(
                f"still running a call that exceeded its {self.budget * 1000:.0f} ms budget"
            )
        self._stuck = None
        future = self._pool.submit(self.policy.judge, situation)
        try:
            return future.result(timeout=self.budget)
        except concurrent.futures.TimeoutError:
            self._stuck = future
            raise PolicyTimeout(
                f"judge() did not return within {self.budget * 1000:.0f} ms"
            ) from None
