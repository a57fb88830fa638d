"""The demo where no real node can run (not root, no cgroups): a real control plane, the
controller under its own ServiceAccount, a fleet of sandbox pods whose kubelet we play, and
the verdicts live as `kubectl get dw,sv` shows them.

    hack/demo.sh --scripted       (hack/demo.py falls back to it by itself)

Starts etcd + kube-apiserver + kube-controller-manager on loopback, installs the CRDs and
the controller's RBAC from manifests/, runs `deathwatch controller` with a TokenRequest token
of its ServiceAccount, and plays ~40 s of sandbox lives: some live, some die (exit codes,
OOMKilled, evicted), exec-probe sandboxes flap and recover or hang, some are deleted
normally, one has a tcpSocket probe on the agent port. Ends with the DeathWatch summary,
stops everything and removes its files. Exit 0 when every verdict is the expected one.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes import client, config

from hack.localcluster import controlplane
from hack.localcluster.controller_process import ControllerProcess, service_account_kubeconfig
from hack.localcluster.kubelet import Kubelet
from hack.localcluster.sandbox_script import Fate, SandboxScript

ROOT = Path(__file__).resolve().parent.parent

NS = "sandboxes"
DEATHWATCH = f"""
apiVersion: deathwatch.dev/v1alpha1
kind: DeathWatch
metadata: {{name: sandboxes, namespace: {NS}}}
spec:
  podSelector: {{matchLabels: {{app: sandbox}}}}
  policy: auto
  execProbe: {{windowMultiplier: 2}}
  agentPorts: [49983]
  verdictRetention: 1h
