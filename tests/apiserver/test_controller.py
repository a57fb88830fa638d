"""The operator on the real control plane, under its own ServiceAccount and the RBAC in
manifests/. The tests play kubelet by writing pods/status, and wait on explicit conditions
(poll with a deadline), never on fixed sleeps."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes import client

from deathwatch._engine.timeutil import format_time
from hack.localcluster.controller_process import ControllerProcess
from hack.localcluster.sandbox_script import Fate, pod_manifest, timeline
from tests.controller_env import Env, fate_status, ready_status
from tests.kube import wait_for

pytestmark = pytest.mark.apiserver
ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION = "deathwatch.dev", "v1alpha1"


# --- lifecycles -----------------------------------------------------------------------------


def test_no_probe_death_with_evidence_and_one_event(env: Env) -> None:
    env.start_controller()
    env.deathwatch()
    s = env.script("sbx-exit", fate=Fate.EXITS, exit_code=7, life=timedelta(seconds=1))
    uid = env.create(s)
    meta_before = env.core.read_namespaced_pod(s.name, env.ns, _request_timeout=10).metadata
    env.kubelet.status(env.ns, s.name, ready_status(s))
    alive = env.wait_state(s.name, "Alive")
    assert alive["status"]["podUID"] == uid
    assert alive["status"]["policy"] == "no-probe"
    written = datetime.now(UTC)
    env.kubelet.status(env.ns, s.name, fate_status(s))
    dead = env.wait_state(s.name, "Dead")["status"]
    took = (datetime.now(UTC) - written).total_seconds()
    assert (dead["cause"], dead["container"], dead["exitCode"], dead["reason"]) == (
        "ContainerExited",
        "agent",
        7,
        "Error",
    )
    assert dead["readyDropAt"] == format_time(s.start + timedelta(seconds=2))
    assert dead["lastReadyAt"] == format_time(s.start + timedelta(seconds=1))
    assert dead["declaredAt"]
    assert took < 5, f"verdict took {took:.2f}s"
    events = wait_for(lambda: env.events(s.name, "SandboxDead"), what="SandboxDead event")
    assert len(events) == 1
    assert events[0].type == "Warning"
    assert "ContainerExited" in events[0].message
    assert "exit code 7" in events[0].message
    # the SandboxVerdict is owned by its DeathWatch (garbage-collected with it)
    owners = env.sv(s.name)["metadata"]["ownerReferences"]  # type: ignore[index]
    assert [(o["kind"], o["name"]) for o in owners] == [("DeathWatch", "sandboxes")]
    # never a write to the sandbox pod: no annotations, finalizers, labels, owners of ours
    meta_after = env.core.read_namespaced_pod(s.name, env.ns, _request_timeout=10).metadata
    for attr in ("labels", "annotations", "finalizers", "owner_references", "generation"):
        assert getattr(meta_after, attr) == getattr(meta_before, attr), attr
    managers = {f.manager for f in meta_after.managed_fields}
    assert managers == {"OpenAPI-Generator"}  # only the test (playing platform and kubelet)
    # the DeathWatch summary
    dw = wait_for(
        lambda: (d := env.dw()).get("status", {}).get("dead") == 1 and d, what="DeathWatch dead=1"
    )
    assert dw["status"]["lastDeaths"][0]["name"] == s.name
    table = env.cp.kubectl_run("get", "dw,sv", "-n", env.ns).stdout
    assert "sbx-exit" in table
    assert "Dead" in table
    assert "ContainerExited" in table


def test_a_deathwatch_created_after_its_pods_adopts_them(env: Env) -> None:
    # the controller keeps no copy of pods no DeathWatch selects: a new DeathWatch lists the
    # pods that came before it (their watch events are past) and judges them from there
    env.start_controller()
    scripts = [env.script(f"sbx-early-{i}", fate=Fate.EXITS, exit_code=3) for i in range(3)]
    web = env.script("web-early", fate=Fate.LIVES, labels={"app": "web"})
    for s in [*scripts, web]:
        env.create(s)
        env.kubelet.status(env.ns, s.name, ready_status(s))
    wait_for(
        lambda: env.controller is not None and env.controller.metric(
            "deathwatch_watch_last_event_timestamp_seconds", resource="pods") > 0,
        what="the controller saw the pods before any DeathWatch",
    )  # fmt: skip
    assert env.sv(scripts[0].name) is None
    env.deathwatch()
    for s in scripts:
        env.wait_state(s.name, "Alive")
    assert env.sv(web.name) is None  # not a sandbox: not adopted
    env.kubelet.status(env.ns, scripts[1].name, fate_status(scripts[1]))
    dead = env.wait_state(scripts[1].name, "Dead")["status"]
    assert (dead["cause"], dead["exitCode"]) == ("ContainerExited", 3)
    assert len(wait_for(lambda: env.events(scripts[1].name, "SandboxDead"), what="Event")) == 1


def test_a_deathwatch_over_idle_sandboxes_adopts_all_of_them_while_the_namespace_churns(
    env: Env,
) -> None:
    """Issue #23's race, as an operator met it: a DeathWatch created over idle sandboxes
    while another pod in the namespace keeps changing. Before the reshape a pod event during
    the listing made the adoption compare two readings of one DeathWatch by identity, and
    adopt nothing (or stop after the first page: 600 idle sandboxes are two pages)."""
    n = 600
    env.start_controller()
    churn = env.script("web-churn", fate=Fate.LIVES, labels={"app": "web"})
    env.create(churn)
    scripts = [env.script(f"idle-{i}", fate=Fate.LIVES) for i in range(n)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(env.create, scripts))
        list(pool.map(lambda s: env.kubelet.status(env.ns, s.name, ready_status(s)), scripts))
    stop = threading.Event()

    def churning() -> int:
        ready, writes = ready_status(churn), 0
        while not stop.is_set():
            status = copy.deepcopy(ready)  # a new transition time: a pod event each time
            status["conditions"][0]["lastTransitionTime"] = f"2026-01-01T00:00:{writes % 60:02d}Z"
            env.kubelet.status(env.ns, churn.name, status)
            writes += 1
            stop.wait(0.005)
        return writes

    with ThreadPoolExecutor(1) as pool:
        churned = pool.submit(churning)
        try:
            env.deathwatch()
            wait_for(
                lambda: (env.dw().get("status") or {}).get("alive") == n,
                timeout=90,
                what=f"all {n} idle sandboxes Alive",
            )
        finally:
            stop.set()
        assert churned.result() > 10  # the namespace did churn while it listed
    assert env.sv(churn.name) is None


def test_oom_and_eviction(env: Env) -> None:
    env.start_controller()
    env.deathwatch()
    oom = env.script("sbx-oom", fate=Fate.OOM)
    evicted = env.script("sbx-evicted", fate=Fate.EVICTED)
    for s in (oom, evicted):
        env.create(s)
        env.kubelet.status(env.ns, s.name, ready_status(s))
    for s in (oom, evicted):
        env.wait_state(s.name, "Alive")
        env.kubelet.status(env.ns, s.name, fate_status(s))
    assert env.wait_state(oom.name, "Dead")["status"]["cause"] == "OOMKilled"
    ev = env.wait_state(evicted.name, "Dead")["status"]
    assert (ev["cause"], ev["exitCode"]) == ("Evicted", 137)


POD_LIMIT = "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. "


def _kubelets_eviction(env: Env, name: str, source: str = "kubelet") -> None:
    """The Event the kubelet's eviction manager posts before it kills (eviction_manager.go)."""
    pod = env.core.read_namespaced_pod(name, env.ns, _request_timeout=10)
    env.core.create_namespaced_event(env.ns, {
        "metadata": {"generateName": f"{name}."},
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": env.ns, "name": name,
                           "uid": pod.metadata.uid},
        "reason": "Evicted", "message": POD_LIMIT, "type": "Warning",
        "source": {"component": source, "host": "node-a"},
        "firstTimestamp": datetime.now(UTC).isoformat(), "count": 1,
    }, _request_timeout=30)  # fmt: skip


