"""What `deathwatch explain` says about one verdict: a pure function from the verdict and the
Events that name its pod to a document (the JSON of `-o json`) and its text rendering."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import msgspec

from deathwatch.client import Verdict

_TIMELINE = (
    ("Ready", "last_ready_at"),
    ("Ready dropped", "ready_drop_at"),
    ("deadline", "deadline"),
    ("declared", "declared_at"),
    ("pod deleted", "pod_deleted_at"),
)


def _time(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def document(verdict: Verdict, events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    s = verdict.status
    conditions = {
        c.type: {"status": c.status, "reason": c.reason, "message": c.message,
                 "since": _time(c.last_transition_time)}
        for c in (s.conditions if s else [])
    }  # fmt: skip
    marks = [(getattr(s, attr), what) for what, attr in _TIMELINE if s and getattr(s, attr)]
    if s and s.disruption and s.disruption.since:
        marks.append((s.disruption.since, f"DisruptionTarget {s.disruption.reason}"))
    # by time, not by text: "10:05:00.2Z" sorts before "10:05:00Z" as a string
    moments = sorted(marks, key=lambda m: m[0])
    timeline = [{"at": _time(at), "what": what} for at, what in moments]
    alive = conditions.get("Alive", {})
    return {
        "namespace": verdict.namespace,
        "pod": verdict.pod,
        "podUID": verdict.pod_uid,
        "deathWatch": verdict.deathwatch,
        "state": verdict.state.value,
        "cause": verdict.cause.value if verdict.cause else None,
        "origin": verdict.origin.value if verdict.origin else None,
        "disruption": msgspec.to_builtins(s.disruption) if s and s.disruption else None,
        "policy": s.policy if s else None,
        "sandbox": msgspec.to_builtins(s.sandbox) if s and s.sandbox else None,
        "why": alive.get("message"),
        "evidence": {
            "container": s.container if s else None,
            "exitCode": s.exit_code if s else None,
            "reason": s.reason if s else None,
            "restartCount": s.restart_count if s else None,
            "node": s.node if s else None,
            "readyDrops": s.ready_drops if s else 0,
            "flaps": s.flaps if s else 0,
        },
        "timeline": timeline,
        "shielded": conditions.get("Shielded"),
        "policyError": conditions.get("PolicyError"),
        "probeBlockedByFirewall": conditions.get("ProbeBlockedByFirewall"),
        "labels": dict(verdict.labels),
        "events": [_event(e) for e in sorted(events, key=_event_time)],
    }


def _event_time(e: Mapping[str, Any]) -> str:
    return str(e.get("eventTime") or e.get("lastTimestamp") or e.get("firstTimestamp") or "")


def _event(e: Mapping[str, Any]) -> dict[str, Any]:
    source = e.get("reportingComponent") or (e.get("source") or {}).get("component") or ""
    return {
        "at": _event_time(e) or None,
        "type": e.get("type"),
        "reason": e.get("reason"),
        "from": source,
        "object": (e.get("involvedObject") or {}).get("kind"),
        "count": e.get("count") or 1,
        "message": e.get("message"),
    }


def text(doc: Mapping[str, Any]) -> str:
    """The document for a person: the verdict first, then why, when, the shield, Events."""
    lines = [f"{doc['namespace']}/{doc['pod']}: {doc['state']}"
             + (f" ({doc['cause']})" if doc["cause"] else "")
             + (f", by {doc['origin']}" if doc["origin"] else "")]  # fmt: skip
    lines.append(f"  policy:    {doc['policy'] or '-'}   deathwatch: {doc['deathWatch'] or '-'}")
    if doc["sandbox"]:
        sb = doc["sandbox"]
        named = (("name", "Sandbox"), ("claim", "claim"), ("template", "template"),
                 ("warmPool", "warm pool"))  # fmt: skip
        lines.append("  sandbox:   " + "   ".join(f"{label} {sb[k]}" for k, label in named
                                                  if sb.get(k)))  # fmt: skip
    if doc["why"]:
        lines.append(f"  why:       {doc['why']}")
    if doc["disruption"]:
        d = doc["disruption"]
        said = f"{d['reason']}: {d['message']}" if d.get("message") else d["reason"]
        lines.append(f"  disrupted: {said}" + (f" (since {d['since']})" if d.get("since") else ""))
    ev = doc["evidence"]
    details = [
        f"{k} {ev[k]}" for k in ("container", "exitCode", "reason", "node") if ev[k] is not None
    ]
    if details:
        lines.append(f"  evidence:  {', '.join(details)}")
    lines.append(f"  flaps:     {ev['flaps']}   Ready drops: {ev['readyDrops']}")
    for key, label in (("policyError", "policy error"), ("probeBlockedByFirewall", "probe")):
        if doc[key]:
            lines.append(f"  {label}: {doc[key]['message']}")
    shield = doc["shielded"]
    unknown = "unknown (no firewall coverage reported)"
    said = f"{shield['status']} {shield['reason']}: {shield['message']}" if shield else unknown
    lines.append(f"  shielded:  {said}")
    lines.append("  timeline:")
    lines.extend(f"    {t['at']}  {t['what']}" for t in doc["timeline"])
    lines.append("  events:" + ("" if doc["events"] else " none"))
    lines.extend(
        f"    {e['at']}  {e['type']:<7} {e['reason']:<22} {e['from']}: {e['message']}"
        for e in doc["events"]
    )
    return "\n".join(lines)
