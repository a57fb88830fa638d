"""Chaos lane: faults injected into real components while sandboxes die.

The controller runs as a process under its ServiceAccount, talking to a real kube-apiserver
through a TCP proxy that partitions (both ways or one), and resets; the apiserver restarts;
etcd is compacted so a watch cannot resume (410, relist); a third-party policy raises; a
DeathWatch holds absurd values; the controller is restarted with SIGTERM and SIGKILL. Every
case kills sandboxes before, during and after the fault and then asserts:

- no lost death: every killed sandbox ends with a Dead verdict;
- no duplicate: exactly one SandboxDead Event per death;
- no verdict taken back: a watch on the SandboxVerdicts, beside the controller's own
  connection, never sees Dead followed by anything else for the same pod;
- the fault was visible: a log line, a metric, and /readyz or /healthz or a status;
- the recovery time, reported with the counts at the end of the module (docs/adr/0009).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from hack.localcluster import controlplane
from hack.localcluster.chaosproxy import ChaosProxy
from hack.localcluster.controller_process import ControllerProcess
from hack.localcluster.sandbox_script import SandboxScript
from tests.conftest import _binaries_or_skip
from tests.controller_env import (
    GROUP,
    VERSION,
    Env,
    VerdictRecorder,
    admin_api,
    fate_status,
    prepare,
    ready_status,
)
from tests.kube import fresh_namespace, wait_for

pytestmark = pytest.mark.chaos
ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "manifests" / "base" / "crds"
RESULTS: dict[str, Any] = {}  # per case: recovery seconds and counts, printed at the end


@pytest.fixture(scope="module")
def cp() -> Iterator[controlplane.ControlPlane]:
    """Its own control plane: these tests restart the apiserver and compact etcd."""
    _binaries_or_skip()
    with controlplane.running() as c:
        prepare(c)
        yield c
    print("\nchaos lane measurements:", json.dumps(RESULTS, indent=1))


@dataclass
class Chaos:
    env: Env
    proxy: ChaosProxy
    recorder: VerdictRecorder
    killed: list[str] = field(default_factory=list)

    @property
    def ctrl(self) -> ControllerProcess:
        assert self.env.controller is not None
        return self.env.controller

    def sandboxes(self, n: int, prefix: str, **kw: Any) -> list[SandboxScript]:
        return self.env.alive_sandboxes(n, prefix, first_exit_code=10, **kw)

    def kill(self, *scripts: SandboxScript) -> float:
        """The kubelet reports each container exited (each its own exit code)."""
        for s in scripts:
            self.env.kubelet.status(self.env.ns, s.name, fate_status(s))
            self.killed.append(s.name)
        return time.monotonic()

    def all_dead(self, scripts: list[SandboxScript], timeout: float = 90) -> float:
        """Wait until each has its Dead verdict; returns when the last one was seen."""
        for s in scripts:
            self.env.wait_state(s.name, "Dead", timeout=timeout)
        return time.monotonic()

    def readyz(self) -> dict[str, Any]:
        report: dict[str, Any] = self.ctrl.get("/readyz") or {}
        return report

    def logged(self, event: str) -> int:
        """Lines of the controller's log that say `event`. Only whole lines: the last may be
        half written while it is read (a fresh-clone CI run read one and failed)."""
        text = self.ctrl.log.read_text(errors="replace")
        whole = text[: text.rfind("\n") + 1]
        return sum(
            1
            for line in whole.splitlines()
            if line.startswith("{") and json.loads(line).get("event") == event
        )

    def verify(
        self, case: str, recovery: float | None, retired: tuple[str, ...] = (), **extra: Any
    ) -> None:
        """No lost death, no duplicate Event, no verdict taken back; record the numbers.
        `retired`: deaths whose verdict has already been deleted after its retention."""
        for name in self.killed:
            if name not in retired:
                self.env.wait_state(name, "Dead", timeout=60)
        # writes are asynchronous: let the writer finish before counting Events
        wait_for(lambda: self.readyz().get("details", {}).get("write_backlog") == 0,
                 timeout=60, what="the write backlog drained")  # fmt: skip
        events = {name: len(self.env.events(name, "SandboxDead")) for name in self.killed}
        taken_back = self.recorder.taken_back()
        RESULTS[case] = {
            "deaths": len(self.killed),
            "dead_verdicts": len(retired)
            + sum(
                1
                for n in self.killed
                if (self.env.sv(n) or {}).get("status", {}).get("state") == "Dead"
            ),
            "sandbox_dead_events": sum(events.values()),
            "lost": sum(1 for n in events.values() if n == 0),
            "duplicated": sum(n - 1 for n in events.values() if n > 1),
            "taken_back": len(taken_back),
            "recovery_seconds": None if recovery is None else round(recovery, 2),
            "task_restarts": self.readyz().get("details", {}).get("task_restarts"),
            **extra,
        }
        assert events == dict.fromkeys(self.killed, 1), events
        assert taken_back == []
        assert self.ctrl.get("/healthz", status_only=True) == 200


@pytest.fixture
def chaos(cp: controlplane.ControlPlane, tmp_path: Path) -> Iterator[Chaos]:
    api = admin_api(cp)
    core = client.CoreV1Api(api)
    ns = f"chaos-{time.monotonic_ns() % 10**8}"
    fresh_namespace(api, ns)
    proxy = ChaosProxy(cp.apiserver_port).start()
    env = Env(cp, api, ns, tmp_path)
    env.server = f"https://127.0.0.1:{proxy.port}"
    env.bind_controller()
    recorder = VerdictRecorder(api, ns).start()
    c = Chaos(env, proxy, recorder)
    try:
        yield c
    finally:
        proxy.heal()
        recorder.stop()
        if env.controller is not None:
            print(env.controller.tail(80))
            env.controller.stop()
        proxy.stop()
        core.delete_namespace(ns, _request_timeout=30)
        api.close()


def condition(obj: dict[str, Any] | None, kind: str, status: str) -> dict[str, Any] | None:
    """The condition `kind` of an object's status, if it has that status."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == kind and cond["status"] == status:
            found: dict[str, Any] = cond
            return found
    return None