def test_the_kubelets_evicted_event_makes_a_clean_exit_a_death_the_workloads(env: Env) -> None:
    """Issue #61, ADR 0044: the kubelet posts Evicted before its kill, and a process that exits
    0 on the SIGTERM leaves the pod Succeeded with no reason of the eviction. Read from its
    Event, it is Dead StorageLimitExceeded (Workload) with the kubelet's message; the same
    reason from another component's Event is not the kubelet's word, and the clean exit beside
    it stays a completion."""
    env.start_controller()
    env.deathwatch()
    graceful = env.script("sbx-graceful", fate=Fate.COMPLETES)
    killed = env.script("sbx-killed", fate=Fate.EXITS, exit_code=137)
    other = env.script("sbx-other-source", fate=Fate.COMPLETES)
    for s in (graceful, killed, other):
        env.create(s)
        env.kubelet.status(env.ns, s.name, ready_status(s))
    for s in (graceful, killed, other):
        env.wait_state(s.name, "Alive")
    _kubelets_eviction(env, graceful.name)
    _kubelets_eviction(env, killed.name)
    _kubelets_eviction(env, other.name, source="descheduler")
    controller = env.controller
    assert controller is not None
    # two are the kubelet's (counted), the descheduler's is not: each read once its own is
    wait_for(lambda: controller.metric("deathwatch_kubelet_evictions_total",
                                       cause="StorageLimitExceeded") == 2,
             timeout=30, what="the controller reading the kubelet's Evicted Events")  # fmt: skip
    for s in (graceful, killed, other):
        env.kubelet.status(env.ns, s.name, fate_status(s))
    for s in (graceful, killed):
        status = env.wait_state(s.name, "Dead")["status"]
        assert (status["cause"], status["origin"]) == ("StorageLimitExceeded", "Workload"), status
        said = [c["message"] for c in status["conditions"] if c["type"] == "Alive"]
        assert said and f"the kubelet evicted it: {POD_LIMIT.strip()}" in said[0], status
    assert env.wait_state(graceful.name, "Dead")["status"]["exitCode"] == 0
    done = env.wait_state(other.name, "Gone")["status"]
    assert done["cause"] == "Completed", done
    (event,) = env.events(graceful.name, "SandboxDead")
    assert "StorageLimitExceeded" in event.message and "workload" in event.message.lower()
    assert POD_LIMIT.strip() in event.message, event.message


