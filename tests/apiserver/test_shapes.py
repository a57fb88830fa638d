"""Every shape a platform installs (issue #40), pairwise, on one real control plane.

The factors, and the values users run:

- scope: cluster-wide, or 1, 3 or 10 namespaces (`--namespace`, RoleBindings);
- agent-sandbox: its CRDs absent, or installed with its controller and Sandboxes;
- shards: 1, or 3 (each its own Lease: leader election on);
- leader election: on (a pair per shard) or off (the only writer).

Every pair of values meets in at least one shape (`SHAPES`; checked by
`test_the_shapes_cover_every_pair`). Each shape runs under the controller's ServiceAccount
with the RBAC Helm renders for it (`helm template`, the scope's bindings included), on
kube-apiserver v1.36 with KEP-5866's gate (the shards' watches filtered by the server), and
must: be ready within `READY_WITHIN`, elect a leader per shard (or say election is off), and
judge one death in every namespace right (Dead, ContainerExited, its exit code, its Sandbox
named when it has one), written by the shard its slot belongs to (the audit log), with no
call refused. Last, a reshard 3 -> 2 -> 3 as `helm upgrade` rolls it: the Role and bindings
of each step applied first, the surplus shard stopped at once, every other shard rolled (its
new replica up, then the old one stopped), sandboxes dying throughout; no slot is left
without a writer for longer than the Lease duration plus 2 s.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from deathwatch._operator.shards.slots import SLOTS, assign, parse, slot_of
from hack.localcluster import agentsandbox, controlplane
from hack.localcluster.controller_process import (
    ControllerProcess,
    metrics_reader_token,
    service_account_kubeconfig,
)
from hack.localcluster.replicas import AuditLog
from hack.localcluster.sandbox_script import Fate, SandboxScript
from hack.render_manifests import CHART, NAMESPACE, helm, without_helm_labels
from tests.controller_env import Env, admin_api, audited, fate_status, ready_status
from tests.kube import fresh_namespace, wait_for

pytestmark = pytest.mark.apiserver
RESULTS: dict[str, Any] = {}
READY_WITHIN = 30.0  # seconds from start to /readyz 200, every process of a shape
TIMINGS = (6.0, 4.0, 1.0)  # lease, renew deadline, retry: a reshard's handovers within seconds
SANDBOX_API = ("agents.x-k8s.io", "v1beta1")
RBAC_TEMPLATES = ("templates/rbac/controller.yaml", "templates/rbac/controller-binding.yaml")


@dataclass(frozen=True)
class Shape:
    scope: int | None  # namespaces served; None: cluster-wide
    agent_sandbox: bool  # agent-sandbox's CRDs installed, its controller running, Sandboxes
    shards: int
    elect: bool

    @property
    def id(self) -> str:
        scope = "cluster" if self.scope is None else f"{self.scope}ns"
        crds = "agent-sandbox" if self.agent_sandbox else "no-crds"
        return f"{scope}-{crds}-{self.shards}shard-{'elect' if self.elect else 'single'}"


# absent first: agent-sandbox's CRDs are installed once, for the rest of the module
SHAPES = (
    Shape(None, False, 1, False),
    Shape(1, False, 1, True),
    Shape(3, False, 3, True),
    Shape(10, False, 1, False),
    Shape(None, True, 3, True),
    Shape(1, True, 3, True),
    Shape(1, True, 1, False),
    Shape(3, True, 1, False),
    Shape(3, True, 1, True),  # issue #40's: never ready before watches left the pool
    Shape(10, True, 3, True),
)


def test_the_shapes_cover_every_pair() -> None:
    values: dict[str, tuple[Any, ...]] = {
        "scope": (None, 1, 3, 10), "agent_sandbox": (False, True), "shards": (1, 3),
        "elect": (False, True),
    }  # fmt: skip
    for (a, va), (b, vb) in itertools.combinations(values.items(), 2):
        for x, y in itertools.product(va, vb):
            if {a: x, b: y} in ({"shards": 3, "elect": False}, {"elect": False, "shards": 3}):
                continue  # a shard's slots are claimed on its Lease: sharding needs election
            assert any(getattr(s, a) == x and getattr(s, b) == y for s in SHAPES), (a, x, b, y)
    ordered = [s.agent_sandbox for s in SHAPES]
    assert ordered == sorted(ordered), "agent-sandbox's CRDs stay once installed: absent first"


@dataclass
class Lane:
    cp: controlplane.ControlPlane
    api: client.ApiClient
    tmp: Path
    reader: str
    sandbox_controller: agentsandbox.AgentSandboxController | None = None
    rows: int = 0

    def agent_sandbox(self) -> None:
        """Its CRDs, RBAC and controller, once."""
        if self.sandbox_controller is None:
            agentsandbox.install_crds(self.cp)
            agentsandbox.install_rbac(self.cp)
            self.sandbox_controller = agentsandbox.AgentSandboxController(
                self.cp, self.api, self.tmp
            ).start()


@pytest.fixture(scope="module")
def lane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lane]:
    binary = controlplane.shards_apiserver()
    if not binary.exists():
        pytest.skip(f"{binary} not built (hack/setup.sh)")
    reason = agentsandbox.missing()
    if reason:
        pytest.skip(reason)
    with audited("shapes", RESULTS, apiserver_binary=binary,
                 apiserver_flags=["--feature-gates=ShardedListAndWatch=true"]) as cp:  # fmt: skip
        api = admin_api(cp)
        tmp = tmp_path_factory.mktemp("shapes")
        made = Lane(cp, api, tmp, metrics_reader_token(api))
        try:
            yield made
        finally:
            if made.sandbox_controller is not None:
                made.sandbox_controller.stop()
            api.close()


def rbac(shape_values: list[str]) -> str:
    """The controller's RBAC as Helm renders it for these values (without Helm's labels)."""
    args = ["template", "deathwatch", str(CHART), "-n", NAMESPACE]
    for value in shape_values:
        args += ["--set", value]
    for template in RBAC_TEMPLATES:
        args += ["--show-only", template]
    return without_helm_labels(helm(*args))


def values(namespaces: list[str] | None, shards: int) -> list[str]:
    out = [f"controller.shards={shards}"]
    if namespaces is not None:
        out += ["scope.clusterWide=false", f"scope.namespaces={{{','.join(namespaces)}}}"]
    return out


@dataclass
class Process:
    identity: str
    shard: int
    shards: int
    epoch: int
    controller: ControllerProcess
    started: float = field(default_factory=time.monotonic)

    def readyz(self) -> dict[str, Any]:
        report: dict[str, Any] = self.controller.get("/readyz") or {}
        return report

    def ready(self) -> bool:
        return bool(self.controller.get("/readyz", status_only=True) == 200)

    def alive(self) -> bool:
        return self.controller.proc is not None and self.controller.proc.poll() is None

    def leading(self) -> bool:
        return bool(self.readyz().get("details", {}).get("leader", {}).get("may_write"))

    def owned(self) -> frozenset[int]:
        shard = self.readyz().get("details", {}).get("shard")
        if shard is None:  # unsharded: its leader (or the only writer) owns every slot
            return frozenset(range(SLOTS)) if self.leading() else frozenset()
        return parse(str(shard.get("owned", "")))


@dataclass
class Row:
    lane: Lane
    shape: Shape
    namespaces: list[str]
    processes: dict[str, Process] = field(default_factory=dict)
    envs: dict[str, Env] = field(default_factory=dict)

    @property
    def scope(self) -> list[str] | None:
        return None if self.shape.scope is None else self.namespaces

    def start(self, identity: str, shard: int, shards: int, epoch: int) -> Process:
        lane = self.lane
        kubeconfig = service_account_kubeconfig(
            lane.cp, lane.api, NAMESPACE, "deathwatch-controller",
            lane.tmp / f"{identity}.kubeconfig",
        )  # fmt: skip
        lease, renew, retry = TIMINGS
        extra = [f"--identity={identity}"]
        if self.shape.elect:
            extra += ["--leader-elect", f"--lease-duration={lease}",
                      f"--renew-deadline={renew}", f"--retry-period={retry}"]  # fmt: skip
        if shards > 1:
            extra += [f"--shards={shards}", f"--shard={shard}", f"--shard-epoch={epoch}"]
        process = ControllerProcess(kubeconfig, self.scope or [], lane.tmp / f"{identity}.log",
                                    extra=extra, reader_token=lane.reader).start()  # fmt: skip
        made = self.processes[identity] = Process(identity, shard, shards, epoch, process)
        return made

    def stop(self, identity: str, sig: int = signal.SIGTERM) -> None:
        self.processes[identity].controller.stop(sig)

    def live(self) -> list[Process]:
        return [p for p in self.processes.values() if p.alive()]


@pytest.fixture
def row(lane: Lane, request: pytest.FixtureRequest) -> Iterator[Row]:
    shape: Shape = request.param
    lane.rows += 1
    prefix = f"s{lane.rows}"
    namespaces = [f"{prefix}-{i}" for i in range(shape.scope or 2)]
    for ns in namespaces:
        fresh_namespace(lane.api, ns)
    made = Row(lane, shape, namespaces)
    if shape.agent_sandbox:
        lane.agent_sandbox()
    lane.cp.kubectl_run("apply", "-f", "-", input=rbac(values(made.scope, shape.shards)))
    for ns in namespaces:
        env = made.envs[ns] = Env(lane.cp, lane.api, ns, lane.tmp)
        if shape.agent_sandbox:
            env.deathwatch(podSelector={}, sandboxes="agent-sandbox")
        else:
            env.deathwatch()
    try:
        yield made
    finally:
        for p in made.processes.values():
            print(f"--- {p.identity}\n{p.controller.tail(20)}")
            p.controller.stop()
        core, leases = client.CoreV1Api(lane.api), client.CoordinationV1Api(lane.api)
        rbac_api = client.RbacAuthorizationV1Api(lane.api)
        with contextlib.suppress(client.ApiException):  # a cluster-wide shape's binding
            rbac_api.delete_cluster_role_binding("deathwatch-controller", _request_timeout=10)
        for lease in leases.list_namespaced_lease(NAMESPACE, _request_timeout=10).items:
            if lease.metadata.name.startswith("deathwatch-controller"):
                leases.delete_namespaced_lease(lease.metadata.name, NAMESPACE,
                                               _request_timeout=10)  # fmt: skip
        for ns in namespaces:
            core.delete_namespace(ns, _request_timeout=30)


def sandbox(row: Row, ns: str, name: str, exit_code: int) -> SandboxScript:
    """A sandbox Ready in `ns`: agent-sandbox's (a Sandbox, whose pod its controller makes)
    in a shape that has it, else a plain pod; the test plays its kubelet."""
    env = row.envs[ns]
    script = env.script(name, fate=Fate.EXITS, exit_code=exit_code)
    if row.shape.agent_sandbox:
        env.custom.create_namespaced_custom_object(*SANDBOX_API, ns, "sandboxes", {
            "apiVersion": "/".join(SANDBOX_API), "kind": "Sandbox", "metadata": {"name": name},
            "spec": {"podTemplate": {"metadata": {"labels": {"app": "sandbox"}}, "spec": {
                "nodeName": "node-1", "containers": [{"name": "agent", "image": "agent:1"}]}}},
        }, _request_timeout=30)  # fmt: skip
        wait_for(lambda: env.core.read_namespaced_pod(name, ns, _request_timeout=10),
                 timeout=30, what=f"agent-sandbox's pod {ns}/{name}",
                 ignore=(client.ApiException,))  # fmt: skip
    else:
        env.create(script)
    env.kubelet.status(ns, name, kubelets(row, ready_status(script)))
    return script


def kubelets(row: Row, status: dict[str, Any]) -> dict[str, Any]:
    """A status as the pod's kubelet writes it: agent-sandbox's pods ask for no resources, so
    their QoS class (set at creation, immutable) is not the scripts' Burstable."""
    if row.shape.agent_sandbox:
        return {k: v for k, v in status.items() if k != "qosClass"}
    return status


