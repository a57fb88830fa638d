"""Shards on real parts (ADR 0025): kube-apiserver v1.36 built from its modules with KEP-5866's
ShardedListAndWatch gate (the kubelet's and controller-manager's release stays 1.35, a
supported skew), shards of two replicas each as processes under the controller's
ServiceAccount, the audit log of every write. Checked each time: every pod has exactly one
verdict, written only by the shard its slot belongs to (from the audit log); every death
judged Dead once (one SandboxDead Event), none taken back; and, through a shard leader's kill
and reshards 3 -> 4 -> 2 while sandboxes die, no slot ever written by two shards at once."""

from __future__ import annotations

import contextlib
import json
import signal
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from deathwatch._operator.shards.slots import assign, selector, slot_of
from hack.localcluster import controlplane
from hack.localcluster.replicas import AuditLog, Replica, Replicas
from hack.localcluster.sandbox_script import SandboxScript
from hack.render_manifests import CHART, NAMESPACE, helm, without_helm_labels
from tests.controller_env import Env, VerdictRecorder, admin_api, audited, fate_status
from tests.kube import fresh_namespace, wait_for

pytestmark = pytest.mark.chaos
RESULTS: dict[str, Any] = {}
TIMINGS = (6.0, 4.0, 1.0)  # lease, renew deadline, retry: failovers within seconds


@pytest.fixture(scope="module")
def cp() -> Iterator[controlplane.ControlPlane]:
    binary = controlplane.shards_apiserver()
    if not binary.exists():
        pytest.skip(f"{binary} not built (hack/setup.sh)")
    with audited(
        "shard",
        RESULTS,
        apiserver_binary=binary,
        apiserver_flags=["--feature-gates=ShardedListAndWatch=true"],
    ) as c:
        # the controller's RBAC, the same for every shard count (ADR 0026)
        rbac = helm("template", "deathwatch", str(CHART), "-n", NAMESPACE, "--set",
                    "controller.shards=4", "--show-only", "templates/rbac/controller.yaml")  # fmt: skip
        c.kubectl_run("apply", "-f", "-", input=without_helm_labels(rbac))
        yield c


