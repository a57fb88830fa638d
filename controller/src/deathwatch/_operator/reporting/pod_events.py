"""The Events posted on sandbox pods, built from the engine's Track: pure, no I/O."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from deathwatch._api.resources import (
    MANAGED_BY,
    EventReason,
)
from deathwatch._engine.engine import Track
from deathwatch._engine.timeutil import format_time
from deathwatch._engine.verdict import State, origin_of
from deathwatch._operator.reporting.shield import Shield

if TYPE_CHECKING:
    pass
from deathwatch._operator.reporting.wording import BY_WHOM, evidence_details

PROBE_BLOCKED_MESSAGE = (
    "a tcpSocket/httpGet/grpc readiness probe targets an agent port; kubelet probes from the "
    "host, which the node firewall refuses, so it can never pass: use an exec probe"
)


@dataclass(frozen=True, slots=True)
class KubeEvent:
    """A Kubernetes Event about a pod (core/v1), posted once per (pod uid, reason): its name
    is deterministic, so a second create is a 409, even from a restarted controller."""

    namespace: str
    pod: str
    pod_uid: str
    reason: EventReason
    message: str
    type: str = "Warning"
    spell: str | None = None  # for reasons that can recur: which spell (same on every replica)

    @property
    def name(self) -> str:
        suffix = f".{self.pod_uid[:8]}.{self.reason.lower()}"
        if self.spell is not None:
            suffix += "." + hashlib.sha256(self.spell.encode()).hexdigest()[:8]
        return self.pod[: 253 - len(suffix)] + suffix

    def document(self, now: datetime, instance: str) -> dict[str, Any]:
        at = format_time(now)
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": self.namespace,
                "name": self.pod,
                "uid": self.pod_uid,
            },
            "reason": str(self.reason),
            "message": self.message,
            "type": self.type,
            "count": 1,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "source": {"component": "deathwatch"},
            "reportingComponent": MANAGED_BY,
            "reportingInstance": instance,
        }


def _event(track: Track, reason: EventReason, message: str, type: str = "Warning") -> KubeEvent:
    return KubeEvent(track.namespace, track.name, track.uid, reason, message, type)


def dead_event(track: Track) -> KubeEvent:
    """One per pod: its death, whose doing it was, and its evidence; for a disruption of the
    cluster's, the condition's reason and the component's own message."""
    details = evidence_details(track.evidence)
    detail = f" ({', '.join(details)})" if details else ""
    return _event(
        track,
        EventReason.SANDBOX_DEAD,
        f"Sandbox dead: {track.cause}, {BY_WHOM[origin_of(track.cause)]}{detail}; "
        f"Ready dropped at {format_time(track.ready_drop_at)}, policy {track.policy}",
    )


def false_positive_event(track: Track) -> KubeEvent:
    declared = format_time(track.evidence.declared_at) if track.evidence else None
    return _event(
        track,
        EventReason.SANDBOX_FALSE_POSITIVE,
        f"Ready again after being declared dead at {declared}; the Dead verdict stands",
    )


def disputed_event(track: Track) -> KubeEvent:
    return _event(
        track,
        EventReason.NODE_EXIT_DISPUTED,
        f"declared dead on the exit its node heard; the kubelet's report tells it otherwise: "
        f"{track.disputed}. The Dead verdict stands (docs/runbook.md#nodeexitdisputed)",
    )


def sidecar_restarted_event(track: Track) -> KubeEvent:
    """Once per pod: a container that is not the sandbox restarted, and the sandbox lives on."""
    return _event(
        track,
        EventReason.SIDECAR_RESTARTED,
        "a container that is not the sandbox (a native sidecar or a helper) restarted; the "
        "sandbox lives on (status.sidecarRestarts counts them). Name it in the DeathWatch's "
        "spec.containers (vitalSidecars, sandbox) to make its death the sandbox's",
        type="Normal",
    )


def probe_blocked_event(track: Track) -> KubeEvent:
    return _event(track, EventReason.PROBE_BLOCKED, PROBE_BLOCKED_MESSAGE)


def lost_track_event(track: Track, last_seen: State | None) -> KubeEvent:
    return _event(
        track,
        EventReason.SANDBOX_LOST_TRACK,
        f"Sandbox deleted while deathwatch could not watch it (last seen {last_seen}); "
        "whether it died before it was deleted is unknown",
    )


def unshielded_event(track: Track, shield: Shield, spell: str) -> KubeEvent:
    return KubeEvent(
        track.namespace,
        track.name,
        track.uid,
        EventReason.SANDBOX_UNSHIELDED,
        f"Sandbox not shielded by the node firewall: {shield.reason}: {shield.message}",
        spell=spell,
    )