def elected(row: Row) -> dict[int, str]:
    """Each shard's leader (or, election off, the only writer), once every process says so."""
    leaders: dict[int, str] = {}
    for p in row.live():
        details = p.readyz().get("details", {})
        if not row.shape.elect:
            if details.get("leader") == {"leader_election": "off"}:
                leaders[p.shard] = p.identity
        elif details.get("leader", {}).get("may_write"):
            if p.shard in leaders:
                return {}  # two say they lead one shard: not settled (or worse)
            leaders[p.shard] = p.identity
    return leaders if len(leaders) == row.shape.shards else {}


def check_deaths(row: Row, deaths: list[tuple[str, SandboxScript]]) -> None:
    """Every sandbox Dead, right, with one Event; each verdict written only by the shard its
    slot belongs to (the audit log); no call of any process refused."""
    uids: dict[tuple[str, str], str] = {}
    for ns, s in deaths:
        env = row.envs[ns]
        status = env.wait_state(s.name, "Dead", timeout=60)["status"]
        assert (status["cause"], status["exitCode"]) == ("ContainerExited", s.exit_code), status
        if row.shape.agent_sandbox:
            assert status["sandbox"]["name"] == s.name, status
        uids[(ns, s.name)] = status["podUID"]
        events = wait_for(lambda e=env, n=s.name: e.events(n, "SandboxDead"), timeout=30,  # type: ignore[misc]
                          what=f"the SandboxDead Event of {ns}/{s.name}")  # fmt: skip
        assert len(events) == 1, events
    wrong = []
    for ns in row.namespaces:
        for w in AuditLog(row.lane.cp.audit_log, ns).verdict_writes():
            p = row.processes.get(w.identity or "")
            uid = uids.get((ns, w.name))
            if w.resource != "sandboxverdicts" or w.code >= 300 or p is None or uid is None:
                continue
            if slot_of(uid) not in assign(p.shard, p.shards):
                wrong.append((w.identity, ns, w.name, slot_of(uid)))
    assert wrong == [], wrong
    assert rbac_refusals(row) == [], "the shape's RBAC falls short"


