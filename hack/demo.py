"""The demo: deathwatch installed the way a cluster operator does, on this machine, judging
real sandboxes as they live and die.

    hack/demo.sh              (installs what is needed, then runs this)
    hack/demo.sh --scripted   (no node: the controller judges pods whose kubelet is played)

Builds both images from their Dockerfiles (cached), starts a whole cluster
(hack/localcluster/cluster.py: control plane, scheduler, a kubelet + containerd node,
kube-proxy in nftables mode), applies manifests/overlays/local-node, waits for both
rollouts, creates a DeathWatch and nine busybox sandboxes that listen on the agent port,
then makes them live, exit, get OOM-killed, hang or flap their exec probes, get deleted, and
shows `kubectl get dw,sv` as it goes, the firewall refusing the host, and the Events. Exit 0
when every verdict is the expected one. Where a node cannot run here it says so in one line
and plays kubelet instead (hack/demo_scripted.py).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config

from hack.localcluster import cluster
from hack.localcluster.agentpods import AGENT_PORT, EXEC_PROBE, OTHER_PORT, TCP_PROBE, agent_pod
from hack.localcluster.netns_tool import connect_once

NS = "sandboxes"
# name, readiness probe, what happens to it (seconds after all are up), expected verdict
FLEET: list[tuple[str, dict[str, Any] | None, tuple[str, float, str], str]] = [
    ("web-ide-1", None, ("lives", 0, ""), "Alive"),
    ("web-ide-2", EXEC_PROBE, ("lives", 0, ""), "Alive"),
    ("notebook-1", None, ("exit", 4, "1"), "Dead"),
    ("notebook-2", None, ("oom", 6, ""), "Dead"),
    ("build-7", None, ("exit", 8, "137"), "Dead"),
    ("repl-1", None, ("delete", 10, ""), "Gone"),
    ("agent-flappy", EXEC_PROBE, ("flap", 5, ""), "Alive"),
    ("agent-hung", EXEC_PROBE, ("hang", 7, ""), "Dead"),
    ("agent-tcp", TCP_PROBE, ("lives", 0, ""), "Pending"),
]
DEATHWATCH = {
    "apiVersion": "deathwatch.dev/v1alpha1",
    "kind": "DeathWatch",
    "metadata": {"name": "sandboxes", "namespace": NS},
    "spec": {
        "podSelector": {"matchLabels": {"app": "sandbox"}},
        "policy": "auto",
        "execProbe": {"windowMultiplier": 2},  # W = 2 x (1 x 1 s + 1 s) = 4 s
        "agentPorts": [AGENT_PORT],
        "verdictRetention": "1h",
    },
}


def real() -> int:
    started = time.monotonic()
    print("building the images from the Dockerfiles (cached) and starting a local cluster...")
    with cluster.running() as c:
        print(f"  cluster up in {time.monotonic() - started:.0f}s: control plane, scheduler, "
              f"node dw-node (containerd, kubelet, kube-proxy nftables)")  # fmt: skip
        for image in c.images.values():
            print(f"  image {image.name}: {image.bytes_uncompressed / 1e6:.0f} MB")
        c.kubectl("apply", "--server-side", "-k", str(cluster.OVERLAY))
        took = cluster.wait_rollouts(c)
        print(f"kubectl apply -k manifests/overlays/local-node: both rolled out in {took:.0f}s")
        print(c.kubectl("get", "pods", "-n", "deathwatch-system").stdout.rstrip())
        configuration = client.Configuration()
        config.load_kube_config(
            config_file=str(c.cp.kubeconfig), client_configuration=configuration
        )
        with client.ApiClient(configuration) as api:
            return _play(c, client.CoreV1Api(api), client.CustomObjectsApi(api), started)


def _until(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def _show(c: cluster.Cluster, title: str) -> None:
    print(f"\n--- {title} " + "-" * max(0, 70 - len(title)))
    print(c.kubectl("get", "dw,sv", "-n", NS, check=False).stdout.rstrip() or "(nothing yet)")


def _states(custom: client.CustomObjectsApi) -> dict[str, str]:
    items = custom.list_namespaced_custom_object(
        "deathwatch.dev", "v1alpha1", NS, "sandboxverdicts", _request_timeout=10
    )["items"]
    return {i["metadata"]["name"]: (i.get("status") or {}).get("state", "") for i in items}


def _play(c: cluster.Cluster, core: client.CoreV1Api, custom: client.CustomObjectsApi,
          started: float) -> int:  # fmt: skip
    c.kubectl("create", "namespace", NS)
    # the demo's sandboxes mount their control directory from the host: not baseline's
    c.kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=privileged")
    _until(lambda: core.list_namespaced_service_account(NS, _request_timeout=10).items, 30,
           "the namespace's ServiceAccount")  # fmt: skip
    c.kubectl("apply", "-f", "-", input=json.dumps(DEATHWATCH))
    ctl: dict[str, Path] = {}
    for name, probe, _, _ in FLEET:
        ctl[name] = c.node.ctl(f"{NS}-{name}")
        core.create_namespaced_pod(NS, agent_pod(name, ctl[name], probe=probe), _request_timeout=30)
    expected = {name: state for name, *_, state in FLEET}
    try:
        _until(lambda: all(_states(custom).get(n) == "Alive" for n, s in expected.items() if s != "Pending"),
               90, "every sandbox Alive")  # fmt: skip
    except TimeoutError:
        print(c.diagnose(), file=sys.stderr)
        raise
    print(f"\n{len(FLEET)} sandboxes running (busybox, listening on the agent port {AGENT_PORT})")
    sandbox = core.read_namespaced_pod("web-ide-1", NS, _request_timeout=10).status.pod_ip
    print("the node firewall, from the host:"
          f" -> {sandbox}:{AGENT_PORT} {connect_once(sandbox, AGENT_PORT, 2)[0]},"
          f" -> {sandbox}:{OTHER_PORT} {connect_once(sandbox, OTHER_PORT, 2)[0]}")  # fmt: skip
    t0 = time.monotonic()
    actions = sorted(
        (at, name, what, arg) for name, _, (what, at, arg), _ in FLEET if what != "lives"
    )
    shown = t0
    for at, name, what, arg in actions:
        while time.monotonic() - t0 < at:
            if time.monotonic() - shown >= 4:
                _show(c, f"t+{time.monotonic() - t0:.0f}s")
                shown = time.monotonic()
            time.sleep(0.1)
        if what == "exit":
            (ctl[name] / "exit").write_text(arg)
        elif what == "oom":
            (ctl[name] / "oom").write_text("")
        elif what in ("hang", "flap"):
            (ctl[name] / "unready").write_text("")
        elif what == "delete":
            core.delete_namespaced_pod(name, NS, _request_timeout=10)
        print(f"  t+{at:.0f}s {name}: {what} {arg}".rstrip())
        if what == "flap":  # back before its 4 s window closes
            time.sleep(2)
            (ctl[name] / "unready").unlink()
            print(f"  t+{time.monotonic() - t0:.0f}s {name}: ready again")
    try:
        _until(lambda: _states(custom) == expected, 60, "the expected verdicts")
        dead = sum(1 for s in expected.values() if s == "Dead")
        _until(lambda: (_dw(custom).get("status") or {}).get("dead") == dead, 30, "the summary")
        # the firewall's coverage is read from its DaemonSet every 15 s: one read at least
        _until(lambda: ((_dw(custom).get("status") or {}).get("firewall") or {}).get("summary")
               == "1/1", 30, "the firewall's coverage")  # fmt: skip
    except TimeoutError as exc:
        print(f"\n{exc}")
    _show(c, "final verdicts")
    print(c.kubectl("get", "sv", "-n", NS, "-o", "wide").stdout.rstrip())
    _summary(_dw(custom))
    print("\n--- Events on the pods " + "-" * 48)
    print(c.kubectl("get", "events", "-n", NS, "--field-selector", "source=deathwatch", "-o",
                    "custom-columns=REASON:.reason,POD:.involvedObject.name,MESSAGE:.message").stdout.rstrip())  # fmt: skip
    got = _states(custom)
    wrong = {n: (got.get(n), s) for n, s in expected.items() if got.get(n) != s}
    if wrong:
        print(f"\nunexpected verdicts (got, expected): {wrong}")
        return 1
    print(
        f"\nall {len(expected)} verdicts as expected; demo took {time.monotonic() - started:.0f}s"
    )
    return 0


def _dw(custom: client.CustomObjectsApi) -> dict[str, Any]:
    dw: dict[str, Any] = custom.get_namespaced_custom_object(
        "deathwatch.dev", "v1alpha1", NS, "deathwatches", "sandboxes", _request_timeout=10
    )
    return dw


def _summary(dw: dict[str, Any]) -> None:
    st = dw.get("status", {})
    print("\n--- DeathWatch sandboxes: summary " + "-" * 37)
    keys = ("tracked", "pending", "alive", "suspect", "dead", "gone", "flaps", "falsePositives")
    print("  " + ", ".join(f"{k} {st.get(k, 0)}" for k in keys))
    print(f"  firewall coverage {st.get('firewall', {}).get('summary')}")
    for cond in st.get("conditions", []):
        print(f"  {cond['type']}={cond['status']} ({cond['reason']}): {cond['message']}")
    for d in st.get("lastDeaths", []):
        print(f"    {d['name']:<14} {d['cause']:<14} exit {d.get('exitCode', '-')!s:<4} "
              f"policy {d['policy']}")  # fmt: skip


def main(argv: list[str]) -> int:
    if "--scripted" in argv:
        from hack.demo_scripted import scripted

        return scripted()
    reason = cluster.available()
    if reason:
        from hack.demo_scripted import scripted

        print(f"no real node here ({reason}): the controller judges pods whose kubelet is played")
        return scripted()
    return real()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