@dataclass
class Fleet:
    """Shards of replicas, by epoch."""

    env: Env
    replicas: Replicas
    audit: AuditLog
    recorder: VerdictRecorder
    shards_of: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # id: (i, N, epoch)
    killed: list[str] = field(default_factory=list)
    uids: dict[str, str] = field(default_factory=dict)  # pod name -> uid
    # as the chart renders it by default: each replica's epoch is its pod's creation
    # (--shard-epoch=pod:NS/NAME), a pod of its own made here for each replica process
    pod_epochs: bool = False
    created: dict[str, int] = field(default_factory=dict)  # identity -> its pod's creation
    pod_names: dict[str, str] = field(default_factory=dict)  # identity -> its pod

    def epoch_flag(self, identity: str, generation: int) -> str:
        """The replica's --shard-epoch: the generation (1, 2, ...) as a number, or, with
        pod_epochs, a pod made now, after every earlier generation's (the API server stamps
        creation to the second: one generation's pods come a second after the last's)."""
        if not self.pod_epochs:
            return str(generation)
        earlier = max((at for i, at in self.created.items()
                       if self.shards_of.get(i, (0, 0, generation))[2] < generation), default=0)  # fmt: skip
        core = client.CoreV1Api(self.env.api)
        name = f"replica-{identity}-{time.monotonic_ns() % 10**6}"

        def made() -> int | None:
            pod = core.create_namespaced_pod(NAMESPACE, {
                "metadata": {"name": f"{name}-{len(self.created)}"},
                "spec": {"containers": [{"name": "c", "image": "none"}],
                         "nodeName": "no-such-node"}}, _request_timeout=10)  # fmt: skip
            at = int(pod.metadata.creation_timestamp.timestamp())
            if at <= earlier:
                core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0,
                                           _request_timeout=10)  # fmt: skip
                return None
            self.created[identity] = at
            self.pod_names[identity] = pod.metadata.name
            return at

        wait_for(made, timeout=10, interval=0.2, what=f"{identity}'s pod, after generation "
                 f"{generation - 1}'s")  # fmt: skip
        return f"pod:{NAMESPACE}/{self.pod_names[identity]}"

    def start(self, count: int, epoch: int, per_shard: int = 2) -> list[str]:
        """`per_shard` replicas of each of `count` shards at `epoch` (a pair, as shipped)."""
        started = []
        for i in range(count):
            for r in "abc"[:per_shard]:
                identity = f"e{epoch}-s{i}-{r}"
                flag = self.epoch_flag(identity, epoch)
                self.shards_of[identity] = (i, count, epoch)
                self.replicas.start(identity, ("--shards", str(count), "--shard", str(i),
                                               "--shard-epoch", flag))  # fmt: skip
                started.append(identity)
        return started

    def reshard(self, before: int, old: int, after: int, new: int, meanwhile: Callable[[], None]
                ) -> float:  # fmt: skip
        """From `before` shards at epoch `old` to `after` at `new`, as `helm upgrade` rolls it:
        shard by shard, the new replica up, then the old one stopped; `meanwhile()` (deaths)
        between the steps. Returns the seconds until the new shards own every slot."""
        started = time.monotonic()
        for i in range(max(before, after)):
            if i < after:
                (identity,) = self.start_one(i, after, new)
                replica = self.replicas.members[identity]
                wait_for(replica.readyz, timeout=60, what=f"{identity} up")
            meanwhile()
            for old_identity, (j, count, epoch) in list(self.shards_of.items()):
                if (j, count, epoch) == (i, before, old) and self.replicas.members[
                    old_identity
                ].alive():
                    self.replicas.stop(old_identity)  # SIGTERM: it releases the shard's Lease
        self.wait_owning(after, new, timeout=120)
        return round(time.monotonic() - started, 1)

    def start_one(self, i: int, count: int, epoch: int) -> list[str]:
        identity = f"e{epoch}-s{i}-a"
        flag = self.epoch_flag(identity, epoch)
        self.shards_of[identity] = (i, count, epoch)
        self.replicas.start(identity, ("--shards", str(count), "--shard", str(i),
                                       "--shard-epoch", flag))  # fmt: skip
        return [identity]

    def leading(self, identity: str) -> bool:
        replica = self.replicas.members[identity]
        return replica.alive() and replica.leading()

    def leaders(self, epoch: int) -> dict[int, str]:
        out = {}
        for identity, (i, _, e) in self.shards_of.items():
            if e == epoch and self.leading(identity):
                out[i] = identity
        return out

    def owned(self, identity: str) -> str:
        shard = (self.replicas.members[identity].readyz().get("details") or {}).get("shard") or {}
        return str(shard.get("owned", ""))

    def wait_owning(self, count: int, epoch: int, timeout: float = 90) -> dict[int, str]:
        """Every shard of this epoch led, and owning all it is assigned."""

        def done() -> dict[int, str] | None:
            leaders = self.leaders(epoch)
            if len(leaders) < count:
                return None
            for i, identity in leaders.items():
                a = sorted(assign(i, count))
                if self.owned(identity) != f"{a[0]}-{a[-1]}":
                    return None
            return leaders

        return wait_for(done, timeout=timeout, interval=0.2,
                        what=f"the {count} shards of epoch {epoch} owning their slots")  # fmt: skip

    def sandboxes(self, n: int, prefix: str) -> list[SandboxScript]:
        scripts = self.env.alive_sandboxes(n, prefix, first_exit_code=1, timeout=90)
        for s in scripts:
            self.uids[s.name] = self.env.core.read_namespaced_pod(
                s.name, self.env.ns, _request_timeout=10).metadata.uid  # fmt: skip
        return scripts

    def kill(self, *scripts: SandboxScript) -> None:
        for s in scripts:
            self.env.kubelet.status(self.env.ns, s.name, fate_status(s))
            self.killed.append(s.name)

    def verify(self, case: str, **extra: Any) -> None:
        """Exactly one verdict per pod; every death Dead with one Event; every verdict write by
        a shard its slot belonged to; per slot, once a newer epoch wrote it, no older one did."""
        for name in self.killed:
            self.env.wait_state(name, "Dead", timeout=90)
        items = self.env.custom.list_namespaced_custom_object(
            "deathwatch.dev", "v1alpha1", self.env.ns, "sandboxverdicts", _request_timeout=30
        )["items"]
        names = [i["metadata"]["name"] for i in items]
        assert sorted(names) == sorted(self.uids), (len(names), len(self.uids))
        for item in items:
            uid = self.uids[item["metadata"]["name"]]
            assert item["metadata"]["labels"].get("deathwatch.dev/slot") == str(slot_of(uid))
        events = {n: len(self.env.events(n, "SandboxDead")) for n in self.killed}
        assert events == dict.fromkeys(self.killed, 1), events
        assert self.recorder.taken_back() == []
        wrong, older_after_newer = [], []
        newest: dict[int, tuple[int, datetime]] = {}  # slot -> (epoch, first write of it)
        writes = sorted((w for w in self.audit.verdict_writes()
                         if w.resource == "sandboxverdicts" and w.code < 300 and w.name in self.uids),
                        key=lambda w: w.received)  # fmt: skip
        writers: dict[str, set[str]] = {}
        for w in writes:
            assert w.identity is not None
            i, count, epoch = self.shards_of[w.identity]
            slot = slot_of(self.uids[w.name])
            if slot not in assign(i, count):
                wrong.append((w.identity, w.name, slot))
            seen = newest.get(slot)
            if seen is None or epoch > seen[0]:
                newest[slot] = (epoch, w.received)
            elif epoch < seen[0]:
                older_after_newer.append((w.identity, w.name, slot))
            writers.setdefault(w.name, set()).add(f"{i}/{count}@{epoch}")
        RESULTS[case] = {
            "pods": len(self.uids), "deaths": len(self.killed), "verdict_writes": len(writes),
            "outside_the_writers_slots": len(wrong), "older_epoch_after_newer": len(older_after_newer),
            "shards_that_wrote_one_verdict_max": max((len(v) for v in writers.values()), default=0),
            **extra,
        }  # fmt: skip
        assert wrong == [], wrong[:5]
        assert older_after_newer == [], older_after_newer[:5]