def rbac_refusals(row: Row) -> list[str]:
    """Calls RBAC refused, from every process's log (a 403 of a namespace being deleted, an
    earlier shape's, is not one: a cluster-wide controller sees those too)."""
    return [line[:300] for p in row.processes.values()
            for line in p.controller.log.read_text(errors="replace").splitlines()
            if "forbidden: User" in line and " cannot " in line]  # fmt: skip


@pytest.mark.parametrize("row", SHAPES, ids=[s.id for s in SHAPES], indirect=True)
def test_each_shape_is_ready_elects_and_judges_a_death_in_every_namespace(row: Row) -> None:
    shape = row.shape
    started = time.monotonic()
    replicas = "ab" if shape.elect and shape.shards == 1 else "a"
    for shard in range(shape.shards):
        for r in replicas:
            row.start(f"{row.namespaces[0]}-{shard}{r}", shard, shape.shards, 1)
    wait_for(lambda: all(p.ready() for p in row.live()), timeout=READY_WITHIN,
             what=f"{shape.id}: every process ready")  # fmt: skip
    ready_after = round(time.monotonic() - started, 1)
    leaders = wait_for(lambda: elected(row), timeout=READY_WITHIN,
                       what=f"{shape.id}: a leader per shard")  # fmt: skip
    if shape.shards > 1:
        wait_for(lambda: all(row.processes[i].owned() == assign(s, shape.shards)
                             for s, i in leaders.items()),
                 timeout=30, what="each shard owning its slots")  # fmt: skip
    scripts = {ns: sandbox(row, ns, "box", 10 + i) for i, ns in enumerate(row.namespaces)}
    for ns, s in scripts.items():
        row.envs[ns].wait_state(s.name, "Alive", timeout=30)
    for ns, s in scripts.items():
        row.envs[ns].kubelet.status(ns, s.name, kubelets(row, fate_status(s)))
    check_deaths(row, list(scripts.items()))
    RESULTS[shape.id] = {"processes": len(row.processes), "ready_seconds": ready_after,
                         "namespaces": len(row.namespaces), "deaths": len(scripts),
                         "leaders": leaders}  # fmt: skip