def test_exec_probe_flap_recovers_and_a_hang_dies_after_the_window(env: Env) -> None:
    env.start_controller()
    # W = 1 x (1 x 1 s + 1 s) = 2 s
    env.deathwatch(execProbe={"windowMultiplier": 1})
    timing = {"probe": "exec", "period_seconds": 1, "failure_threshold": 1, "timeout_seconds": 1}
    flap = env.script("sbx-flap", **timing)
    hang = env.script("sbx-hang", **timing)
    for s in (flap, hang):
        env.create(s)
        env.kubelet.status(env.ns, s.name, ready_status(s))
        env.wait_state(s.name, "Alive")
    not_ready = copy.deepcopy(ready_status(flap))
    now = format_time(datetime.now(UTC))
    for cond in not_ready["conditions"]:
        if cond["type"] in ("Ready", "ContainersReady"):
            cond.update(status="False", reason="ContainersNotReady", lastTransitionTime=now)
    not_ready["containerStatuses"][0]["ready"] = False
    env.kubelet.status(env.ns, flap.name, not_ready)
    suspect = env.wait_state(flap.name, "Suspect", timeout=5)["status"]
    assert suspect["cause"] == "NotReady"
    assert suspect["deadline"]
    env.kubelet.status(
        env.ns,
        flap.name,
        ready_status(flap)
        | {
            "conditions": [
                c | {"lastTransitionTime": format_time(datetime.now(UTC))}
                for c in ready_status(flap)["conditions"]
            ]
        },
    )
    recovered = env.wait_state(flap.name, "Alive")["status"]
    assert recovered["flaps"] == 1
    dropped = time.monotonic()
    env.kubelet.status(env.ns, hang.name, not_ready)
    env.wait_state(hang.name, "Suspect", timeout=5)
    dead = env.wait_state(hang.name, "Dead", timeout=15)["status"]
    waited = time.monotonic() - dropped
    assert dead["cause"] == "Unresponsive"
    assert 1.0 <= waited < 8, f"declared after {waited:.1f}s for a 2 s window"
    assert env.sv(flap.name)["status"]["state"] == "Alive"  # type: ignore[index]


