"""One record per sandbox pod: everything the controller knows of it, in one place, by uid.

A `Record` holds the engine's memory of the pod (its Track, the settings it is judged with,
its latest view while Suspect: `_engine.memory`), its DeathWatch's key, its node and
addresses, its shield, what its DeathWatch's status counts for it, whether its policy is in
a failing spell, whether its verdict exists, when its pod was found gone, the newest
resourceVersion of it judged, the agent-sandbox Sandbox that owns it, how many times its
verdict changed state, what each sink was last sent of it, and the kubelet's word that it
evicts the pod (its Evicted Event). `Records` keeps
them and the few indexes into them (by name, by agent-sandbox Sandbox, the ended ones, which
listing showed each); `Records.remove` is the one place a record is forgotten, indexes and
all (kopf's ResourceMemory, as this controller needs it). State and bookkeeping only: no I/O,
no decisions. The writer's state of the record's verdict is the writer's, per API object
(it outlives the record: a retired verdict is still to be deleted, a new pod of the same name
writes the same object); a record names that object by its key.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime

import msgspec

from deathwatch._api.resources import SV_PLURAL, DeathWatchKey, DeliveryMark
from deathwatch._engine.engine import Track
from deathwatch._engine.memory import Memory
from deathwatch._engine.podview import PodView
from deathwatch._operator.reporting.decisions import Facts
from deathwatch._operator.reporting.shield import Shield

_NO_MARKS: dict[str, DeliveryMark] = {}  # shared, never mutated: most records have none
RECENTLY_DELETED = 600.0  # seconds a uid done with is remembered (adoption ghosts, echoes)


class Record:
    """One sandbox pod, as the controller knows it."""

    __slots__ = (
        "addressed_at", "agent_sandbox", "counted", "deathwatch", "deleted_at", "eviction",
        "failing", "ips",
        "judged_for", "labels", "listing", "marks", "memory", "name", "namespace", "node",
        "persisted", "shield", "shield_since", "transitions", "uid", "version",
    )  # fmt: skip

    def __init__(self, uid: str, namespace: str, name: str, deathwatch: DeathWatchKey,
                 listing: int = -1) -> None:  # fmt: skip
        self.uid, self.namespace, self.name = uid, namespace, name
        self.deathwatch = deathwatch
        self.memory: Memory | None = None  # the engine's: None until first judged or restored
        self.node: str | None = None
        self.ips: tuple[str, ...] = ()
        # its pod's labels (the firewall agent's selector is checked against them: ADR 0029),
        # the mapping its latest view carries, shared; and when its addresses were first
        # seen (the coverage clock: its agent's inbound rule is checked for them after that)
        self.labels: Mapping[str, str] | None = None
        self.addressed_at: float | None = None
        self.shield: Shield | None = None  # as last published (None: no firewall to judge by)
        self.shield_since: datetime | None = None
        # what the shield was judged from (node, addresses, agent ports, labels): a pod event
        # that changes none of these leaves it to the periodic per-node re-judging
        self.judged_for: (
            tuple[str | None, tuple[str, ...], frozenset[int], Mapping[str, str] | None] | None
        ) = None
        self.listing = listing  # the latest pod listing that showed it (-1: none; restored)
        self.deleted_at: datetime | None = None  # when we learned the pod is gone (retention)
        self.persisted = False  # a SandboxVerdict exists (or is being created) for it
        self.counted: Facts | None = None  # what its DeathWatch's status counts for it
        self.failing = False  # its policy failed the last time: a spell, logged once
        self.agent_sandbox: str | None = None  # the agent-sandbox Sandbox that owns its pod
        self.version = 0  # the resourceVersion of the newest state of its pod judged (0: none)
        self.transitions = 0  # how many times its verdict's state changed (events' sequence)
        # per sink, the last event of it sent to an end, as its verdict says (delivery/)
        self.marks: dict[str, DeliveryMark] = _NO_MARKS
        # the kubelet's Evicted Event of its pod, the message: what the pod's own status
        # withholds until its containers have stopped (ADR 0044)
        self.eviction: str | None = None

    @property
    def track(self) -> Track | None:
        return self.memory.track if self.memory is not None else None

    def told(self, pod: PodView) -> PodView:
        """The pod as its status shows it, with the kubelet's Evicted Event beside it."""
        if self.eviction is None or pod.eviction_notice is not None:
            return pod
        return msgspec.structs.replace(pod, eviction_notice=self.eviction)

    @property
    def verdict(self) -> tuple[str, str, str]:
        """Its SandboxVerdict's key for the writer: named after the pod, in its namespace."""
        return (SV_PLURAL, self.namespace, self.name)

    def __repr__(self) -> str:
        return f"Record({self.namespace}/{self.name} {self.uid})"


