"""How a verdict's evidence, and whose doing it was, are said in words: in a SandboxVerdict's
message and in the Events on its pod alike."""

from __future__ import annotations

from deathwatch._engine.verdict import Evidence, Observer, Origin

BY_WHOM = {
    Origin.WORKLOAD: "the workload's own doing",
    Origin.INFRASTRUCTURE: "the infrastructure's doing",
    Origin.PLATFORM: "the platform's doing, on purpose",
    Origin.UNKNOWN: "whose doing is unknown",
}


def evidence_summary(e: Evidence) -> str:
    """ "ContainerExited, container agent, exit code 7, reason Error"."""
    return ", ".join([str(e.cause), *evidence_details(e)])


def evidence_details(e: Evidence | None) -> list[str]:
    if e is None:
        return []
    parts = []
    if e.disruption:
        parts.append(f"DisruptionTarget {e.disruption}" + (f": {e.message}" if e.message else ""))
    elif e.message:  # with no condition, only the kubelet's eviction has words (ADR 0044)
        parts.append(f"the kubelet evicted it: {e.message.strip()}")
    if e.container:
        parts.append(f"container {e.container}")
    if e.exit_code is not None:
        parts.append(f"exit code {e.exit_code}")
    if e.reason:
        parts.append(f"reason {e.reason}")
    if e.observed_by is Observer.NODE:
        parts.append("heard on its node")
    return parts
