"""How long to wait before trying again: the one retry policy of every loop in deathwatch,
written once. Each kind of call has its sequence of delays (seconds), the last one repeated
for as long as the failures go on; `delay` is the wait after the n-th failure in a row.
Every retry is also counted and logged where it happens: waiting is never silent."""

from __future__ import annotations

from typing import Final

Delays = tuple[float, ...]

# a list or watch that failed (the list/watch protocol), and a supervised task that crashed:
# quick at first (a blip), then every 30 s (an outage), never faster than the API can take
WATCH: Final[Delays] = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
RESTART: Final[Delays] = WATCH
# a write the API refused for now (a conflict, a 429, a 5xx): sooner, Dead verdicts wait behind
WRITE: Final[Delays] = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# a new DeathWatch's pods listed (its namespace's pods, page by page): a few tries, then given up
ADOPT: Final[Delays] = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# a client's watch (deathwatch.client, `wait`): a person waits on it, so never long
RECONNECT: Final[Delays] = (0.2, 0.5, 1.0, 2.0, 5.0)
# a node agent's watches (its pods, the Node objects, its DaemonSet): one agent per node, so
# a control plane outage must not bring every node back at once
NODE_WATCH: Final[Delays] = (1.0, 2.0, 5.0, 10.0, 30.0)
# the exits container's Lease write and runtime stream: a death waits on them, so short
PUBLISH: Final[Delays] = (0.5, 1.0, 2.0, 5.0, 10.0)
# a webhook sink that failed (delivery), jittered: never beyond 3 s, so that one that comes
# back is found within it (a probe each time), and many sinks never retry in step
DELIVER: Final[Delays] = (0.5, 1.0, 2.0, 3.0)


def delay(delays: Delays, failures: int) -> float:
    """The wait after `failures` failures in a row (1: the first), the last repeated."""
    return delays[min(max(failures, 1), len(delays)) - 1]


def jittered(delays: Delays, failures: int, rand: float) -> float:
    """Equal jitter of `delay`: between half and all of it, `rand` in [0, 1). Never near 0,
    so what failed is not tried again in a loop."""
    span = delay(delays, failures)
    return span / 2 + rand * span / 2
