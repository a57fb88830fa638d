"""The pure parts of `deathwatch.client` and `deathwatch explain`: which changes a caller is
handed (each transition once, across relists) and the explain document."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from deathwatch._api.resources import SandboxVerdictStatus
from deathwatch._verdicts import explain
from deathwatch.client import State, Verdict, _resync, _transition


def verdict(pod: str, state: str, uid: str = "u1", **status: Any) -> Verdict:
    body = {"state": state, "policy": "no-probe", "podUID": uid, "restartCounts": {},
            "readyDrops": 0, "flaps": 0, "falsePositive": False,
            "probeBlockedByFirewall": False, **status}  # fmt: skip
    typed = msgspec.convert(body, SandboxVerdictStatus)
    return Verdict("ns", pod, "1", "dw", typed.state, typed)


def test_each_transition_is_handed_over_once_and_a_new_pod_starts_over() -> None:
    seen: dict[tuple[str, str], tuple[str | None, State]] = {}
    first = _transition(seen, verdict("a", "Alive"))
    assert first is not None and first.previous is None
    assert _transition(seen, verdict("a", "Alive")) is None  # a resync, a label change
    moved = _transition(seen, verdict("a", "Dead"))
    assert moved is not None and moved.previous is State.ALIVE
    assert _transition(seen, verdict("a", "Dead")) is None
    again = _transition(seen, verdict("a", "Alive", uid="u2"))  # a new pod of that name
    assert again is not None and again.previous is None
    gone = _transition(seen, verdict("a", "Alive", uid="u2"), deleted=True)
    assert gone is not None and gone.deleted and gone.previous is State.ALIVE
    assert _transition(seen, verdict("a", "Alive", uid="u2"), deleted=True) is None


def test_a_relist_hands_over_only_what_changed_and_what_vanished() -> None:
    seen: dict[tuple[str, str], tuple[str | None, State]] = {}
    _resync(seen, [verdict("a", "Alive"), verdict("b", "Alive"), verdict("c", "Suspect")])
    changes = _resync(seen, [verdict("a", "Alive"), verdict("c", "Dead"), verdict("d", "Pending")])
    got = sorted((c.verdict.pod, c.verdict.state.value, c.deleted) for c in changes)
    assert got == [("b", "Alive", True), ("c", "Dead", False), ("d", "Pending", False)]
    assert (
        _resync(seen, [verdict("a", "Alive"), verdict("c", "Dead"), verdict("d", "Pending")]) == []
    )


def test_explain_orders_the_timeline_and_events_and_says_the_same_in_text() -> None:
    v = verdict("s", "Dead", cause="OOMKilled", container="agent", exitCode=137,
                lastReadyAt="2026-12-01T10:00:00Z", readyDropAt="2026-12-01T10:05:00Z",
                declaredAt="2026-12-01T10:05:00.2Z", node="n1",
                conditions=[{"type": "Shielded", "status": "True", "reason": "RuleInForce",
                             "message": "both rules"}])  # fmt: skip
    events = [
        {"type": "Warning", "reason": "SandboxDead", "message": "dead",
         "lastTimestamp": "2026-12-01T10:05:01Z", "source": {"component": "deathwatch"}},
        {"type": "Warning", "reason": "OOMKilling", "message": "oom",
         "lastTimestamp": "2026-12-01T10:04:59Z", "source": {"component": "kubelet"}},
    ]  # fmt: skip
    doc = explain.document(v, events)
    assert [t["what"] for t in doc["timeline"]] == ["Ready", "Ready dropped", "declared"]
    assert [e["reason"] for e in doc["events"]] == ["OOMKilling", "SandboxDead"]
    assert doc["evidence"]["exitCode"] == 137 and doc["shielded"]["reason"] == "RuleInForce"
    text = explain.text(doc)
    assert text.splitlines()[0] == "ns/s: Dead (OOMKilled)"
    assert "exitCode 137" in text and "True RuleInForce: both rules" in text


def test_explain_names_a_disruption_and_whose_doing_it_was() -> None:
    v = verdict("s", "Dead", cause="Drained", origin="Infrastructure",
                disruption={"reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting",
                            "since": "2026-12-01T10:05:00Z"},
                lastReadyAt="2026-12-01T10:00:00Z", readyDropAt="2026-12-01T10:05:00Z",
                declaredAt="2026-12-01T10:05:00.1Z")  # fmt: skip
    assert v.origin is not None and v.origin.value == "Infrastructure"
    assert v.disruption is not None and v.disruption.reason == "EvictionByEvictionAPI"
    doc = explain.document(v, [])
    assert (doc["cause"], doc["origin"]) == ("Drained", "Infrastructure")
    assert doc["disruption"] == {"reason": "EvictionByEvictionAPI",
                                 "message": "Eviction API: evicting",
                                 "since": "2026-12-01T10:05:00Z"}  # fmt: skip
    assert [t["what"] for t in doc["timeline"]] == [
        "Ready", "Ready dropped", "DisruptionTarget EvictionByEvictionAPI", "declared",
    ]  # fmt: skip
    text = explain.text(doc)
    assert text.splitlines()[0] == "ns/s: Dead (Drained), by Infrastructure"
    assert "disrupted: EvictionByEvictionAPI: Eviction API: evicting" in text


def test_a_delivered_events_data_decodes_to_the_explain_document_typed() -> None:
    """What a receiver gets in an event's data is what `explain -o json` prints, and
    `verdict_document` types it; a wrong field is one ValueError naming it."""
    from deathwatch.client import State, VerdictDocument, verdict_document

    v = verdict("s", "Dead", cause="OOMKilled", exitCode=137, declaredAt="2026-12-01T10:05:00Z")
    doc = explain.document(v, [])
    typed = verdict_document(json.dumps(doc))
    assert isinstance(typed, VerdictDocument) and typed.state is State.DEAD
    assert (typed.cause, typed.evidence.exit_code, typed.pod) == ("OOMKilled", 137, "s")
    assert verdict_document(doc) == typed
    with pytest.raises(ValueError, match=r"not a verdict document: .*\$\.state"):
        verdict_document({**doc, "state": "Zombie"})


def test_the_old_name_of_never_reached_still_imports() -> None:
    """`Unreachable` was renamed `NeverReached` (it clashed with the API client's error of
    that name); code that catches the old name keeps working."""
    from deathwatch import client

    assert client.Unreachable is client.NeverReached
    assert "NeverReached" in client.__all__