"""

# (name, fate, probe, start offset s, life s, extra) -> the verdict we expect at the end
FLEET: list[tuple[str, Fate, str, float, float, dict[str, object], str]] = [
    ("web-ide-1", Fate.LIVES, "none", 0, 30, {}, "Alive"),
    ("web-ide-2", Fate.LIVES, "exec", 1, 30, {}, "Alive"),
    ("notebook-1", Fate.EXITS, "none", 2, 6, {"exit_code": 1}, "Dead"),
    ("notebook-2", Fate.OOM, "none", 3, 9, {}, "Dead"),
    ("build-7", Fate.EXITS, "none", 4, 14, {"exit_code": 137}, "Dead"),
    ("batch-3", Fate.EVICTED, "none", 5, 12, {}, "Dead"),
    ("repl-1", Fate.DELETED, "none", 6, 8, {}, "Gone"),
    ("repl-2", Fate.DELETED, "exec", 7, 10, {}, "Gone"),
    ("job-9", Fate.COMPLETES, "none", 8, 7, {}, "Gone"),
    (
        "agent-flappy",
        Fate.FLAPS,
        "exec",
        9,
        24,
        {"flaps": 2, "flap_length": timedelta(seconds=3)},
        "Alive",
    ),
    ("agent-hung", Fate.HANGS, "exec", 10, 8, {}, "Dead"),
    ("agent-tcp", Fate.LIVES, "tcp", 11, 20, {}, "Pending"),
]


def kubectl(cp: controlplane.ControlPlane, *args: str) -> str:
    return cp.kubectl_run(*args, check=False).stdout


def show(cp: controlplane.ControlPlane, title: str) -> None:
    print(f"\n--- {title} " + "-" * max(0, 70 - len(title)))
    print(kubectl(cp, "get", "dw,sv", "-n", NS).rstrip() or "(nothing yet)")


def scripted() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="deathwatch-demo-"))
    cp = controlplane.ControlPlane(workdir / "cp")
    controller: ControllerProcess | None = None
    started = time.monotonic()
    try:
        print("starting the local control plane (etcd, kube-apiserver, kube-controller-manager)...")
        cp.start()
        print(f"  up in {time.monotonic() - started:.1f}s at {cp.server}")
        cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests" / "base" / "crds"))
        cp.kubectl_run(
            "wait", "--for=condition=Established", "--timeout=60s",
            "crd/deathwatches.deathwatch.dev", "crd/sandboxverdicts.deathwatch.dev",
        )  # fmt: skip
        for ns in ("deathwatch-system", NS):
            cp.kubectl_run("create", "namespace", ns)
        cp.kubectl_run("apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / "controller.yaml"))
        cp.kubectl_run(
            "apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / "metrics-reader.yaml")
        )
        cp.kubectl_run(
            "create", "rolebinding", "deathwatch-controller", "-n", NS,
            "--clusterrole=deathwatch-controller", "--serviceaccount=deathwatch-system:deathwatch-controller",
        )  # fmt: skip
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
        api = client.ApiClient(configuration)
        core = client.CoreV1Api(api)
        deadline = time.monotonic() + 30
        while (
            True
        ):  # pods need the namespace's default ServiceAccount (made by the controller-manager)
            try:
                core.read_namespaced_service_account("default", NS, _request_timeout=5)
                break
            except client.ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        sa_kubeconfig = service_account_kubeconfig(
            cp, api, "deathwatch-system", "deathwatch-controller", workdir / "controller.kubeconfig"
        )
        controller = ControllerProcess(sa_kubeconfig, [NS], workdir / "controller.log").start()
        print("controller running under ServiceAccount deathwatch-system/deathwatch-controller")
        cp.kubectl_run("apply", "-f", "-", input=DEATHWATCH)

        t0 = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
        scripts = [
            SandboxScript(
                name=name,
                namespace=NS,
                fate=fate,
                probe=probe,  # type: ignore[arg-type]
                start=t0 + timedelta(seconds=offset),
                life=timedelta(seconds=life),
                period_seconds=2,
                failure_threshold=1,
                timeout_seconds=1,
                **extra,  # type: ignore[arg-type]
            )
            for name, fate, probe, offset, life, extra, _ in FLEET
        ]
        print(
            f"\nplaying kubelet for {len(scripts)} sandbox pods for ~40 s (exec-probe window W = 6 s)"
        )
        player = threading.Thread(target=Kubelet(api).play, args=(scripts,), daemon=True)
        player.start()
        while player.is_alive():
            player.join(5)
            show(cp, f"t+{(datetime.now(UTC) - t0).total_seconds():.0f}s")
        # the hung sandbox's window closes 6 s after its drop; verdict writes are asynchronous
        expected = {name: state for name, *_, state in FLEET}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = {
                n: st
                for n, st in (
                    line.split()[:2]
                    for line in kubectl(cp, "get", "sv", "-n", NS, "--no-headers").splitlines()
                )
            }
            if all(got.get(n) == st for n, st in expected.items()):
                break
            time.sleep(0.5)
        # the DeathWatch status is published at most once a second: wait for it to catch up
        custom = client.CustomObjectsApi(api)
        want_dead = sum(1 for st in expected.values() if st == "Dead")
        dw: dict[str, Any] = {}
        while time.monotonic() < deadline:
            dw = custom.get_namespaced_custom_object(
                "deathwatch.dev", "v1alpha1", NS, "deathwatches", "sandboxes", _request_timeout=10
            )
            st = dw.get("status", {})
            if st.get("dead") == want_dead and st.get("suspect") == 0:
                break
            time.sleep(0.5)
        show(cp, "final verdicts")
        print(kubectl(cp, "get", "sv", "-n", NS, "-o", "wide").rstrip())
        st = dw.get("status", {})
        print("\n--- DeathWatch sandboxes: summary " + "-" * 37)
        print(
            "  "
            + ", ".join(
                f"{k} {st.get(k, 0)}"
                for k in (
                    "tracked",
                    "pending",
                    "alive",
                    "suspect",
                    "dead",
                    "gone",
                    "flaps",
                    "falsePositives",
                )
            )
        )
        for c in st.get("conditions", []):
            print(f"  {c['type']}={c['status']} ({c['reason']}): {c['message']}")
        print("  last deaths:")
        for d in st.get("lastDeaths", []):
            exit_code = d.get("exitCode", "-")
            print(
                f"    {d['name']:<14} {d['cause']:<16} exit {exit_code!s:<4} policy {d['policy']:<11} Ready dropped {d.get('readyDropAt')}, declared {d['declaredAt']}"
            )
        print("\n--- Events on the pods " + "-" * 48)
        print(kubectl(cp, "get", "events", "-n", NS, "--field-selector", "source=deathwatch", "-o",
                      "custom-columns=REASON:.reason,POD:.involvedObject.name,MESSAGE:.message").rstrip())  # fmt: skip
        wrong = {n: (got.get(n), st) for n, st in expected.items() if got.get(n) != st}
        if wrong:
            print(f"\nunexpected verdicts (got, expected): {wrong}")
            print(controller.tail())
            return 1
        print(
            f"\nall {len(expected)} verdicts as expected; demo took {time.monotonic() - started:.0f}s"
        )
        return 0
    finally:
        if controller is not None:
            controller.stop()
        cp.destroy()
        shutil.rmtree(workdir, ignore_errors=True)
        print("stopped the controller and the control plane; removed", workdir)


if __name__ == "__main__":
    sys.exit(scripted())