class Records:
    def __init__(self) -> None:
        self._by_uid: dict[str, Record] = {}
        self._by_name: dict[tuple[str, str], str] = {}  # (namespace, pod name) -> uid
        self._ended: set[str] = set()  # deleted and judged: waiting out their retention
        self._done: dict[str, float] = {}  # uid -> monotonic time it was done with
        self._listings = 0  # listings begun, every scope together: each has its own number
        self._current: dict[str | None, int] = {}  # scope -> its latest listing's number
        # (namespace, agent-sandbox Sandbox) -> its pods' uids: one live, and the ended ones
        # waiting out their retention (a resumed Sandbox has a new pod, with its own verdict)
        self._of_agent_sandbox: dict[tuple[str, str], set[str]] = {}
        self.failing = 0  # records in a policy-failing spell (for /readyz)

    def __len__(self) -> int:
        return len(self._by_uid)

    def __iter__(self) -> Iterator[Record]:
        return iter(self._by_uid.values())

    def get(self, uid: str) -> Record | None:
        return self._by_uid.get(uid)

    def named(self, namespace: str, name: str) -> Record | None:
        uid = self._by_name.get((namespace, name))
        return None if uid is None else self._by_uid.get(uid)

    def add(self, uid: str, namespace: str, name: str, deathwatch: DeathWatchKey) -> Record:
        """Track a pod (or a verdict restored at start, before any listing: the first listing
        then says whether its pod still exists). An older pod of the same name must have been
        removed first (`named`): the caller forgets its record."""
        # something just showed it exists: it counts as seen by the listing under way (one
        # that began before the pod was made would otherwise call it gone)
        record = Record(uid, namespace, name, deathwatch, listing=self._of(namespace))
        self._by_uid[uid] = record
        self._by_name[(namespace, name)] = uid
        return record

    def add_pod(self, pod: PodView, deathwatch: DeathWatchKey, listed: bool,
                deleted_at: datetime | None = None) -> Record:  # fmt: skip
        record = self.add(pod.uid, pod.namespace, pod.name, deathwatch)
        self._update(record, pod, listed, deleted_at)
        return record

    def remove(self, record: Record) -> None:
        """Forget the record: the one place, every index with it."""
        uid = record.uid
        if self._by_uid.get(uid) is record:
            del self._by_uid[uid]
        if self._by_name.get((record.namespace, record.name)) == uid:
            del self._by_name[(record.namespace, record.name)]
        self._ended.discard(uid)
        if record.failing:
            record.failing = False
            self.failing -= 1
        if record.agent_sandbox is not None:
            key = (record.namespace, record.agent_sandbox)
            uids = self._of_agent_sandbox.get(key)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self._of_agent_sandbox[key]

    def _of(self, namespace: str) -> int:
        current = self._current.get(namespace)
        return self._current.get(None, -1) if current is None else current

    def newer(self, uid: str, version: str) -> bool:
        """Whether this state of the pod (its resourceVersion) is not older than every one
        judged so far; it is noted. The same state again (a relisting shows it) passes: a
        listing must still count it, and judging it twice changes nothing. Versions of one
        object are comparable integers (KEP-5504); one that is not a number (another
        storage) is always taken."""
        record = self._by_uid.get(uid)
        if record is None or not version.isdigit():
            return True
        number = int(version)
        if number < record.version:
            return False
        record.version = number
        return True

    def observe(self, pod: PodView, listed: bool, deleted_at: datetime | None = None
                ) -> tuple[Record, bool] | None:  # fmt: skip
        """A pod event or a listing showed a pod as it is now (`deleted_at`: its DELETED
        event). Its record, and whether anything a verdict says of it changed (its node, its
        addresses, its deletion); None if it is not tracked."""
        record = self._by_uid.get(pod.uid)
        if record is None:
            return None
        return record, self._update(record, pod, listed, deleted_at)

    def set_failing(self, record: Record, failing: bool) -> bool:
        """Its policy's spell begins (True) or ends (False); whether that is news."""
        if record.failing == failing:
            return False
        record.failing = failing
        self.failing += 1 if failing else -1
        return True

    def link(self, record: Record, agent_sandbox: str | None) -> None:
        """Its pod belongs to this agent-sandbox Sandbox (a pod's owner never changes)."""
        if agent_sandbox is None or record.agent_sandbox == agent_sandbox:
            return
        record.agent_sandbox = agent_sandbox
        self._of_agent_sandbox.setdefault((record.namespace, agent_sandbox), set()).add(record.uid)

    def of_agent_sandbox(self, namespace: str, name: str) -> list[Record]:
        uids = self._of_agent_sandbox.get((namespace, name), ())
        return [self._by_uid[uid] for uid in uids if uid in self._by_uid]

    def _update(self, record: Record, pod: PodView, listed: bool,
                deleted_at: datetime | None) -> bool:  # fmt: skip
        self.link(record, pod.sandbox)
        before = (record.node, record.ips, record.deleted_at)
        record.node = pod.node_name or record.node
        if pod.pod_ips and pod.pod_ips != record.ips:
            record.ips, record.addressed_at = pod.pod_ips, None  # new addresses: seen afresh
        record.labels = pod.labels
        if listed:
            record.listing = self._of(record.namespace)
        if deleted_at is not None:
            self.ended(record, deleted_at)
        return (record.node, record.ips, record.deleted_at) != before

    def of_deathwatch(self, key: DeathWatchKey) -> list[Record]:
        return [r for r in self._by_uid.values() if r.deathwatch == key]

    def on_nodes(self, nodes: Iterable[str | None]) -> list[Record]:
        wanted = set(nodes)
        return [r for r in self._by_uid.values() if r.node in wanted]

    # --- deletions, listings, retention ----------------------------------------------------

    def done_with(self, uid: str) -> None:
        """A pod not to judge again for a while: a DELETED event for one we do not track (a
        listing taken before it, a new DeathWatch adopting its pods, must not bring it back),
        or one let go with a final verdict it never ran to earn (the kubelet's later reports
        of its deletion must not make it a new pod, judged and counted again)."""
        now = time.monotonic()
        self._done[uid] = now
        if len(self._done) > 10_000:  # prune by age; bounded whatever the churn
            self._done = {u: t for u, t in self._done.items() if now - t < RECENTLY_DELETED}

    def is_done_with(self, uid: str) -> bool:
        seen = self._done.get(uid)
        return seen is not None and time.monotonic() - seen < RECENTLY_DELETED

    def ended(self, record: Record, at: datetime) -> None:
        """Its pod is gone (and its verdict final): the retention clock runs from `at`."""
        record.deleted_at = record.deleted_at or at
        self._ended.add(record.uid)

    def ended_ones(self) -> list[Record]:
        """The records whose pods are gone: each verdict waits out its retention."""
        return [self._by_uid[uid] for uid in self._ended]

    def begin_listing(self, scope: str | None) -> None:
        """A listing of `scope` (a namespace; None: all) begins: the pods it shows are marked
        with its number (listings of different scopes may run at once)."""
        self._listings += 1
        self._current[scope] = self._listings

    def unlisted(self, scope: str | None) -> list[Record]:
        """After a complete listing of `scope`: the records it did not show. Their pods are
        gone: deleted while the watch was down or could not resume."""
        current = self._current.get(scope, -1)
        return [
            r
            for r in self._by_uid.values()
            if r.listing != current
            and (scope is None or r.namespace == scope)
            and r.deleted_at is None
        ]