def _metric(c: Chaos, name: str, **labels: str) -> float:
    return c.ctrl.metric(name, **labels)


# --- the network between the controller and the API ----------------------------------------


def test_a_partition_both_ways(chaos: Chaos) -> None:
    c = chaos
    c.env.start_controller()
    c.env.deathwatch()
    before, during, after = c.sandboxes(2, "pre"), c.sandboxes(3, "mid"), c.sandboxes(1, "post")
    c.kill(*before)
    c.all_dead(before)
    probe_errors = _metric(c, "deathwatch_api_errors_total", operation="probe")
    c.proxy.partition()
    c.kill(*during)
    # visible: /readyz says the API is unreachable, a metric counts it, a log line says so;
    # /healthz stays green (liveness checks no dependency)
    wait_for(
        lambda: c.readyz().get("api_reachable") is False, timeout=90, what="readyz unreachable"
    )
    assert c.ctrl.get("/healthz", status_only=True) == 200
    assert _metric(c, "deathwatch_api_errors_total", operation="probe") > probe_errors
    assert c.logged("API unreachable") >= 1
    healed = time.monotonic()
    c.proxy.heal()
    c.kill(*after)
    recovery = c.all_dead(during) - healed
    wait_for(lambda: c.readyz().get("api_reachable") is True, timeout=60, what="readyz again")
    c.verify("partition_both_ways", recovery)


def test_a_partition_of_requests_only(chaos: Chaos) -> None:
    """The watch keeps coming, requests vanish: the controller judges, cannot write, and
    writes everything once the way is open again."""
    c = chaos
    c.env.start_controller()
    c.env.deathwatch()
    during, after = c.sandboxes(3, "mid"), c.sandboxes(1, "post")
    c.proxy.partition("up")
    c.kill(*during)
    wait_for(lambda: c.logged("write failed, will retry") >= 1, timeout=90, what="a failed write")
    wait_for(
        lambda: c.readyz().get("api_reachable") is False, timeout=60, what="readyz unreachable"
    )
    assert _metric(c, "deathwatch_api_errors_total", code="timeout") >= 1
    assert c.ctrl.get("/healthz", status_only=True) == 200
    healed = time.monotonic()
    c.proxy.heal()
    c.kill(*after)
    c.verify("partition_requests_only", c.all_dead(during) - healed)


def test_connections_reset_again_and_again(chaos: Chaos) -> None:
    c = chaos
    c.env.start_controller()
    c.env.deathwatch()
    pods = c.sandboxes(6, "r")
    connections = _metric(c, "deathwatch_watch_connections_total")
    resets = 0
    for pair in (pods[0:2], pods[2:4], pods[4:6]):
        c.kill(*pair)
        resets += c.proxy.reset()
        time.sleep(0.5)  # the next reset lands on the reconnected streams, not the same ones
    last_reset = time.monotonic()
    recovery = c.all_dead(pods) - last_reset
    # visible: every watch stream that was cut was made again (counted), writes retried
    assert _metric(c, "deathwatch_watch_connections_total") > connections
    c.verify("connection_resets", recovery, connections_reset=resets)