def test_deletion_is_gone_not_dead_and_retention_deletes_the_verdict(env: Env) -> None:
    env.start_controller()
    env.deathwatch(verdictRetention="3s")
    s = env.script("sbx-deleted")
    env.create(s)
    env.kubelet.status(env.ns, s.name, ready_status(s))
    env.wait_state(s.name, "Alive")
    env.kubelet.request_deletion(env.ns, s.name)
    gone = env.wait_state(s.name, "Gone")["status"]
    assert gone["cause"] == "Deleted"
    # kubelet stops the container (exit 143) and confirms: still not a death
    stopped = copy.deepcopy(ready_status(s))
    now = format_time(datetime.now(UTC))
    stopped.update(phase="Failed")
    for cond in stopped["conditions"]:
        if cond["type"] in ("Ready", "ContainersReady"):
            cond.update(status="False", lastTransitionTime=now)
    stopped["containerStatuses"][0].update(
        ready=False, state={"terminated": {"exitCode": 143, "reason": "Error", "finishedAt": now}}
    )
    env.kubelet.status(env.ns, s.name, stopped)
    env.kubelet.finish_deletion(env.ns, s.name)
    assert env.events(s.name, "SandboxDead") == []
    assert env.sv(s.name)["status"]["state"] == "Gone"  # type: ignore[index]
    # kept for verdictRetention, then removed by the controller
    wait_for(lambda: env.sv(s.name) is None, timeout=25, what="the verdict to be retired")


