"""`deathwatch.client`, `deathwatch wait|explain`, `kubectl wait` and the tenants' read-only
role, on a real control plane (its own: these tests restart the apiserver and compact etcd).

The verdicts here are written by the test, as the controller would write them: the client's
job is reading them, whoever wrote them. The watch is taken through a TCP proxy so that the
test can cut it off while verdicts change, and a real 410 comes from etcd compacted under it
and an apiserver restart (its watch cache then holds nothing older to serve)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from deathwatch._api.kubeconfig import load
from deathwatch._api.rest import Rest
from deathwatch._kube.errors import ApiError
from deathwatch.client import Change, Client, NeverReached, State, get_verdict, wait_for_verdict
from hack.localcluster import controlplane
from hack.localcluster.chaosproxy import ChaosProxy
from hack.localcluster.controller_process import service_account_token
from tests.conftest import _binaries_or_skip
from tests.kube import fresh_namespace, wait_for

pytestmark = pytest.mark.chaos
ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "manifests" / "base" / "crds"
SV = ("deathwatch.dev", "v1alpha1", "sandboxverdicts")
NOW = "2026-12-01T10:00:00Z"


@pytest.fixture(scope="module")
def cp() -> Iterator[controlplane.ControlPlane]:
    _binaries_or_skip()
    with controlplane.running() as c:
        c.kubectl_run("apply", "--server-side", "-f", str(CRDS))
        c.kubectl_run("wait", "--for=condition=Established", "--timeout=60s",
                      "crd/deathwatches.deathwatch.dev", "crd/sandboxverdicts.deathwatch.dev")  # fmt: skip
        c.kubectl_run("apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / "tenants.yaml"))
        # kube-controller-manager settled (it exits if the apiserver goes away while it builds
        # its controllers, and these tests restart it): its aggregation folded our role in
        wait_for(lambda: "sandboxverdicts" in c.kubectl_run("get", "clusterrole", "view", "-o",
                 "jsonpath={.rules[*].resources}").stdout, timeout=90, what="view aggregated")  # fmt: skip
        yield c


@pytest.fixture(scope="module")
def api(cp: controlplane.ControlPlane) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


@pytest.fixture
def ns(api: client.ApiClient) -> Iterator[str]:
    name = f"client-{time.monotonic_ns() % 10**8}"
    fresh_namespace(api, name)
    yield name
    client.CoreV1Api(api).delete_namespace(name, _request_timeout=30)


def status(
    state: str, uid: str = "uid-1", cause: str | None = None, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "state": state, "policy": "no-probe", "podUID": uid, "restartCounts": {"agent": 0},
        "readyDrops": 0, "flaps": 0, "falsePositive": False, "probeBlockedByFirewall": False,
        "lastReadyAt": NOW, "node": "node-1",
        "conditions": [{"type": "Alive", "status": "True" if state == "Alive" else "False",
                        "reason": cause or state, "message": f"{state} for the test",
                        "lastTransitionTime": NOW}],
    }  # fmt: skip
    if cause:
        body["cause"] = cause
    return {**body, **extra}


class Verdicts:
    """Writes verdicts as the controller does: create, then the status subresource."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.ns = ns

    def put(self, name: str, state: str, uid: str = "uid-1", cause: str | None = None) -> None:
        try:
            self.custom.create_namespaced_custom_object(
                *SV[:2], self.ns, SV[2],
                {"apiVersion": "deathwatch.dev/v1alpha1", "kind": "SandboxVerdict",
                 "metadata": {"name": name}, "spec": {"deathWatch": "dw"}},
                _request_timeout=10,
            )  # fmt: skip
        except client.ApiException as e:
            if e.status != 409:
                raise
        self.custom.patch_namespaced_custom_object_status(
            *SV[:2], self.ns, SV[2], name, {"status": status(state, uid, cause)},
            _request_timeout=10,
        )  # fmt: skip

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(*SV[:2], self.ns, SV[2], name,
                                                    _request_timeout=10)  # fmt: skip


def kubeconfig_via(cp: controlplane.ControlPlane, server: str, path: Path) -> Path:
    path.write_text(controlplane.kubeconfig(server, cp.certs / "ca.crt", cp.certs / "admin.crt",
                                            cp.certs / "admin.key"))  # fmt: skip
    return path


