"""What owns the verdicts, on their own watches: DeathWatches (kopf's handler: compiled into
`Rules`, a deleted one forgetting its sandboxes, a sharded one's other parts kept for shard 0's
sums) and agent-sandbox Sandboxes (what their pods' verdicts name). Free functions on the
Core; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from deathwatch._operator.agent_sandboxes import SandboxObject
from deathwatch._operator.core import Core
from deathwatch._operator.deathwatches import Change
from deathwatch._operator.reflector import EventType
from deathwatch._operator.resources import DW_PLURAL, DeathWatchKey, ShardPart


def on_deathwatch(core: Core, event_type: str | None, body: Mapping[str, Any]) -> Change | None:
    """A DeathWatch event. Returns the change when its pods must be listed and adopted (it is
    new or selects differently: no pod event will tell of the pods it now selects, and the
    controller keeps no copy of pods that are not sandboxes)."""
    meta = body.get("metadata") or {}
    key = (meta.get("namespace") or "default", meta.get("name") or "")
    if event_type == "DELETED" or meta.get("deletionTimestamp"):
        drop_deathwatch(core, key)
        return None
    status = body.get("status")
    if core.shards.sharded:  # sharded: parts applied, not replaced (no term to compare)
        keep_parts(core, key, status)
    else:
        core.writer.observed(DW_PLURAL, *key, status if isinstance(status, dict) else {},
                             str(meta.get("resourceVersion") or ""))  # fmt: skip
    change = core.deathwatches.update(body)
    if change is None:
        return None
    if change.rules is not None:
        # restored records wait for their DeathWatch's settings (their window multiplier,
        # their agent ports): from now on they are judged with them
        for record in core.records.of_deathwatch(key):
            if record.memory is not None:
                record.memory.settings = change.rules.settings
    return change if change.rules is not None and change.select else None


def keep_parts(core: Core, key: DeathWatchKey, status: Any) -> None:
    """The other shards' parts of a DeathWatch's status, as they wrote them (shard 0 sums
    them)."""
    try:
        parts = msgspec.convert((status or {}).get("shards") or [], list[ShardPart])
    except (msgspec.ValidationError, AttributeError):
        return
    index = core.shards.spec.index
    core.shards.parts[key] = {p.shard: p for p in parts if p.shard != index}


def drop_deathwatch(core: Core, key: DeathWatchKey) -> None:
    """The DeathWatch is gone: its verdicts go with it (ownerReferences), so does the
    controller's memory of them."""
    if not core.deathwatches.remove(key):
        return
    for record in core.records.of_deathwatch(key):
        core.forget(record)
        core.writer.forget(*record.verdict)
    core.summaries.drop(key)
    core.writer.forget(DW_PLURAL, *key)


def on_agent_sandbox(core: Core, kind: EventType, obj: SandboxObject) -> None:
    """A Sandbox as its watch shows it. When what its verdicts name changes (a claim adopted
    it from its warm pool), each of its pods' verdicts says so: same verdict, same pod uid,
    and now its claim."""
    if kind is EventType.DELETED:
        core.agent_sandboxes.remove(obj.namespace, obj.name)
        return
    if not core.agent_sandboxes.update(obj):
        return
    for record in core.records.of_agent_sandbox(obj.namespace, obj.name):
        track = record.track
        rules = core.deathwatches.get(record.deathwatch)
        if track is not None and rules is not None and record.persisted:
            core.writer.want(core.verdict(track, record, rules))