@pytest.fixture
def fleet(cp: controlplane.ControlPlane, tmp_path: Path) -> Iterator[Fleet]:
    api = admin_api(cp)
    ns = f"shards-{time.monotonic_ns() % 10**8}"
    fresh_namespace(api, ns)
    env = Env(cp, api, ns, tmp_path)
    env.bind_controller()
    env.deathwatch()
    f = Fleet(env, Replicas(cp, api, ns, tmp_path, timings=TIMINGS),
              AuditLog(cp.audit_log, ns), VerdictRecorder(api, ns).start())  # fmt: skip
    try:
        yield f
    finally:
        f.recorder.stop()
        for r in f.replicas.members.values():
            print(f"--- {r.identity}\n{r.process.tail(15)}")
        f.replicas.stop_all()
        for identity in f.shards_of:
            i, count, _ = f.shards_of[identity]
            name = f"deathwatch-controller-shard-{i}" if count > 1 else "deathwatch-controller"
            with contextlib.suppress(client.ApiException):
                client.CoordinationV1Api(api).delete_namespaced_lease(name, "deathwatch-system",
                                                                      _request_timeout=10)  # fmt: skip
        for pod in f.pod_names.values():
            with contextlib.suppress(client.ApiException):
                client.CoreV1Api(api).delete_namespaced_pod(pod, NAMESPACE, grace_period_seconds=0,
                                                            _request_timeout=10)  # fmt: skip
        client.CoreV1Api(api).delete_namespace(ns, _request_timeout=30)
        api.close()


def admin_get(cp: controlplane.ControlPlane, path: str) -> bytes:
    context = ssl.create_default_context(cafile=str(cp.certs / "ca.crt"))
    context.load_cert_chain(cp.certs / "admin.crt", cp.certs / "admin.key")
    with urllib.request.urlopen(f"{cp.server}{path}", context=context, timeout=10) as r:  # noqa: S310
        body: bytes = r.read()
    return body


