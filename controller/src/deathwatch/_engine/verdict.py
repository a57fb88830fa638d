"""The vocabulary of verdicts: states, causes and the evidence a terminal verdict carries."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from deathwatch._engine.timeutil import format_time


class State(StrEnum):
    PENDING = "Pending"  # never Ready yet: nothing to lose
    ALIVE = "Alive"
    SUSPECT = "Suspect"  # not Ready, but the policy gives it a window to recover
    DEAD = "Dead"  # sticky: never taken back
    GONE = "Gone"  # deleted or completed without dying; terminal

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({State.DEAD, State.GONE})


class Cause(StrEnum):
    # causes of Dead
    CONTAINER_EXITED = "ContainerExited"
    OOM_KILLED = "OOMKilled"
    EVICTED = "Evicted"
    UNRESPONSIVE = "Unresponsive"
    NODE_LOST = "NodeLost"
    UNKNOWN = "Unknown"
    # causes of Gone
    DELETED = "Deleted"
    # a deletion whose reason its owner states (an agent-sandbox Sandbox): on purpose
    SUSPENDED = "Suspended"  # the Sandbox was suspended (operatingMode: Suspended)
    EXPIRED = "Expired"  # the Sandbox reached its shutdownTime
    COMPLETED = "Completed"
    FAILED_BEFORE_READY = "FailedBeforeReady"
    UNOBSERVED = "Unobserved"  # found gone with nobody watching: whether it died is unknown
    # cause of Suspect
    NOT_READY = "NotReady"


DEAD_CAUSES = (
    Cause.CONTAINER_EXITED, Cause.OOM_KILLED, Cause.EVICTED, Cause.UNRESPONSIVE, Cause.NODE_LOST,
    Cause.UNKNOWN,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Evidence:
    """Captured at the moment of a terminal verdict: the pod may be gone seconds later."""

    state: State
    cause: Cause
    policy: str
    pod_uid: str
    namespace: str
    name: str
    container: str | None
    exit_code: int | None
    reason: str | None  # the kubelet's own word: "Error", "OOMKilled", "Evicted", ...
    restart_count: int | None
    last_ready_at: datetime | None
    ready_drop_at: datetime | None
    declared_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form (RFC 3339 UTC times), as replay and logs print it."""
        return {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.pod_uid,
            "state": str(self.state),
            "policy": self.policy,
            "cause": str(self.cause),
            "container": self.container,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "restart_count": self.restart_count,
            "last_ready_at": format_time(self.last_ready_at),
            "ready_drop_at": format_time(self.ready_drop_at),
            "declared_at": format_time(self.declared_at),
        }