class Slots:
    """Who writes each slot, polled from every live process's /readyz: the longest time a
    slot had no writer at all."""

    def __init__(self, row: Row, interval: float = 0.2) -> None:
        self.row, self.interval = row, interval
        self.unowned_since: dict[int, float] = {}
        self.longest: dict[int, float] = dict.fromkeys(range(SLOTS), 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Slots:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            owners: dict[int, list[str]] = {}
            for p in list(self.row.processes.values()):
                if p.alive():
                    with contextlib.suppress(Exception):  # a process stopping as it is asked
                        for slot in p.owned():
                            owners.setdefault(slot, []).append(p.identity)
            now = time.monotonic()
            for slot in range(SLOTS):
                if owners.get(slot):
                    since = self.unowned_since.pop(slot, None)
                    if since is not None:
                        self.longest[slot] = max(self.longest[slot], now - since)
                else:
                    self.unowned_since.setdefault(slot, now)

    def gap(self) -> float:
        now = time.monotonic()
        open_gaps = [now - since for since in self.unowned_since.values()]
        return round(max([*self.longest.values(), *open_gaps]), 2)


@pytest.mark.parametrize("row", [Shape(3, True, 3, True)], ids=["3ns-agent-sandbox-3shard"],
                         indirect=True)  # fmt: skip
def test_a_helm_reshard_3_to_2_to_3_leaves_no_slot_without_a_writer(row: Row) -> None:
    """As `helm upgrade --set controller.shards=M` rolls it: the new Role and bindings are
    applied, the surplus shards' Deployments deleted (their pods stopped at once), every
    other shard's Deployment rolled (the new pod ready, then the old one stopped: maxSurge
    1, maxUnavailable 0), all shards at once. Sandboxes die before, during and after."""
    for shard in range(3):
        row.start(f"e1-s{shard}", shard, 3, 1)
    wait_for(lambda: all(p.ready() for p in row.live()) and elected(row), timeout=READY_WITHIN,
             what="three shards ready and leading")  # fmt: skip
    counter = itertools.count()
    scripts: dict[str, SandboxScript] = {}

    def die(n: int) -> None:
        batch = {}
        for _ in range(n):
            i = next(counter)
            ns = row.namespaces[i % len(row.namespaces)]
            batch[f"{ns}/d{i}"] = sandbox(row, ns, f"d{i}", 1 + i % 200)
        for key, s in batch.items():
            ns = key.split("/")[0]
            row.envs[ns].wait_state(s.name, "Alive", timeout=60)
        for key, s in batch.items():
            ns = key.split("/")[0]
            row.envs[ns].kubelet.status(ns, s.name, kubelets(row, fate_status(s)))
        scripts.update(batch)

    def reshard(before: int, after: int, epoch: int) -> float:
        started = time.monotonic()
        row.lane.cp.kubectl_run("apply", "-f", "-", input=rbac(values(row.scope, after)))
        old = {p.identity: p for p in row.live() if p.epoch == epoch - 1}
        for p in old.values():
            if p.shard >= after:
                row.stop(p.identity)  # its Deployment deleted: its pods get SIGTERM now

        def roll(shard: int) -> None:
            new = row.start(f"e{epoch}-s{shard}", shard, after, epoch)
            wait_for(new.ready, timeout=READY_WITHIN, what=f"{new.identity} ready")
            for p in old.values():
                if p.shard == shard:
                    row.stop(p.identity)

        threads = [threading.Thread(target=roll, args=(s,)) for s in range(after)]
        for t in threads:
            t.start()
        die(3)
        for t in threads:
            t.join(120)

        def owning() -> bool:
            leaders = {p.shard: p for p in row.live() if p.epoch == epoch and p.leading()}
            return len(leaders) == after and all(
                p.owned() == assign(s, after) for s, p in leaders.items()
            )

        wait_for(owning, timeout=60, what=f"the {after} shards of epoch {epoch} owning all")
        return round(time.monotonic() - started, 1)

    with Slots(row) as slots:
        die(3)
        took = {"3->2": reshard(3, 2, 2)}
        die(3)
        took["2->3"] = reshard(2, 3, 3)
        die(3)
    check_deaths(row, [(key.split("/")[0], s) for key, s in scripts.items()])
    assert rbac_refusals(row) == [], "a reshard's RBAC refused a shard"
    gap = slots.gap()
    RESULTS["reshard_3_2_3"] = {"seconds": took, "deaths": len(scripts),
                                "longest_slot_without_a_writer": gap}  # fmt: skip
    assert gap <= TIMINGS[0] + 2, gap


@pytest.mark.parametrize("row", [Shape(3, True, 1, False)], ids=["3ns-one-unbound"],
                         indirect=True)  # fmt: skip
def test_a_watch_that_cannot_open_is_named_and_opens_once_it_can(row: Row) -> None:
    """A namespace in the scope without its RoleBinding (a platform added it to the flags
    before the chart): every watch there is refused. Start-up waits for it, and says so: /readyz
    names the watch and its 403, deathwatch_watch_not_open is 1, a log line; the binding
    made, the watches open, with no restart, and the controller judges there."""
    lane, last = row.lane, row.namespaces[-1]
    rbac_api = client.RbacAuthorizationV1Api(lane.api)
    rbac_api.delete_namespaced_role_binding("deathwatch-controller", last, _request_timeout=10)
    controller = row.start(f"{row.namespaces[0]}-x", 0, 1, 1).controller
    controller.extra.append("--watch-open-deadline=2")
    controller.stop()
    controller.start()
    report = wait_for(lambda: (r := controller.get("/readyz")) and r["details"]["watches_not_open"]
                      and r, timeout=30, what="/readyz naming the watches that cannot open")  # fmt: skip
    named = report["details"]["watches_not_open"]
    assert report["watches_open"] is False
    # start-up restores every verdict before it watches a pod: the verdicts' watch is the one
    # it waits on (the pods' have not begun)
    assert list(named) == [f"sandboxverdicts in {last}"], named
    assert named[f"sandboxverdicts in {last}"].startswith("403: "), named
    metric = controller.metric
    assert metric("deathwatch_watch_not_open", resource="sandboxverdicts", scope=last) == 1
    assert "watch not open within its deadline" in controller.log.read_text()
    lane.cp.kubectl_run("apply", "-f", "-", input=rbac(values(row.scope, 1)))
    wait_for(lambda: controller.get("/readyz", status_only=True) == 200, timeout=60,
             what="ready once the binding exists")  # fmt: skip
    assert metric("deathwatch_watch_not_open", resource="sandboxverdicts", scope=last) == 0
    script = sandbox(row, last, "late", 9)
    row.envs[last].wait_state(script.name, "Alive", timeout=30)
