"""The sandboxes being tracked: what the controller knows of each besides the engine's Track
(its DeathWatch, node and addresses, shield, what its DeathWatch's status counts for it),
who holds each name, which were seen by the latest listing, and when each ended verdict
is due to be retired. State and bookkeeping only: no I/O, no decisions.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from deathwatch._engine.podview import PodView
from deathwatch._operator.decisions import Facts
from deathwatch._operator.shield import Shield

Key = tuple[str, str]  # (namespace, DeathWatch name)
RECENTLY_DELETED = 600.0  # seconds a deleted pod's uid is remembered (adoption ghosts)


@dataclass(slots=True)
class Sandbox:
    uid: str
    namespace: str
    name: str
    watch: Key
    node: str | None = None
    ips: tuple[str, ...] = ()
    shield: Shield | None = None  # as last published (None: no firewall to judge against)
    shield_since: datetime | None = None
    # what the shield was judged from (node, addresses, agent ports): a pod event that changes
    # none of these leaves it to the periodic per-node re-judging
    judged_for: tuple[str | None, tuple[str, ...], frozenset[int]] | None = None
    listing: int = -1  # the latest pod listing that showed it (-1: none; restored)
    deleted_at: datetime | None = None  # when we learned the pod is gone (retention clock)
    persisted: bool = False  # a SandboxVerdict exists (or is being created) for it
    counted: Facts | None = None  # what its DeathWatch's status counts for it (summary.py)
    agent_sandbox: str | None = None  # the agent-sandbox Sandbox that owns its pod
    version: int = 0  # the resourceVersion of the newest state of its pod judged (0: none)


class Sandboxes:
    def __init__(self) -> None:
        self._by_uid: dict[str, Sandbox] = {}
        self._by_name: dict[tuple[str, str], str] = {}  # (namespace, pod name) -> uid
        self._ended: set[str] = set()  # deleted and judged: waiting out their retention
        self._deleted: dict[str, float] = {}  # uid -> monotonic time a DELETED was seen
        self._listings = 0  # listings begun, every scope together: each has its own number
        self._current: dict[str | None, int] = {}  # scope -> its latest listing's number
        # (namespace, agent-sandbox Sandbox) -> its pods' uids: one live, and the ended ones
        # waiting out their retention (a resumed Sandbox has a new pod, with its own verdict)
        self._of_agent_sandbox: dict[tuple[str, str], set[str]] = {}

    def __len__(self) -> int:
        return len(self._by_uid)

    def __iter__(self) -> Iterator[Sandbox]:
        return iter(self._by_uid.values())

    def get(self, uid: str) -> Sandbox | None:
        return self._by_uid.get(uid)

    def named(self, namespace: str, name: str) -> Sandbox | None:
        uid = self._by_name.get((namespace, name))
        return None if uid is None else self._by_uid.get(uid)

    def add(self, uid: str, namespace: str, name: str, watch: Key) -> Sandbox:
        """Track a pod (or a verdict restored at start, before any listing: the first listing
        then says whether its pod still exists). An older pod of the same name must have been
        removed first (`named`): the caller forgets its verdict."""
        # something just showed it exists: it counts as seen by the listing under way (one
        # that began before the pod was made would otherwise call it gone)
        sandbox = Sandbox(uid, namespace, name, watch, listing=self._of(namespace))
        self._by_uid[uid] = sandbox
        self._by_name[(namespace, name)] = uid
        return sandbox

    def add_pod(self, pod: PodView, watch: Key, listed: bool,
                deleted_at: datetime | None = None) -> Sandbox:  # fmt: skip
        sandbox = self.add(pod.uid, pod.namespace, pod.name, watch)
        self._update(sandbox, pod, listed, deleted_at)
        return sandbox

    def _of(self, namespace: str) -> int:
        current = self._current.get(namespace)
        return self._current.get(None, -1) if current is None else current

    def observe(self, pod: PodView, listed: bool, deleted_at: datetime | None = None
                ) -> tuple[Sandbox, bool] | None:  # fmt: skip
        """A pod event or a listing showed a pod as it is now (`deleted_at`: its DELETED
        event). Its record, and whether anything a verdict says of it changed (its node, its
        addresses, its deletion); None if it is not tracked."""
        sandbox = self._by_uid.get(pod.uid)
        if sandbox is None:
            return None
        return sandbox, self._update(sandbox, pod, listed, deleted_at)

    def newer(self, uid: str, version: str) -> bool:
        """Whether this state of the pod (its resourceVersion) is not older than every one
        judged so far; it is noted. The same state again (a relisting shows it) passes: a
        listing must still count it, and judging it twice changes nothing. Versions of one
        object are comparable integers (KEP-5504); one that is not a number (another
        storage) is always taken."""
        sandbox = self._by_uid.get(uid)
        if sandbox is None or not version.isdigit():
            return True
        number = int(version)
        if number < sandbox.version:
            return False
        sandbox.version = number
        return True

    def link(self, sandbox: Sandbox, agent_sandbox: str | None) -> None:
        """Its pod belongs to this agent-sandbox Sandbox (a pod's owner never changes)."""
        if agent_sandbox is None or sandbox.agent_sandbox == agent_sandbox:
            return
        sandbox.agent_sandbox = agent_sandbox
        self._of_agent_sandbox.setdefault((sandbox.namespace, agent_sandbox), set()).add(
            sandbox.uid
        )

    def of_agent_sandbox(self, namespace: str, name: str) -> list[Sandbox]:
        uids = self._of_agent_sandbox.get((namespace, name), ())
        return [self._by_uid[uid] for uid in uids if uid in self._by_uid]

    def _update(self, sandbox: Sandbox, pod: PodView, listed: bool,
                deleted_at: datetime | None) -> bool:  # fmt: skip
        self.link(sandbox, pod.sandbox)
        before = (sandbox.node, sandbox.ips, sandbox.deleted_at)
        sandbox.node = pod.node_name or sandbox.node
        sandbox.ips = pod.pod_ips or sandbox.ips
        if listed:
            sandbox.listing = self._of(sandbox.namespace)
        if deleted_at is not None:
            self.ended(sandbox, deleted_at)
        return (sandbox.node, sandbox.ips, sandbox.deleted_at) != before

    def remove(self, uid: str) -> Sandbox | None:
        sandbox = self._by_uid.pop(uid, None)
        if sandbox is not None and self._by_name.get((sandbox.namespace, sandbox.name)) == uid:
            del self._by_name[(sandbox.namespace, sandbox.name)]
        self._ended.discard(uid)
        if sandbox is not None and sandbox.agent_sandbox is not None:
            key = (sandbox.namespace, sandbox.agent_sandbox)
            uids = self._of_agent_sandbox.get(key)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self._of_agent_sandbox[key]
        return sandbox

    def of_watch(self, key: Key) -> list[Sandbox]:
        return [s for s in self._by_uid.values() if s.watch == key]

    def on_nodes(self, nodes: Iterable[str | None]) -> list[Sandbox]:
        wanted = set(nodes)
        return [s for s in self._by_uid.values() if s.node in wanted]

    # --- deletions, listings, retention ----------------------------------------------------

    def deleted(self, uid: str) -> None:
        """A DELETED event for a pod we do not track: remembered for a while, so a listing
        taken before it (a new DeathWatch adopting its pods) does not bring it back."""
        now = time.monotonic()
        self._deleted[uid] = now
        if len(self._deleted) > 10_000:  # prune by age; bounded whatever the churn
            self._deleted = {u: t for u, t in self._deleted.items() if now - t < RECENTLY_DELETED}

    def recently_deleted(self, uid: str) -> bool:
        seen = self._deleted.get(uid)
        return seen is not None and time.monotonic() - seen < RECENTLY_DELETED

    def ended(self, sandbox: Sandbox, at: datetime) -> None:
        """Its pod is gone (and its verdict final): the retention clock runs from `at`."""
        sandbox.deleted_at = sandbox.deleted_at or at
        self._ended.add(sandbox.uid)

    def ended_ones(self) -> list[Sandbox]:
        """The sandboxes whose pods are gone: each verdict waits out its retention."""
        return [self._by_uid[uid] for uid in self._ended]

    def begin_listing(self, scope: str | None) -> None:
        """A listing of `scope` (a namespace; None: all) begins: the pods it shows are marked
        with its number (listings of different scopes may run at once)."""
        self._listings += 1
        self._current[scope] = self._listings

    def unlisted(self, scope: str | None) -> list[Sandbox]:
        """After a complete listing of `scope`: the sandboxes it did not show. Their pods are
        gone: deleted while the watch was down or could not resume."""
        current = self._current.get(scope, -1)
        return [
            s
            for s in self._by_uid.values()
            if s.listing != current
            and (scope is None or s.namespace == scope)
            and s.deleted_at is None
        ]