def apiserver_metric(cp: controlplane.ControlPlane, name: str) -> float:
    text = admin_get(cp, "/metrics").decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and 'resource="pods"' in line)  # fmt: skip


def filtered_here(replica: Replica) -> float:
    return replica.process.metric("deathwatch_shard_filtered_total", where="pods")


def test_three_shards_partition_exactly_and_the_api_server_filters_their_watches(
    fleet: Fleet, cp: controlplane.ControlPlane
) -> None:
    filtered_before = apiserver_metric(cp, "apiserver_watch_filtered_events_total")
    fleet.start(3, 1)
    leaders = fleet.wait_owning(3, 1)
    scripts = fleet.sandboxes(30, "p")
    fleet.kill(*scripts[:9])
    fleet.verify("three_shards")
    # the server applied each shard's selector: echoed back, events filtered there, and
    # nothing of another shard's reached a controller
    for identity in leaders.values():
        shard = fleet.replicas.members[identity].readyz()["details"]["shard"]
        assert shard["server_filtered"] == [True], shard
        assert filtered_here(fleet.replicas.members[identity]) == 0
    filtered = apiserver_metric(cp, "apiserver_watch_filtered_events_total") - filtered_before
    assert filtered > 0
    # the DeathWatch: shard 0's totals of the three parts, who leads each shard
    # the totals follow the parts within 6 s (each other shard's counts every 5 s at most)
    wait_for(lambda: ((s := fleet.env.dw().get("status") or {}).get("tracked"), s.get("dead"))
             == (30, 9), timeout=30, what="the DeathWatch's totals")  # fmt: skip
    status = fleet.env.dw()["status"]
    assert [p["shard"] for p in status["shards"]] == [0, 1, 2]
    assert sum(p["tracked"] for p in status["shards"]) == 30 and status["dead"] == 9
    assert status["leader"] == " ".join(f"{i}={leaders[i]}" for i in range(3))
    RESULTS["three_shards"]["apiserver_filtered_events"] = filtered
    # the server's hash is ours: a list with each shard's selector holds exactly the pods
    # our FNV-1a-64 puts in its slots, and says it applied the selector
    seen: set[str] = set()
    for i in range(3):
        wanted = selector(assign(i, 3))
        query = urllib.parse.urlencode({"shardSelector": wanted})
        listed = json.loads(admin_get(cp, f"/api/v1/namespaces/{fleet.env.ns}/pods?{query}"))
        assert listed["metadata"]["shardInfo"]["selector"] == wanted
        uids = {item["metadata"]["uid"] for item in listed["items"]}
        assert all(slot_of(u) in assign(i, 3) for u in uids), i
        seen |= uids
    assert seen == set(fleet.uids.values())