def test_unknown_policy_is_reported_on_the_deathwatch(env: Env) -> None:
    env.start_controller()
    env.deathwatch(policy="no-such-policy")
    dw = wait_for(
        lambda: (d := env.dw()).get("status", {}).get("conditions") and d,
        what="DeathWatch conditions",
    )
    ready = next(c for c in dw["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.policy" in ready["message"]
    assert "no-such-policy" in ready["message"]


def test_probe_blocked_by_firewall_is_flagged(env: Env) -> None:
    env.start_controller()
    env.deathwatch()
    s = env.script("sbx-tcp", probe="tcp")
    env.create(s)
    sv = env.wait_state(s.name, "Pending")["status"]
    assert sv["probeBlockedByFirewall"] is True
    assert any(
        c["type"] == "ProbeBlockedByFirewall" and c["status"] == "True" for c in sv["conditions"]
    )
    assert sv["policy"] == "container-state"
    assert len(wait_for(lambda: env.events(s.name, "ProbeBlockedByFirewall"), what="event")) == 1


# --- faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize("round_", [1, 2, 3])
def test_controller_killed_and_restarted_loses_nothing(env: Env, round_: int) -> None:
    ctrl = env.start_controller()
    env.deathwatch()
    dead_before = env.script("before")
    dies_while_down = env.script("while-down", fate=Fate.EXITS, exit_code=3)
    deleted_while_down = env.script("deleted-down")
    lives = env.script("lives")
    for s in (dead_before, dies_while_down, deleted_while_down, lives):
        env.create(s)
        env.kubelet.status(env.ns, s.name, ready_status(s))
    for s in (dead_before, dies_while_down, deleted_while_down, lives):
        env.wait_state(s.name, "Alive")
    env.kubelet.status(
        env.ns,
        dead_before.name,
        fate_status(env.script("x", fate=Fate.OOM, start=dead_before.start)),
    )
    env.wait_state(dead_before.name, "Dead")
    wait_for(lambda: env.events(dead_before.name, "SandboxDead"), what="first SandboxDead")
    ctrl.kill()  # SIGKILL: no goodbye
    env.kubelet.status(env.ns, dies_while_down.name, fate_status(dies_while_down))
    env.kubelet.request_deletion(env.ns, deleted_while_down.name, grace=0)
    env.start_controller()
    dead = env.wait_state(dies_while_down.name, "Dead")["status"]
    assert (dead["cause"], dead["exitCode"]) == ("ContainerExited", 3)
    # deleted while nobody watched: how it ended is unknown, and the verdict says so
    assert env.wait_state(deleted_while_down.name, "Gone")["status"]["cause"] == "Unobserved"
    assert len(wait_for(lambda: env.events(deleted_while_down.name, "SandboxLostTrack"),
                        what="SandboxLostTrack")) == 1  # fmt: skip
    assert env.sv(dead_before.name)["status"]["state"] == "Dead"  # type: ignore[index]
    assert env.sv(lives.name)["status"]["state"] == "Alive"  # type: ignore[index]
    wait_for(
        lambda: env.events(dies_while_down.name, "SandboxDead"), what="SandboxDead after restart"
    )
    # settle, then count: exactly one SandboxDead per death, across the restart
    wait_for(
        lambda: env.controller and env.controller.get("/readyz")["details"]["write_backlog"] == 0,
        what="writes done",
    )
    assert len(env.events(dead_before.name, "SandboxDead")) == 1
    assert len(env.events(dies_while_down.name, "SandboxDead")) == 1


def test_apiserver_restart_under_a_running_controller(env: Env) -> None:
    ctrl = env.start_controller()
    env.deathwatch()
    s = env.script("survivor", fate=Fate.EXITS, exit_code=9)
    env.create(s)
    env.kubelet.status(env.ns, s.name, ready_status(s))
    env.wait_state(s.name, "Alive")
    # a restarting apiserver answers 403 until its RBAC caches fill; the writer retries those
    env.forbidden_expected = True
    env.cp.stop_apiserver()
    # while the API is down the controller keeps answering /healthz (it is alive) and
    # /readyz says the API is unreachable once its probe has run
    assert ctrl.get("/healthz", status_only=True) == 200
    env.cp.start_apiserver()
    # after the restart the old watches get 410 Gone; kopf relists; a death is seen
    env.kubelet.status(env.ns, s.name, fate_status(s))
    dead = env.wait_state(s.name, "Dead", timeout=60)["status"]
    assert (dead["cause"], dead["exitCode"]) == ("ContainerExited", 9)
    assert ctrl.proc is not None and ctrl.proc.poll() is None
    assert len(wait_for(lambda: env.events(s.name, "SandboxDead"), what="event")) == 1


def test_healthz_answers_from_the_process_and_readyz_reports_for_people(env: Env) -> None:
    ctrl = env.start_controller()
    env.deathwatch()
    s = env.script("probe")
    env.create(s)
    env.kubelet.status(env.ns, s.name, ready_status(s))
    env.wait_state(s.name, "Alive")
    assert ctrl.get("/healthz", status_only=True) == 200
    report = wait_for(
        lambda: (r := ctrl.get("/readyz")) and r["api_reachable"] and r["watches_fresh"] and r,
        what="readyz",
    )
    assert set(report) >= {"api_reachable", "watches_fresh", "firewall_covered", "details"}
    assert report["firewall_covered"] is None  # no firewall DaemonSet configured
    # the page is rendered at most once a second and reused meanwhile (ADR 0020): the
    # verdict's count is on the next one
    alive = 'deathwatch_verdicts_total{cause="",policy="no-probe",state="Alive"} 1.0'
    metrics = wait_for(lambda: (m := ctrl.get("/metrics")) and alive in m and m, what="metrics")
    assert "deathwatch_verdict_latency_seconds_bucket" in metrics
    # every policy's error counter exists at 0 before its first error (increase() skips a
    # series' first sample: an error that created its series would never fire an alert)
    for policy in ("no-probe", "exec-probe", "container-state"):
        assert f'deathwatch_policy_errors_total{{policy="{policy}"}} 0.0' in metrics


def test_metadata_untouched_for_pods_of_every_fate(env: Env) -> None:
    """A sandbox pod never gets our annotations, finalizers or labels, whatever happens."""
    env.start_controller()
    env.deathwatch()
    scripts = [
        env.script(f"m-{f.value}", fate=f, life=timedelta(seconds=1))
        for f in (Fate.EXITS, Fate.COMPLETES, Fate.EVICTED)
    ]
    for s in scripts:
        env.create(s)
        for m in timeline(s):
            if m.status is not None:
                env.kubelet.status(env.ns, s.name, m.status)
    env.wait_state("m-exits", "Dead")
    env.wait_state("m-completes", "Gone")
    env.wait_state("m-evicted", "Dead")
    for s in scripts:
        meta = env.core.read_namespaced_pod(s.name, env.ns, _request_timeout=10).metadata
        assert meta.annotations is None
        assert meta.finalizers is None
        assert meta.labels == pod_manifest(s)["metadata"]["labels"]


def _release_deployment(env: Env, release: str) -> str:
    """A release's controller Deployment as the chart makes it (no replicas: the test's
    processes play its pods), serving every namespace with DeathWatches of no controller id."""
    name = f"{release}-deathwatch-controller"
    client.AppsV1Api(env.api).create_namespaced_deployment("deathwatch-system", {
        "metadata": {"name": name, "labels": {
            "app.kubernetes.io/part-of": "deathwatch", "app.kubernetes.io/instance": release,
            "app.kubernetes.io/component": "controller"},
            "annotations": {"deathwatch.dev/controller-id": "", "deathwatch.dev/scope": "*"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "none"}]}}},
    }, _request_timeout=10)  # fmt: skip
    return name


