"""How many examples a property test tries: its full count in CI and hack/test.sh, a tenth
(at least 20) in the fast loop (hack/unit.sh sets DEATHWATCH_QUICK=1): the same properties,
checked less deeply while code changes, in full before it lands."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

QUICK = os.environ.get("DEATHWATCH_QUICK", "") not in ("", "0")


def examples(count: int, slow: bool = False) -> settings:
    """`@examples(400)` for `@settings(max_examples=400)`; `slow`: a test whose examples take
    long on a loaded machine (hypothesis's too_slow health check suppressed)."""
    return settings(
        max_examples=max(20, count // 10) if QUICK else count,
        # no per-example deadline: these test what is judged, not how fast (bench/ measures
        # that), and beside the lanes' builds a loaded machine ran one example past 200 ms
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow] if slow else [],
    )
