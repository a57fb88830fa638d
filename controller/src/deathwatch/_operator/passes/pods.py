"""The pod pass: a pod's observation, one way through (docs/architecture.md draws it):

    pod reflector ─ PodView ─▶ on_pod
        Records        its record: by uid, the newest version judged, node and addresses
        DeathWatches   which DeathWatch judges it (compiled once per generation: `Rules`)
        memory         the engine: the next Track and what happened (signals)
        Core.settle    shield, decisions, counts, the verdict's document, the writer

Also the pod inputs that are not events: a new DeathWatch's pods listed and adopted
(`adopt`), a listing's missing pods (`listed`: gone while nobody watched), a Suspect window
closing on the clock (`expire`). Free functions on the Core; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

import structlog

from deathwatch._api.objects import EventType
from deathwatch._api.resources import DeathWatchKey
from deathwatch._api.rules import Rules
from deathwatch._engine import memory
from deathwatch._engine.podview import PodView
from deathwatch._engine.verdict import Cause
from deathwatch._operator.memory.core import Core
from deathwatch._operator.memory.deathwatches import Revision
from deathwatch._operator.memory.records import Record

log = structlog.get_logger("deathwatch.controller")


def on_pod(core: Core, kind: EventType, pod: PodView, received: float | None = None,
           version: str = "") -> None:  # fmt: skip
    """A pod event or a listed pod: one pass, from the engine to the writer. `version`: its
    resourceVersion; a state older than one already judged is not judged again (a watch
    event still in the stream behind a newer listing, a DeathWatch's adoption)."""
    if not core.mine(pod.uid, "pods"):
        return
    listed = kind is EventType.LISTED
    deleted_at = core.clock() if kind is EventType.DELETED else None
    if not core.records.newer(pod.uid, version):
        return
    seen = core.records.observe(pod, listed, deleted_at)
    if seen is None:
        if kind is EventType.DELETED:
            core.records.deleted(pod.uid)
            return
        rules = core.deathwatches.owner(pod)
        if rules is None:
            return  # not a sandbox (or its DeathWatch is gone or invalid)
        record, changed = track(core, pod, rules, listed, deleted_at), True
        core.records.newer(pod.uid, version)  # noted: its older states come to nothing
    else:
        record, changed = seen
        found = core.deathwatches.get(record.deathwatch)
        if found is None:
            return  # its DeathWatch is invalid for now: judged again once it is valid
        rules = found
    step(core, kind, pod, record, rules, changed, received)


def track(core: Core, pod: PodView, rules: Rules, listed: bool,
          deleted_at: datetime | None = None) -> Record:  # fmt: skip
    """A record for a pod seen for the first time."""
    older = core.records.named(pod.namespace, pod.name)
    if older is not None and older.uid != pod.uid:
        core.forget(older)  # a new pod took the name: its verdict replaces the old one's
    return core.records.add_pod(pod, rules.key, listed, deleted_at)


def deletion_cause(core: Core, record: Record, pod: PodView, deleted: bool) -> Cause:
    """What the pod's deletion means: the pod never says why it was deleted; its Sandbox
    does (suspended, expired)."""
    if record.agent_sandbox is not None and (deleted or pod.deletion_requested_at is not None):
        return core.agent_sandboxes.fate(
            pod.namespace, record.agent_sandbox, pod.deletion_requested_at or core.clock()
        )
    return Cause.DELETED


def step(core: Core, kind: EventType, pod: PodView, record: Record, rules: Rules,
         changed: bool, received: float | None) -> None:  # fmt: skip
    """The engine's step for this observation, and its tail."""
    now = core.clock()
    deletion = deletion_cause(core, record, pod, kind is EventType.DELETED)
    if kind is EventType.DELETED:
        if record.memory is None:
            return
        result = memory.remove(record.memory, now, pod, core.policies, core.deadlines, deletion)
    else:
        record.memory, result = memory.observe(
            record.memory, pod, now, core.policies, rules.policy, rules.settings,
            core.deadlines, deletion,
        )  # fmt: skip
    if not result.changed and not result.signals and not changed:
        return  # nothing it says changed (a heartbeat of the kubelet): nothing to do
    core.settle(result, record, rules, received)


def adopt(core: Core, key: DeathWatchKey, revision: Revision, pods: Iterable[PodView],
          versions: Mapping[str, str] | None = None) -> int:  # fmt: skip
    """Pods of a page just listed for the DeathWatch `key` at `revision`: each one it selects
    that no event has brought yet. Returns how many; 0 when the DeathWatch has changed or
    gone meanwhile (the newer revision's own listing adopts them). `versions`: each pod's
    resourceVersion by uid, so that an older event of it still in the watch stream is not
    judged after this newer state."""
    rules = core.deathwatches.current(key, revision)
    if rules is None:
        return 0
    adopted = 0
    for pod in pods:
        if not core.mine(pod.uid, "pods"):
            continue
        if core.records.get(pod.uid) is not None or core.records.recently_deleted(pod.uid):
            continue  # an event brought it already, or its deletion came after this list
        owner = core.deathwatches.owner(pod)
        if owner is None or owner.key != key:
            continue
        record = track(core, pod, rules, listed=False)
        core.records.newer(pod.uid, (versions or {}).get(pod.uid, ""))
        step(core, EventType.LISTED, pod, record, rules, True, None)
        adopted += 1
    return adopted


# --- listings (the pod reflector) -----------------------------------------------------------


def listing(core: Core, scope: str | None) -> None:
    core.records.begin_listing(scope)


def listed(core: Core, scope: str | None) -> None:
    """A complete listing did not show these: deleted while nobody watched. A live one is
    Gone (Unobserved): how it ended is unknown; an ended one's retention starts."""
    now = core.clock()
    for record in core.records.unlisted(scope):
        gone(core, record, now)


def gone(core: Core, record: Record, now: datetime | None = None) -> None:
    """A pod found absent from the API."""
    now = now or core.clock()
    core.records.ended(record, now)
    rules = core.deathwatches.get(record.deathwatch)
    if record.memory is None or rules is None:
        return
    result = memory.remove(record.memory, now, None, core.policies, core.deadlines)
    core.settle(result, record, rules)


# --- Suspect windows on the clock -----------------------------------------------------------


def _current(core: Core, deadline: datetime, uid: str) -> bool:
    record = core.records.get(uid)
    return memory.is_current(record.memory if record else None, deadline)


def next_deadline(core: Core) -> datetime | None:
    """When the next Suspect window closes (None: none is open)."""
    return core.deadlines.next(lambda deadline, uid: _current(core, deadline, uid))


def expire(core: Core) -> None:
    """Judge every Suspect whose window has closed. One that fails (a bug: a policy's error
    is contained by the engine) is reported and the others are still judged; its next pod
    event judges it."""
    now = core.clock()
    due = core.deadlines.take(lambda deadline: deadline <= now,
                              lambda deadline, uid: _current(core, deadline, uid))  # fmt: skip
    for _, uid in due:
        record = core.records.get(uid)
        rules = core.deathwatches.get(record.deathwatch) if record else None
        if record is None or record.memory is None or rules is None:
            continue
        try:
            result = memory.expire(record.memory, now, core.policies, core.deadlines)
            core.settle(result, record, rules)
        except Exception as exc:
            core.metrics.handler_errors.labels("expire").inc()
            log.error("a Suspect window could not be judged; its next pod event judges it",
                      uid=uid, namespace=record.namespace, pod=record.name,
                      exc_info=exc)  # fmt: skip