def test_a_killed_shard_leader_is_replaced_by_its_standby_within_the_lease(fleet: Fleet) -> None:
    fleet.start(3, 1)
    leaders = fleet.wait_owning(3, 1)
    scripts = fleet.sandboxes(18, "k")
    victim = leaders[1]
    ones = [s for s in scripts if slot_of(fleet.uids[s.name]) in assign(1, 3)]
    assert ones, "no sandbox in shard 1's slots"
    fleet.replicas.stop(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    fleet.kill(*ones)
    new = wait_for(lambda: fleet.leaders(1).get(1) not in (None, victim) and fleet.leaders(1)[1],
                   timeout=30, interval=0.1, what="shard 1's standby leading")  # fmt: skip
    fleet.wait_owning(3, 1)
    took = round(time.monotonic() - killed_at, 2)
    fleet.verify("shard_leader_killed", takeover_seconds=took, new_leader=new)
    assert took < TIMINGS[0] + 10


def test_resharding_3_to_4_to_2_while_sandboxes_die_loses_nothing(fleet: Fleet) -> None:
    """Each reshard as Helm makes it: every shard's Deployment rolls (its new pod comes up
    as the standby of the shard's Lease, the old one is stopped and releases it), new shards'
    Deployments are created, surplus ones deleted. The older shards give up each slot a newer
    one is assigned, fencing first; a newer one gains it once no live Lease claims it.
    Sandboxes die throughout."""
    fleet.start(3, 1, per_shard=1)
    fleet.wait_owning(3, 1)
    alive = fleet.sandboxes(24, "r")
    batches = iter([alive[i : i + 3] for i in range(0, 24, 3)])
    fleet.kill(*next(batches))
    took = {"3->4": fleet.reshard(3, 1, 4, 2, lambda: fleet.kill(*next(batches, [])))}
    took["4->2"] = fleet.reshard(4, 2, 2, 3, lambda: fleet.kill(*next(batches, [])))
    for rest in batches:
        fleet.kill(*rest)
    more = fleet.sandboxes(4, "after")
    fleet.kill(*more[:2])
    fleet.verify("reshard_3_4_2", reshard_seconds=took)


def test_a_reshard_rendered_by_helm_template_hands_every_slot_over(fleet: Fleet) -> None:
    """#53: Argo CD renders the chart with `helm template`, where the release's revision is
    always 1, so the revision cannot be a reshard's epoch. Each replica's epoch is its own
    pod's creation (`--shard-epoch=pod:NAMESPACE/NAME`, the chart's default): the pods a
    reshard rolls out are created after the ones they replace, and nothing else tells them
    apart. 2 -> 3 as the Deployments roll, sandboxes dying throughout: every slot handed
    over, fenced, no slot ever written by an older shard after a newer one."""
    fleet.pod_epochs = True
    fleet.start(2, 1, per_shard=1)
    fleet.wait_owning(2, 1)
    alive = fleet.sandboxes(12, "g")
    batches = iter([alive[i : i + 3] for i in range(0, 12, 3)])
    fleet.kill(*next(batches))
    took = fleet.reshard(2, 1, 3, 2, lambda: fleet.kill(*next(batches, [])))
    for rest in batches:
        fleet.kill(*rest)
    claimed: dict[int, int] = {}
    for i, leader in fleet.leaders(2).items():
        shard = (fleet.replicas.members[leader].readyz().get("details") or {}).get("shard") or {}
        assert shard.get("epoch") == fleet.created[leader], (leader, shard)
        claimed[i] = int(shard["epoch"])
    assert min(claimed.values()) > max(at for i, at in fleet.created.items()
                                       if fleet.shards_of[i][2] == 1)  # fmt: skip
    fleet.verify("reshard_pod_epochs_2_3", reshard_seconds=took, epochs=claimed)


def test_with_the_gate_off_each_shard_filters_what_it_is_sent(
    fleet: Fleet, cp: controlplane.ControlPlane
) -> None:
    """Last (it restarts the API server without the gate): the selector is not echoed, so
    each shard filters every event itself; the partition is the same."""
    cp.stop_apiserver()
    cp.apiserver_flags = []
    cp.processes.pop("kube-apiserver", None)
    cp.start_apiserver()
    fleet.start(3, 1)
    leaders = fleet.wait_owning(3, 1)
    scripts = fleet.sandboxes(15, "g")
    fleet.kill(*scripts[:5])
    fleet.verify("gate_off")
    for identity in leaders.values():
        replica = fleet.replicas.members[identity]
        assert replica.readyz()["details"]["shard"]["server_filtered"] == [False]
        assert filtered_here(replica) > 0  # the others' pods arrived, and were dropped here


def _deployment(api: client.ApiClient, name: str) -> str:
    """A controller's Deployment as the chart makes it (no replicas here: the processes play
    its pods); its uid."""
    made = client.AppsV1Api(api).create_namespaced_deployment(NAMESPACE, {
        "metadata": {"name": name},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "none"}]}}},
    }, _request_timeout=10)  # fmt: skip
    return str(made.metadata.uid)