def test_the_apiserver_restarts_while_sandboxes_die(chaos: Chaos) -> None:
    c = chaos
    c.env.forbidden_expected = True  # a restarting apiserver answers 403 until RBAC is warm
    c.env.start_controller()
    c.env.deathwatch()
    before, after = c.sandboxes(2, "pre"), c.sandboxes(2, "post")
    c.kill(*before)
    c.env.cp.stop_apiserver()
    wait_for(
        lambda: c.readyz().get("api_reachable") is False, timeout=60, what="readyz unreachable"
    )
    assert c.ctrl.get("/healthz", status_only=True) == 200
    c.env.cp.start_apiserver()
    started = time.monotonic()
    c.kill(*after)
    recovery = c.all_dead(before + after) - started
    assert c.logged("API unreachable") >= 1
    c.verify("apiserver_restart", recovery)


def test_a_watch_that_cannot_resume_relists_and_names_what_it_did_not_see(chaos: Chaos) -> None:
    """The controller's resource version compacted away while it was cut off: 410 Gone, kopf
    lists again. A sandbox that died and stayed is Dead (once); one that died and was deleted
    meanwhile is Gone with cause Unobserved and a SandboxLostTrack Event, never "deleted
    without dying". (Compaction alone does not do it: the apiserver serves a resumed watch
    from its watch cache; a restart after the compaction leaves nothing older to serve.)"""
    c = chaos
    c.env.forbidden_expected = True  # a restarting apiserver answers 403 until RBAC is warm
    c.env.start_controller()
    c.env.deathwatch()
    stays, deleted = c.sandboxes(1, "stays"), c.sandboxes(1, "deleted")
    c.proxy.partition()
    c.kill(*stays)
    c.env.kubelet.status(c.env.ns, deleted[0].name, fate_status(deleted[0]))
    c.env.kubelet.request_deletion(c.env.ns, deleted[0].name, grace=0)
    wait_for(lambda: c.env.core.list_namespaced_pod(c.env.ns, field_selector=f"metadata.name={deleted[0].name}",
             _request_timeout=10).items == [], what="the pod gone")  # fmt: skip
    revision = c.env.cp.compact()
    c.env.cp.stop_apiserver()
    c.env.cp.start_apiserver()
    c.proxy.reset()  # the watches reconnect from their old version: compacted, 410
    healed = time.monotonic()
    c.proxy.heal()
    c.all_dead(stays)
    gone = c.env.wait_state(deleted[0].name, "Gone", timeout=90)["status"]
    recovery = time.monotonic() - healed
    assert gone["cause"] == "Unobserved"
    lost = wait_for(lambda: c.env.events(deleted[0].name, "SandboxLostTrack"), what="LostTrack")
    assert len(lost) == 1 and "unknown" in lost[0].message
    assert c.env.events(deleted[0].name, "SandboxDead") == []
    # visible: the relist is counted and logged, and so is the lost track
    wait_for(lambda: _metric(c, "deathwatch_watch_relists_total", resource="pods") >= 1,
             what="relist counted")  # fmt: skip
    assert c.logged("a watch could not resume (410 Gone): listing again") >= 1
    assert c.logged("lost track: the pod is gone and nobody saw how it ended") == 1
    # the page is rendered at most once a second (ADR 0020): the count is on a later one
    wait_for(lambda: _metric(c, "deathwatch_verdicts_total", state="Gone", cause="Unobserved") == 1,
             what="the lost track counted")  # fmt: skip
    c.verify("compaction_relist", recovery, compacted_at_revision=revision, unobserved=1)


# --- untrusted and absurd input ------------------------------------------------------------


def plugin_site(tmp: Path) -> Path:
    """tests/plugins/flaky_policy.py, installed as a distribution with an entry point."""
    site = tmp / "plugin-site"
    info = site / "deathwatch_flaky_policy-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: deathwatch-flaky-policy\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text("[deathwatch.policies]\nflaky = flaky_policy:Flaky\n")
    shutil.copy(ROOT / "tests" / "plugins" / "flaky_policy.py", site / "flaky_policy.py")
    return site


def not_ready(script: SandboxScript) -> dict[str, Any]:
    status = copy.deepcopy(ready_status(script))
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for cond in status["conditions"]:
        if cond["type"] in ("Ready", "ContainersReady"):
            cond.update(status="False", reason="ContainersNotReady", lastTransitionTime=now)
    status["containerStatuses"][0]["ready"] = False
    return status


