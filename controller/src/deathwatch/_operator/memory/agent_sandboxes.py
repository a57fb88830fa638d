"""The agent-sandbox Sandboxes (agents.x-k8s.io/v1beta1) the controller has seen: of each,
just what a verdict needs. Which SandboxClaim, SandboxTemplate and SandboxWarmPool it belongs
to (named on its pods' verdicts), and what its pod's deletion means: the Sandbox suspended
(Suspended), past its shutdownTime (Expired), or deleted or its pod deleted under it
(Deleted). State only: no I/O, no clock (the caller passes the time a deletion was asked).

Everything is read from the Sandbox itself, so this needs get/list/watch on sandboxes and
nothing else: its controller ownerReference names its SandboxClaim or SandboxWarmPool, and
the claim and warm-pool controllers annotate it with its template. A warm pool's Sandbox
adopted by a claim changes owner (the pool's reference is replaced by the claim's) and keeps
its name and uid: the pool it came from is remembered here, by namespace and name, and
restored from the verdicts after a restart (`remember`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta

from deathwatch._api.agent_sandbox import SandboxObject
from deathwatch._api.resources import SandboxRef
from deathwatch._engine.verdict import Cause

# shutdownTime is stored in whole seconds and the controller acts on it within its requeue:
# a deletion asked this long before it still counts as its expiry
EXPIRY_SLACK = timedelta(seconds=1)
Key = tuple[str, str]  # (namespace, Sandbox name)
# a deleted Sandbox is kept this many deep (oldest out first): its pods' last verdicts, written
# after it is gone, still name its claim, template and pool, and its pods' deletions read as
# Deleted; bounded whatever the churn
TOMBSTONES = 10_000


class AgentSandboxes:
    def __init__(self) -> None:
        self._by_key: dict[Key, SandboxObject] = {}
        self._pools: dict[Key, str] = {}  # the warm pool a Sandbox came from (adoption drops it)
        self._tombstones: OrderedDict[Key, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_key)

    def update(self, sandbox: SandboxObject) -> bool:
        """A Sandbox listed, added or modified. True when what its verdicts say of it changed
        (a warm pool's Sandbox claimed, its template learned)."""
        key = (sandbox.namespace, sandbox.name)
        before = self.ref(*key)
        older = self._by_key.get(key)
        if older is not None and older.uid != sandbox.uid:
            self._pools.pop(key, None)  # a new Sandbox of the same name
        self._tombstones.pop(key, None)
        self._by_key[key] = sandbox
        if sandbox.warm_pool:
            self._pools[key] = sandbox.warm_pool
        return self.ref(*key) != before

    def remove(self, namespace: str, name: str) -> None:
        """The Sandbox is gone from the API: kept as deleted, a while (TOMBSTONES)."""
        key = (namespace, name)
        s = self._by_key.get(key)
        if s is None:
            return
        self._by_key[key] = replace(s, deleting=True)
        self._tombstones[key] = None
        while len(self._tombstones) > TOMBSTONES:
            old, _ = self._tombstones.popitem(last=False)
            self._by_key.pop(old, None)
            self._pools.pop(old, None)

    def relisted(self, scope: str | None, seen: Iterable[Key]) -> None:
        """A complete listing of `scope` (a namespace; None: all) showed these: the others
        were deleted while the watch was down."""
        shown = set(seen)
        for key, s in list(self._by_key.items()):
            if (scope is None or key[0] == scope) and key not in shown and not s.deleting:
                self.remove(*key)

    def remember(self, namespace: str, ref: SandboxRef) -> None:
        """What a verdict listed at start says of its Sandbox: the warm pool it came from is
        written nowhere else once a claim has adopted it."""
        if ref.warm_pool and (namespace, ref.name) not in self._pools:
            self._pools[(namespace, ref.name)] = ref.warm_pool

    def ref(self, namespace: str, name: str) -> SandboxRef:
        """What a verdict names: the Sandbox, and its claim, template and warm pool as far as
        they are known (only the name when the Sandbox was never seen: no CRD, no access)."""
        s = self._by_key.get((namespace, name))
        pool = self._pools.get((namespace, name))
        if s is None:
            return SandboxRef(name=name, warm_pool=pool)
        return SandboxRef(name=name, claim=s.claim, template=s.template, warm_pool=pool)

    def fate(self, namespace: str, name: str, asked_at: datetime) -> Cause:
        """What the deletion of its pod, asked at `asked_at`, means. A Sandbox never seen is
        taken as deleted: nothing says the deletion was on purpose."""
        s = self._by_key.get((namespace, name))
        if s is None or s.deleting:
            return Cause.DELETED
        if s.suspended:
            return Cause.SUSPENDED
        if s.shutdown_time is not None and s.shutdown_time <= asked_at + EXPIRY_SLACK:
            return Cause.EXPIRED
        return Cause.DELETED