def _writers(env: Env, name: str) -> set[str]:
    """Who wrote a verdict: the field managers of its status (each replica's identity)."""
    sv = env.sv(name) or {}
    return {f["manager"] for f in sv.get("metadata", {}).get("managedFields") or ()
            if f.get("subresource") == "status"}  # fmt: skip


def test_without_leader_election_a_release_applied_later_writes_nothing_over_the_first(
    env: Env,
) -> None:
    """ADR 0038 without leader election (#59): two releases' only replicas, no Lease, serving
    the same DeathWatches (one controller id over one namespace), as `helm template | kubectl
    apply` can leave them. The one applied later never writes: /readyz says why, naming the
    first; the first judges the death alone (the verdict's writers). The first uninstalled
    (its Deployment deleted, its process stopped), the later one leads within its check
    interval and judges the next death."""
    apps = client.AppsV1Api(env.api)
    first = _release_deployment(env, "a-first")
    later = _release_deployment(env, "b-later")  # the same second or later: it gives way
    extra = ["--release-check-interval", "1"]
    try:
        env.start_controller(extra=[*extra, "--identity", "first-0", "--lease-owner", first])
        second = ControllerProcess(
            env.kubeconfig, [env.ns], env.tmp / "later.log", reader_token=env.reader_token,
            extra=[*extra, "--identity", "later-0", "--lease-owner", later],
        ).start()  # fmt: skip
        try:
            refused = wait_for(lambda: (r := second.get("/readyz")) and
                               r["details"]["releases"]["refused"], timeout=30,
                               what="the later release refused")  # fmt: skip
            assert "release a-first (namespace deathwatch-system" in refused, refused
            assert second.get("/readyz", status_only=True) == 503
            assert '"not leading"' in second.tail(400)
            env.deathwatch()
            s = env.script("sbx-first", fate=Fate.EXITS, exit_code=3)
            env.create(s)
            env.kubelet.status(env.ns, s.name, ready_status(s))
            env.wait_state(s.name, "Alive")
            env.kubelet.status(env.ns, s.name, fate_status(s))
            env.wait_state(s.name, "Dead")
            assert _writers(env, s.name) == {"first-0"}
            # the first uninstalled: its Deployment deleted, its only replica stopped
            apps.delete_namespaced_deployment(first, "deathwatch-system", _request_timeout=10)
            assert env.controller is not None
            env.controller.stop()
            wait_for(lambda: second.get("/readyz", status_only=True) == 200, timeout=30,
                     what="the later release leading once alone")  # fmt: skip
            t = env.script("sbx-later", fate=Fate.EXITS, exit_code=4)
            env.create(t)
            env.kubelet.status(env.ns, t.name, ready_status(t))
            env.wait_state(t.name, "Alive")
            env.kubelet.status(env.ns, t.name, fate_status(t))
            assert env.wait_state(t.name, "Dead")["status"]["exitCode"] == 4
            assert _writers(env, t.name) == {"later-0"}
        finally:
            print(second.tail(40))
            second.stop()
    finally:
        for name in (first, later):
            with contextlib.suppress(client.ApiException):
                apps.delete_namespaced_deployment(name, "deathwatch-system", _request_timeout=10)
