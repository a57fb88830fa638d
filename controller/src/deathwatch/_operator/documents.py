"""Verdicts as the API stores them, and back: SandboxVerdict and DeathWatch status documents.

Pure functions over plain data: the operator writes what `verdict_status` returns, and on a
restart rebuilds the engine's memory with `track_from_status`, so nothing the engine needs
lives only in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from deathwatch._engine.engine import Track
from deathwatch._engine.timeutil import format_time, parse_time
from deathwatch._engine.verdict import Cause, Evidence, State

LAST_DEATHS = 20
PROBE_BLOCKED_MESSAGE = (
    "a tcpSocket/httpGet/grpc readiness probe targets an agent port; kubelet probes from the "
    "host, which the node firewall refuses, so it can never pass: use an exec probe"
)


def _condition(
    kind: str, status: str, reason: str, message: str, since: datetime | None
) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": format_time(since),
    }


def verdict_message(track: Track) -> str:
    e = track.evidence
    if track.state is State.DEAD and e is not None:
        parts = [f"{e.cause}"]
        if e.container:
            parts.append(f"container {e.container}")
        if e.exit_code is not None:
            parts.append(f"exit code {e.exit_code}")
        if e.reason:
            parts.append(f"reason {e.reason}")
        return f"declared dead ({', '.join(parts)}) by policy {track.policy}"
    if track.state is State.SUSPECT:
        return (
            f"not Ready since {format_time(track.ready_drop_at)}; "
            f"dead at {format_time(track.deadline)} unless it recovers"
        )
    if track.state is State.GONE:
        return f"gone ({track.cause}) without dying"
    if track.state is State.PENDING:
        return "not Ready yet"
    return f"Ready since {format_time(track.last_ready_at)}"


def verdict_status(track: Track, node: str | None) -> dict[str, Any]:
    """The SandboxVerdict status for a track (None values are left out)."""
    e = track.evidence
    alive = {State.ALIVE: "True", State.SUSPECT: "Unknown", State.PENDING: "Unknown"}.get(
        track.state, "False"
    )
    conditions = [
        _condition(
            "Alive",
            alive,
            str(track.cause or track.state),
            verdict_message(track),
            track.changed_at,
        )
    ]
    if track.probe_blocked:
        conditions.append(
            _condition(
                "ProbeBlockedByFirewall",
                "True",
                "NetworkProbeOnAgentPort",
                PROBE_BLOCKED_MESSAGE,
                track.changed_at,
            )
        )
    status: dict[str, Any] = {
        "state": str(track.state),
        "policy": track.policy,
        "cause": str(track.cause) if track.cause else None,
        "container": e.container if e else None,
        "exitCode": e.exit_code if e else None,
        "reason": e.reason if e else None,
        "restartCount": e.restart_count if e else sum(track.restart_baseline.values()),
        "restartCounts": dict(track.restart_baseline),
        "podUID": track.uid,
        "node": node,
        "lastReadyAt": format_time(track.last_ready_at),
        "readyDropAt": format_time(track.ready_drop_at),
        "deadline": format_time(track.deadline),
        "declaredAt": format_time(e.declared_at) if e else None,
        "readyDrops": track.ready_drops,
        "flaps": track.flaps,
        "falsePositive": track.false_positive,
        "probeBlockedByFirewall": track.probe_blocked,
        "conditions": conditions,
    }
    return {k: v for k, v in status.items() if v is not None}


def track_from_status(namespace: str, name: str, status: Mapping[str, Any]) -> Track | None:
    """Rebuild the engine's memory of a pod from its SandboxVerdict. None if unusable."""
    uid = status.get("podUID")
    policy = status.get("policy")
    try:
        state = State(str(status.get("state")))
    except ValueError:
        return None
    if not isinstance(uid, str) or not uid or not isinstance(policy, str) or not policy:
        return None
    cause = None
    if status.get("cause"):
        try:
            cause = Cause(status["cause"])
        except ValueError:
            cause = Cause.UNKNOWN
    declared_at = parse_time(status.get("declaredAt"))
    last_ready_at = parse_time(status.get("lastReadyAt"))
    ready_drop_at = parse_time(status.get("readyDropAt"))
    changed_at = None
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Alive":
            changed_at = parse_time(cond.get("lastTransitionTime"))
    evidence = None
    if state.terminal and declared_at is not None:
        evidence = Evidence(
            state=state,
            cause=cause or Cause.UNKNOWN,
            policy=policy,
            pod_uid=uid,
            namespace=namespace,
            name=name,
            container=status.get("container"),
            exit_code=status.get("exitCode"),
            reason=status.get("reason"),
            restart_count=status.get("restartCount"),
            last_ready_at=last_ready_at,
            ready_drop_at=ready_drop_at,
            declared_at=declared_at,
        )
    counts = status.get("restartCounts") or {}
    return Track(
        uid=uid,
        namespace=namespace,
        name=name,
        policy=policy,
        state=state,
        cause=cause,
        ever_ready=state is not State.PENDING or last_ready_at is not None,
        ready=state is State.ALIVE,
        last_ready_at=last_ready_at,
        ready_drop_at=ready_drop_at,
        deadline=parse_time(status.get("deadline")),
        restart_baseline={k: v for k, v in counts.items() if isinstance(v, int)},
        ready_drops=int(status.get("readyDrops") or 0),
        flaps=int(status.get("flaps") or 0),
        false_positive=bool(status.get("falsePositive")),
        probe_blocked=bool(status.get("probeBlockedByFirewall")),
        evidence=evidence,
        changed_at=changed_at,
    )


def deathwatch_status(
    tracks: Iterable[Track],
    firewall: Mapping[str, Any] | None,
    conditions: list[dict[str, Any]],
    generation: int | None,
) -> dict[str, Any]:
    """The DeathWatch status: counts, the last deaths with evidence, firewall coverage."""
    counts = dict.fromkeys(
        ("tracked", "pending", "alive", "suspect", "dead", "gone", "flaps", "falsePositives"), 0
    )
    deaths: list[Evidence] = []
    for t in tracks:
        counts["tracked"] += 1
        counts[str(t.state).lower()] += 1
        counts["flaps"] += t.flaps
        counts["falsePositives"] += int(t.false_positive)
        if t.state is State.DEAD and t.evidence is not None:
            deaths.append(t.evidence)
    deaths.sort(key=lambda e: (e.declared_at, e.name), reverse=True)
    status: dict[str, Any] = {
        **counts,
        "lastDeaths": [
            {
                k: v
                for k, v in {
                    "name": e.name,
                    "podUID": e.pod_uid,
                    "policy": e.policy,
                    "cause": str(e.cause),
                    "container": e.container,
                    "exitCode": e.exit_code,
                    "readyDropAt": format_time(e.ready_drop_at),
                    "declaredAt": format_time(e.declared_at),
                }.items()
                if v is not None
            }
            for e in deaths[:LAST_DEATHS]
        ],
        "conditions": conditions,
    }
    if firewall is not None:
        status["firewall"] = dict(firewall)
    if generation is not None:
        status["observedGeneration"] = generation
    return status