def test_a_policy_that_raises_costs_only_its_own_pods(chaos: Chaos) -> None:
    c = chaos
    site = str(plugin_site(c.env.tmp))  # added to what the process would import anyway
    c.env.start_controller(
        env={"PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}
    )
    timing = {"probe": "exec", "period_seconds": 1, "failure_threshold": 1, "timeout_seconds": 1}
    c.env.deathwatch("flaky", policy="flaky",
                     podSelector={"matchLabels": {"app": "sandbox", "judge": "flaky"}})  # fmt: skip
    c.env.deathwatch("builtin", policy="exec-probe", execProbe={"windowMultiplier": 1},
                     podSelector={"matchLabels": {"app": "sandbox", "judge": "builtin"}})  # fmt: skip
    flaky = c.sandboxes(1, "flaky", labels={"app": "sandbox", "judge": "flaky"}, **timing)[0]
    hung = c.sandboxes(2, "hung", labels={"app": "sandbox", "judge": "builtin"}, **timing)
    dropped = time.monotonic()
    for s in (flaky, *hung):
        c.env.kubelet.status(c.env.ns, s.name, not_ready(s))
    # the built-in pods' windows close on time: nothing the plugin does stops the deadlines
    for s in hung:
        dead = c.env.wait_state(s.name, "Dead", timeout=20)["status"]
        assert dead["cause"] == "Unresponsive"
    windows_closed = time.monotonic() - dropped
    # the plugin's pod: judged by container-state, marked, counted, logged once
    error = wait_for(lambda: condition(c.env.sv(flaky.name), "PolicyError", "True"), timeout=20,
                     what="PolicyError on the flaky pod's verdict")  # fmt: skip
    assert (c.env.sv(flaky.name) or {})["status"]["state"] == "Alive"
    assert "cannot decide once the window has closed" in error["message"]
    wait_for(lambda: _metric(c, "deathwatch_policy_errors_total", policy="flaky") >= 1,
             what="the policy's error counted")  # fmt: skip
    assert c.readyz()["details"]["pods_with_failing_policy"] == 1
    wait_for(lambda: c.logged("policy failed; the pod is judged by container-state until it works again"),
             what="the failure logged")  # fmt: skip
    # proof is still proof: its container exits -> Dead, with the exit code
    c.kill(flaky)
    assert c.env.wait_state(flaky.name, "Dead")["status"]["exitCode"] == 10
    c.killed.extend(s.name for s in hung)
    assert c.logged("policy failed; the pod is judged by container-state until it works again") == 1
    restarts = c.readyz()["details"]["task_restarts"]
    assert set(restarts.values()) == {0}, restarts
    c.verify("raising_plugin", None, builtin_windows_closed_after_seconds=round(windows_closed, 2))


def loosened_crd() -> str:
    """The DeathWatch CRD without the bounds on verdictRetention: what an older CRD, or a
    hand-edited one, lets through to the controller."""
    doc = yaml.safe_load((CRDS / "deathwatches.deathwatch.dev.yaml").read_text())
    props = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]
    for key in ("maxLength", "x-kubernetes-validations"):
        props["verdictRetention"].pop(key)
    return yaml.safe_dump(doc)


