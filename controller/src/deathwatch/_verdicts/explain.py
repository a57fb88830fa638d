"""What `deathwatch explain` says about one verdict: a pure function from the verdict and the
Events that name its pod to a document (the JSON of `-o json`) and its text rendering."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from deathwatch._api import verdict_document
from deathwatch.client import Verdict


def document(verdict: Verdict, events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The `-o json` document: the one each delivered event carries (verdict_document.py)."""
    built = verdict_document.document(verdict.namespace, verdict.pod, verdict.deathwatch,
                                      verdict.status, verdict.labels, events)  # fmt: skip
    doc: dict[str, Any] = msgspec.to_builtins(built)
    return doc


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
    for mark in doc.get("delivery") or ():
        said = f"{mark['outcome']} {mark['state']} (id {mark['id']}, sequence {mark['sequence']})"
        if mark.get("code"):
            said += f": {mark['code']} {mark.get('message') or ''}".rstrip()
        lines.append(f"  delivery:  {mark['sink']}: {said} at {mark['at']}")
    lines.append("  timeline:")
    lines.extend(f"    {t['at']}  {t['what']}" for t in doc["timeline"])
    lines.append("  events:" + ("" if doc["events"] else " none"))
    lines.extend(
        f"    {e['at']}  {e['type']:<7} {e['reason']:<22} {e['from']}: {e['message']}"
        for e in doc["events"]
    )
    return "\n".join(lines)