class Watcher:
    """`Client.watch` in its own thread and loop; what it hands over, in order."""

    def __init__(self, kubeconfig: Path, ns: str) -> None:
        self.kubeconfig, self.ns = kubeconfig, ns
        self.changes: list[Change] = []
        self.error: BaseException | None = None
        self.client: Client | None = None
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def follow() -> None:
            self.client = Client.from_kubeconfig(str(self.kubeconfig))
            async with self.client:
                async for change in self.client.watch(self.ns):
                    self.changes.append(change)

        self._task = self._loop.create_task(follow())
        try:
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # the test reads it
            self.error = e

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(15)

    def seen(self, pod: str, state: str, deleted: bool = False) -> Change | None:
        assert self.error is None, self.error
        return next((c for c in self.changes if c.verdict.pod == pod
                     and c.verdict.state == state and c.deleted == deleted), None)  # fmt: skip


def test_the_watch_resumes_through_an_apiserver_restart_and_relists_on_410_handing_each_transition_once(
    cp: controlplane.ControlPlane, api: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    v = Verdicts(api, ns)
    v.put("a", "Alive")
    v.put("b", "Alive")
    proxy = ChaosProxy(cp.apiserver_port).start()
    w = Watcher(kubeconfig_via(cp, f"https://127.0.0.1:{proxy.port}", tmp_path / "kc"), ns)
    w.start()
    try:
        wait_for(lambda: w.seen("a", "Alive") and w.seen("b", "Alive"), what="the first list")
        v.put("a", "Suspect")
        wait_for(lambda: w.seen("a", "Suspect"), what="a transition on the watch")
        # 1. the apiserver restarts: the watch resumes from its last version
        cp.stop_apiserver()
        cp.start_apiserver()
        v.put("b", "Suspect")
        wait_for(lambda: w.seen("b", "Suspect"), timeout=60, what="the watch resumed")
        # 2. cut off while verdicts change, etcd compacted, the apiserver restarted: 410
        proxy.partition()
        v.put("a", "Dead", cause="ContainerExited")
        v.delete("b")
        v.put("c", "Alive")
        cp.compact()
        cp.stop_apiserver()
        cp.start_apiserver()
        proxy.reset()
        proxy.heal()
        wait_for(lambda: w.seen("a", "Dead") and w.seen("b", "Suspect", deleted=True)
                 and w.seen("c", "Alive"), timeout=90, what="what changed while cut off")  # fmt: skip
        assert w.client is not None and w.client.relists >= 1, "no 410 seen: the case is not made"
        v.put("c", "Dead", cause="OOMKilled")
        wait_for(lambda: w.seen("c", "Dead"), what="the watch after the relist")
    finally:
        w.stop()
        proxy.stop()
    handed = [(c.verdict.pod, c.verdict.state.value, c.deleted) for c in w.changes]
    assert len(handed) == len(set(handed)), f"a transition handed over twice: {handed}"
    assert [h for h in handed if h[0] == "a"] == [
        ("a", "Alive", False), ("a", "Suspect", False), ("a", "Dead", False)]  # fmt: skip
    a_dead = w.seen("a", "Dead")
    assert a_dead is not None and a_dead.previous is State.SUSPECT
    assert a_dead.verdict.cause is not None and a_dead.verdict.cause.value == "ContainerExited"


def test_wait_for_returns_at_the_state_and_refuses_what_can_no_longer_happen(
    cp: controlplane.ControlPlane, api: client.ApiClient, ns: str
) -> None:
    v = Verdicts(api, ns)
    kc = str(cp.kubeconfig)
    assert get_verdict(ns, "later", kubeconfig=kc) is None
    v.put("later", "Alive")
    timer = threading.Timer(1.0, v.put, ("later", "Dead", "uid-1", "Evicted"))
    timer.start()
    got = wait_for_verdict(ns, "later", ["Dead", "Gone"], 30, kubeconfig=kc)
    timer.join()
    assert got.state is State.DEAD and got.cause is not None and got.cause.value == "Evicted"
    v.put("gone", "Gone", cause="Deleted")
    with pytest.raises(NeverReached, match="can never be Dead"):
        wait_for_verdict(ns, "gone", [State.DEAD], 30, kubeconfig=kc)
    v.put("idle", "Alive")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        wait_for_verdict(ns, "idle", [State.DEAD], 1.5, kubeconfig=kc)
    assert time.monotonic() - started < 10


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deathwatch._cli", *args], text=True,
                          capture_output=True, timeout=timeout, check=False)  # fmt: skip