def test_an_absurd_deathwatch_is_refused_then_contained(chaos: Chaos) -> None:
    c = chaos
    # the shipped CRD refuses it at the door, saying why
    refused = c.env.cp.kubectl_run(
        "apply", "-n", c.env.ns, "-f", "-", check=False,
        input=json.dumps({"apiVersion": f"{GROUP}/{VERSION}", "kind": "DeathWatch",
                          "metadata": {"name": "absurd"}, "spec": {"verdictRetention": "100000000h"}}),
    )  # fmt: skip
    # ...naming the field, the bound and the format, with the value (never the "type
    # conversion error" of a CEL rule that failed to evaluate)
    assert refused.returncode != 0, refused.stderr
    for words in ("spec.verdictRetention", "at most 8760h", "Go duration", "100000000h"):
        assert words in refused.stderr, refused.stderr
    assert "conversion error" not in refused.stderr, refused.stderr
    # stored under an older CRD that let it through, then today's CRD applied
    current = str(CRDS / "deathwatches.deathwatch.dev.yaml")
    c.env.cp.kubectl_run(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=loosened_crd()
    )
    # the API server takes a CRD's new schema in a moment, not at once (seen on a loaded
    # machine: the create right after the apply was refused by the old one)
    absurd = json.dumps({"apiVersion": f"{GROUP}/{VERSION}", "kind": "DeathWatch",
                         "metadata": {"name": "absurd"}, "spec": {"verdictRetention": "100000000h"}})  # fmt: skip
    wait_for(lambda: c.env.cp.kubectl_run("apply", "--dry-run=server", "-n", c.env.ns, "-f", "-",
                                          check=False, input=absurd).returncode == 0,
             timeout=30, what="the loosened CRD in force")  # fmt: skip
    try:
        c.env.deathwatch("absurd", verdictRetention="100000000h",
                         podSelector={"matchLabels": {"app": "nothing"}})  # fmt: skip
        c.env.deathwatch("absurd-digits", verdictRetention="9" * 400 + "h",
                         podSelector={"matchLabels": {"app": "nothing-either"}})  # fmt: skip
        c.env.cp.kubectl_run("apply", "--server-side", "--force-conflicts", "-f", current)
        c.env.start_controller(extra=[])
        c.env.deathwatch("sandboxes", verdictRetention="3s")
        pods = c.sandboxes(2, "s")
        c.kill(pods[0])
        for name in ("absurd", "absurd-digits"):
            ready = wait_for(functools.partial(lambda n: condition(c.env.dw(n), "Ready", "False"), name),
                             what=f"{name} reported invalid")  # fmt: skip
            assert ready["reason"] == "InvalidSpec"
            assert "spec.verdictRetention" in ready["message"]
        # the healthy DeathWatch carries on: deaths judged, verdicts retired, status updated
        c.all_dead([pods[0]])
        c.env.kubelet.request_deletion(c.env.ns, pods[1].name, grace=0)
        c.env.wait_state(pods[1].name, "Gone")
        wait_for(lambda: c.env.sv(pods[1].name) is None, timeout=40, what="retention retired")
        wait_for(lambda: (c.env.dw().get("status") or {}).get("gone") == 0
                 and c.env.dw()["status"]["dead"] == 1, what="status updated")  # fmt: skip
        assert c.logged("deathwatch invalid") >= 2
        # their InvalidSpec status was written under today's CRD: nothing refused, no loop
        assert c.ctrl.metric("deathwatch_writes_refused_total") == 0
        assert c.logged("write refused") == 0
        assert set(c.readyz()["details"]["task_restarts"].values()) == {0}
        c.verify("absurd_deathwatch", None)
    finally:
        c.env.cp.kubectl_run("apply", "--server-side", "--force-conflicts", "-f",
                             str(CRDS / "deathwatches.deathwatch.dev.yaml"))  # fmt: skip


# --- the controller itself goes away -------------------------------------------------------


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_a_restart_keeps_retention_and_says_what_it_did_not_see(
    chaos: Chaos, signal_name: str
) -> None:
    import signal

    c = chaos
    c.env.start_controller()
    c.env.deathwatch(verdictRetention="20s")
    dies, deleted_while_down, lives = c.sandboxes(3, "r")
    c.kill(dies)
    c.all_dead([dies])
    c.env.kubelet.request_deletion(c.env.ns, dies.name, grace=0)  # its retention clock starts
    wait_for(lambda: (c.env.sv(dies.name) or {}).get("status", {}).get("podDeletedAt"),
             what="podDeletedAt persisted")  # fmt: skip
    deleted_at = time.monotonic()
    c.ctrl.stop(getattr(signal, signal_name))
    c.env.kubelet.status(c.env.ns, deleted_while_down.name, fate_status(deleted_while_down))
    c.env.kubelet.request_deletion(c.env.ns, deleted_while_down.name, grace=0)
    c.env.start_controller()
    restarted = time.monotonic()
    gone = c.env.wait_state(deleted_while_down.name, "Gone", timeout=60)["status"]
    told = time.monotonic() - restarted  # how long until the restarted controller said so
    assert gone["cause"] == "Unobserved"
    assert len(wait_for(lambda: c.env.events(deleted_while_down.name, "SandboxLostTrack"),
                        what="SandboxLostTrack")) == 1  # fmt: skip
    # the restored Dead verdict retires on its own clock, not never
    wait_for(lambda: c.env.sv(dies.name) is None, timeout=60, what="the restored verdict retired")
    retired_after = time.monotonic() - deleted_at
    assert retired_after < 20 + 25, retired_after  # retention + retire and lookup intervals
    c.env.wait_state(lives.name, "Alive")
    c.verify(f"restart_{signal_name.lower()}", told, retired=(dies.name,),
             retired_after_seconds=round(retired_after, 1), unobserved=1)  # fmt: skip