def _lease(api: client.ApiClient, name: str) -> Any:
    try:
        return client.CoordinationV1Api(api).read_namespaced_lease(name, NAMESPACE,
                                                                   _request_timeout=10)  # fmt: skip
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_an_uninstall_takes_its_lease_and_a_sharded_reinstall_waits_on_no_ghost(
    fleet: Fleet,
) -> None:
    """#59: the Lease belongs to its Deployment (--lease-owner, as the chart runs it). Deleting
    the Deployment (helm uninstall, kubectl delete, a prune) has the garbage collector delete
    the Lease, even while its replicas, still stopping, cannot release it; they never make it
    again. A sharded install applied next finds no Lease naming the old holder and every slot
    has a writer as soon as its shards elect one. Before: the old Lease stayed held, and every
    new shard waited out its lease duration on it (20-34 s with the chart's 15 s)."""
    api = fleet.env.api
    uid = _deployment(api, "deathwatch-controller")
    for r in "ab":
        identity = f"one-{r}"
        fleet.shards_of[identity] = (0, 1, 1)
        fleet.replicas.start(identity, ("--lease-owner", "deathwatch-controller"))
    leader = fleet.replicas.wait_leader(timeout=60)
    held = _lease(api, "deathwatch-controller")
    assert held is not None and held.spec.holder_identity == leader.identity
    assert [(o.kind, o.name, o.uid) for o in held.metadata.owner_references] == [
        ("Deployment", "deathwatch-controller", uid)
    ]
    # the uninstall: the Deployment goes (background, as Helm and kubectl delete it); its
    # replicas keep running meanwhile, as pods in their grace period do
    deleted = time.monotonic()
    client.AppsV1Api(api).delete_namespaced_deployment("deathwatch-controller", NAMESPACE,
                                                       _request_timeout=10)  # fmt: skip
    wait_for(lambda: _lease(api, "deathwatch-controller") is None, timeout=60, interval=0.1,
             what="the Lease deleted with its Deployment")  # fmt: skip
    gone_after = round(time.monotonic() - deleted, 2)
    wait_for(lambda: all(not fleet.leading(f"one-{r}") for r in "ab"), timeout=30, interval=0.1,
             what="the old replicas stood down")  # fmt: skip
    wait_for(lambda: all("not creating the lease again" in
                         fleet.replicas.members[f"one-{r}"].process.tail(400) for r in "ab"),
             timeout=30, interval=0.2, what="each old replica found its owner gone")  # fmt: skip
    said = [fleet.replicas.members[f"one-{r}"].process.tail(400).count("not creating the lease")
            for r in "ab"]  # fmt: skip
    assert said == [1, 1], said  # said once; tried again every retry period, not in a loop
    assert _lease(api, "deathwatch-controller") is None
    # the reinstall, sharded, while the old replicas are still stopping
    for i in range(2):
        _deployment(api, f"deathwatch-controller-shard-{i}")
    for i in range(2):
        for r in "ab":
            identity = f"two-s{i}-{r}"
            fleet.shards_of[identity] = (i, 2, 2)
            fleet.replicas.start(identity, ("--shards", "2", "--shard", str(i), "--shard-epoch",
                                            "2", "--lease-owner",
                                            f"deathwatch-controller-shard-{i}"))  # fmt: skip
    # timed from the moment every new replica answers (a process's start is not the gap)
    wait_for(lambda: all(fleet.replicas.members[f"two-s{i}-{r}"].readyz()
                         for i in range(2) for r in "ab"), timeout=90, interval=0.05,
             what="the new replicas up")  # fmt: skip
    started = time.monotonic()
    fleet.wait_owning(2, 2, timeout=90)
    writers_after = round(time.monotonic() - started, 2)
    for r in "ab":
        fleet.replicas.stop(f"one-{r}")
    assert _lease(api, "deathwatch-controller") is None
    for i in range(2):
        claim = _lease(api, f"deathwatch-controller-shard-{i}")
        assert claim.metadata.owner_references[0].name == f"deathwatch-controller-shard-{i}"
    RESULTS["uninstall_then_sharded_reinstall"] = {
        "lease_deleted_after_seconds": gone_after,
        "every_slot_written_after_start_seconds": writers_after,
    }
    for name in ("deathwatch-controller-shard-0", "deathwatch-controller-shard-1"):
        client.AppsV1Api(api).delete_namespaced_deployment(name, NAMESPACE, _request_timeout=10)