def test_deathwatch_wait_and_explain_exit_codes_and_output(
    cp: controlplane.ControlPlane, api: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    v = Verdicts(api, ns)
    kc = str(cp.kubeconfig)
    v.put("s1", "Alive")
    threading.Timer(1.0, v.put, ("s1", "Dead", "uid-1", "OOMKilled")).start()
    done = cli("wait", f"{ns}/s1", "--for", "dead", "--timeout", "30s", "--kubeconfig", kc)
    assert (done.returncode, done.stdout) == (0, f"{ns}/s1 Dead (OOMKilled)\n"), done.stderr
    v.put("s2", "Gone", cause="Deleted")
    never = cli("wait", "s2", "-n", ns, "--for", "dead", "--kubeconfig", kc)
    assert never.returncode == 1 and never.stderr.count("\n") == 1
    assert "is Gone (Deleted): it can never be Dead" in never.stderr
    assert cli("wait", f"{ns}/s2", "--for", "ended", "--kubeconfig", kc).returncode == 0
    late = cli("wait", f"{ns}/s1", "--for", "alive", "--timeout", "1s", "--kubeconfig", kc)
    assert late.returncode == 1  # Dead is final: it can never be Alive again
    v.put("s3", "Alive")
    slow = cli("wait", f"{ns}/s3", "--for", "dead", "--timeout", "1s", "--kubeconfig", kc)
    assert slow.returncode == 1 and "not dead after 1s" in slow.stderr
    for bad in (["wait", "Bad_Name/x", "--for", "dead"], ["wait", "a/b", "--for", "zombie"],
                ["wait", "a/b", "--for", "dead", "--timeout", "soon"]):  # fmt: skip
        out = cli(*bad, "--kubeconfig", kc)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    nowhere = kubeconfig_via(cp, "https://127.0.0.1:1", tmp_path / "nowhere")
    down = cli("wait", f"{ns}/s1", "--for", "dead", "--kubeconfig", str(nowhere))
    assert down.returncode == 3 and down.stderr.count("\n") == 1, down.stderr
    # explain: the verdict, its evidence, timeline, and the Events naming the pod
    client.CoreV1Api(api).create_namespaced_event(ns, {
        "metadata": {"name": "s1.dead"}, "type": "Warning", "reason": "SandboxDead",
        "message": "declared dead (OOMKilled)", "involvedObject": {"kind": "Pod", "name": "s1",
        "namespace": ns}, "source": {"component": "deathwatch"}, "lastTimestamp": NOW,
    }, _request_timeout=10)  # fmt: skip
    shown = cli("explain", f"{ns}/s1", "-o", "json", "--kubeconfig", kc)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert (doc["state"], doc["cause"], doc["policy"]) == ("Dead", "OOMKilled", "no-probe")
    assert doc["timeline"][0]["what"] == "Ready" and doc["evidence"]["node"] == "node-1"
    assert [e["reason"] for e in doc["events"]] == ["SandboxDead"]
    text = cli("explain", f"{ns}/s1", "--kubeconfig", kc)
    assert text.returncode == 0 and text.stdout.startswith(f"{ns}/s1: Dead (OOMKilled)")
    missing = cli("explain", f"{ns}/nobody", "--kubeconfig", kc)
    assert missing.returncode == 1 and f"pod {ns}/nobody not found" in missing.stderr


def test_kubectl_deathwatch_plugin_and_kubectl_wait(
    cp: controlplane.ControlPlane, api: client.ApiClient, ns: str
) -> None:
    v = Verdicts(api, ns)
    v.put("k1", "Alive")
    plugin = shutil.which("kubectl-deathwatch")
    assert plugin is not None, "the kubectl-deathwatch entry point is not installed"
    env = {**os.environ, "PATH": f"{Path(plugin).parent}:{os.environ['PATH']}",
           "KUBECONFIG": str(cp.kubeconfig)}  # fmt: skip
    kubectl = str(cp.kubectl)
    threading.Timer(1.0, v.put, ("k1", "Dead", "uid-1", "ContainerExited")).start()
    waited = subprocess.run(
        [kubectl, "wait", "-n", ns, "sv/k1", "--for=jsonpath={.status.state}=Dead",
         "--timeout=30s"], env=env, text=True, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    by_condition = subprocess.run(
        [kubectl, "wait", "-n", ns, "sv/k1", "--for=condition=Alive=False", "--timeout=10s"],
        env=env, text=True, capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    assert by_condition.returncode == 0, by_condition.stderr
    via = subprocess.run(
        [kubectl, "deathwatch", "wait", f"{ns}/k1", "--for", "dead", "--timeout", "10s"],
        env=env, text=True, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert (via.returncode, via.stdout) == (0, f"{ns}/k1 Dead (ContainerExited)\n"), via.stderr


def test_tenants_read_the_verdicts_of_their_namespace_and_write_nothing(
    cp: controlplane.ControlPlane, api: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    """A namespace user bound to the built-in `view` role (and one bound to `edit`): the
    aggregated deathwatch-view lets them read; every write is refused (403)."""
    v = Verdicts(api, ns)
    v.put("t1", "Dead", cause="ContainerExited")
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    kubectl = str(cp.kubectl)
    for role in ("view", "edit"):
        core.create_namespaced_service_account(ns, {"metadata": {"name": f"tenant-{role}"}},
                                               _request_timeout=10)  # fmt: skip
        rbac.create_namespaced_role_binding(ns, {
            "metadata": {"name": f"tenant-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": f"tenant-{role}", "namespace": ns}],
        }, _request_timeout=10)  # fmt: skip
        token = service_account_token(api, ns, f"tenant-{role}")
        kc = tmp_path / f"{role}.kubeconfig"
        kc.write_text(controlplane.kubeconfig(cp.server, cp.certs / "ca.crt", None, None,
                                              token=token, user=f"tenant-{role}"))  # fmt: skip

        def run(*args: str, kc: Path = kc) -> subprocess.CompletedProcess[str]:
            return subprocess.run([kubectl, "--kubeconfig", str(kc), "-n", ns, *args], text=True,
                                  capture_output=True, timeout=30, check=False)  # fmt: skip

        # the aggregation controller folds deathwatch-view into the role within seconds
        wait_for(lambda: run("get", "sv", "t1").returncode == 0, timeout=60,
                 what=f"{role} aggregates deathwatch-view")  # fmt: skip
        for read in (["get", "sv", "-o", "name"], ["get", "dw"],
                     ["get", "sv", "--watch-only", "--request-timeout=1s"]):  # fmt: skip
            done = run(*read)
            assert done.returncode == 0 or "Timeout" in done.stderr, (role, read, done.stderr)
        assert wait_for_verdict(ns, "t1", ["Dead"], 10, kubeconfig=str(kc)).state is State.DEAD
        writes = {
            "create": ["create", "-f", "-"],
            "patch": ["patch", "sv", "t1", "--type=merge", "-p", '{"metadata":{"labels":{"x":"y"}}}'],
            "status": ["patch", "sv", "t1", "--subresource=status", "--type=merge",
                       "-p", '{"status":{"state":"Gone"}}'],
            "delete": ["delete", "sv", "t1", "--wait=false"],
        }  # fmt: skip
        body = json.dumps({"apiVersion": "deathwatch.dev/v1alpha1", "kind": "SandboxVerdict",
                           "metadata": {"name": "forged"}})  # fmt: skip
        for what, args in writes.items():
            done = subprocess.run([kubectl, "--kubeconfig", str(kc), "-n", ns, *args],
                                  input=body, text=True, capture_output=True, timeout=30,
                                  check=False)  # fmt: skip
            assert done.returncode != 0 and "forbidden" in done.stderr.lower(), (role, what, done)
    # and nothing of another namespace
    other = f"{ns}-other"
    fresh_namespace(api, other)
    try:
        denied = subprocess.run([kubectl, "--kubeconfig", str(tmp_path / "view.kubeconfig"),
                                 "-n", other, "get", "sv"], text=True, capture_output=True,
                                timeout=30, check=False)  # fmt: skip
        assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    finally:
        core.delete_namespace(other, _request_timeout=10)


def test_each_refusal_is_one_line_naming_what_is_missing_or_refused(
    cp: controlplane.ControlPlane, api: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    """The API server's own answers, as `deathwatch wait|explain` say them: 401 (exit 5), 403
    (exit 6), a pod or only its verdict missing (exit 1, which one said), deathwatch's CRDs
    not served (told apart from a missing object by the real 404's body), and -n from the
    kubeconfig context, as kubectl."""
    Verdicts(api, ns).put("s1", "Dead", cause="OOMKilled")
    core = client.CoreV1Api(api)

    def one_line(done: subprocess.CompletedProcess[str], code: int, said: str) -> None:
        assert done.returncode == code, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert said in done.stderr, done.stderr

    forged = tmp_path / "forged.kubeconfig"
    forged.write_text(controlplane.kubeconfig(cp.server, cp.certs / "ca.crt", None, None,
                                              token="not-a-token", user="someone"))  # noqa: S106  # fmt: skip
    one_line(cli("wait", f"{ns}/s1", "--for", "dead", "--kubeconfig", str(forged)), 5,
             f"the API server at {cp.server} (kubeconfig {forged}, context 'local') does not "
             "accept these credentials (401)")  # fmt: skip
    core.create_namespaced_service_account(ns, {"metadata": {"name": "nobody"}},
                                           _request_timeout=10)  # fmt: skip
    bare = tmp_path / "bare.kubeconfig"
    bare.write_text(controlplane.kubeconfig(cp.server, cp.certs / "ca.crt", None, None,
                    token=service_account_token(api, ns, "nobody"), user="nobody"))  # fmt: skip
    for command in (["wait", "--for", "dead"], ["explain"]):
        one_line(cli(*command, f"{ns}/s1", "--kubeconfig", str(bare)), 6,
                 f"does not let nobody read SandboxVerdicts in namespace {ns} (403)")  # fmt: skip
    kc = str(cp.kubeconfig)
    one_line(cli("explain", f"{ns}/nobody", "--kubeconfig", kc), 1,
             f"pod {ns}/nobody not found, and no verdict for it")  # fmt: skip
    core.create_namespaced_pod(ns, {"metadata": {"name": "lonely"}, "spec": {"containers": [
        {"name": "c", "image": "busybox"}]}}, _request_timeout=10)  # fmt: skip
    one_line(cli("explain", f"{ns}/lonely", "--kubeconfig", kc), 1,
             f"pod {ns}/lonely has no verdict: no DeathWatch in namespace {ns} selects it")  # fmt: skip
    # -n defaults to the context's namespace
    with_ns = json.loads(cp.kubeconfig.read_text())
    with_ns["contexts"][0]["context"]["namespace"] = ns
    in_ns = tmp_path / "in-ns.kubeconfig"
    in_ns.write_text(json.dumps(with_ns))
    found = cli("wait", "s1", "--for", "dead", "--kubeconfig", str(in_ns))
    assert (found.returncode, found.stdout) == (0, f"{ns}/s1 Dead (OOMKilled)\n"), found.stderr

    # a missing object and a missing kind of object, as the real API server says them
    async def refusals() -> list[ApiError]:
        rest = Rest(load(kc).configuration, identity="test", purpose="404s")
        caught = []
        try:
            for path in (f"/apis/{SV[0]}/{SV[1]}/namespaces/{ns}/{SV[2]}/nobody",
                         f"/apis/{SV[0]}/{SV[1]}/namespaces/{ns}/nosuchthings/nobody",
                         f"/apis/nosuch.example/v1/namespaces/{ns}/things/x"):  # fmt: skip
                try:
                    await rest.request("GET", path)
                except ApiError as e:
                    caught.append(e)
        finally:
            await rest.close()
        return caught

    object_404, kind_404, group_404 = asyncio.run(refusals())
    assert object_404.not_found and not object_404.missing_resource, object_404.body
    assert kind_404.missing_resource and group_404.missing_resource, (kind_404, group_404)


def _own_connections(port: int) -> set[int]:
    """This process's established TCP connections to `port` (their socket inodes)."""
    mine = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                mine.add(int(target[8:-1]))
    found = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port, state, inode = (
                int(fields[2].rsplit(":", 1)[1], 16),
                fields[3],
                int(fields[9]),
            )
            if remote_port == port and state == "01" and inode in mine:  # 01: ESTABLISHED
                found.add(inode)
    return found


def test_a_warmed_pool_serves_a_deaths_requests_on_connections_already_open(
    cp: controlplane.ControlPlane,
) -> None:
    """ADR 0034: `warm(2)` leaves two connections open, and the two requests a death sends
    at once (its verdict, its Event) go out on them: no new handshake. Warmed again, the
    same two are used: a warm-up keeps what it opened, it does not pile connections up."""

    async def run() -> tuple[set[int], set[int], set[int]]:
        rest = Rest(load(str(cp.kubeconfig)).configuration, identity="test", purpose="warm")
        before = _own_connections(cp.apiserver_port)
        try:
            await rest.warm(2)
            warmed = _own_connections(cp.apiserver_port) - before
            await asyncio.gather(rest.request("GET", "/version"), rest.request("GET", "/livez"))
            used = _own_connections(cp.apiserver_port) - before
            await rest.warm(2)
            again = _own_connections(cp.apiserver_port) - before
        finally:
            await rest.close()
        return warmed, used, again

    warmed, used, again = asyncio.run(run())
    assert len(warmed) == 2, warmed
    assert used == warmed and again == warmed, (warmed, used, again)
