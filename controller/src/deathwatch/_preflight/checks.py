"""What a cluster says about installing deathwatch, before it is installed: pure functions from
the objects read (`Cluster`) to findings, one line each with its fix.

Each check reads only what it names and says `skip` (with why) when that could not be read:
a preflight run with a narrow role still says what it can.
"""

from __future__ import annotations

import enum
import ipaddress
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from deathwatch._api.rules import Rules, SpecError, read_deathwatch
from deathwatch._engine.podview import NETWORK_PROBES, MalformedPod, PodView, read_pod
from deathwatch._policies import default_registry

# the Kubernetes minors the lanes run (hack/versions.env: K8S_VERSION, K8S_MATRIX); the oldest
# is the oldest supported (the chart's kubeVersion): DisruptionTarget is GA from 1.31 (ADR 0018)
TESTED: Final = ((1, 33), (1, 37))
SHOWN: Final = 5  # objects named in one finding; more are counted
SANDBOX_CRD: Final = "sandboxes.agents.x-k8s.io"
DEATHWATCH_CRD: Final = "deathwatches.deathwatch.dev"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Level(enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    level: Level
    said: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"check": self.check, "level": self.level.value, "said": self.said,
                "fix": self.fix}  # fmt: skip


@dataclass
class Cluster:
    """What was read; None where it could not be (`unreadable` says why)."""

    version: Mapping[str, Any] | None = None
    nodes: list[Mapping[str, Any]] | None = None
    pods: list[Mapping[str, Any]] | None = None
    daemonsets: list[Mapping[str, Any]] | None = None
    kube_proxy: Mapping[str, Any] | None = None  # ConfigMap kube-system/kube-proxy, if any
    cilium: Mapping[str, Any] | None = None  # ConfigMap kube-system/cilium-config, if any
    runtime_classes: list[Mapping[str, Any]] | None = None
    crds: set[str] | None = None  # the names of the CRDs present that matter here
    deathwatches: list[Mapping[str, Any]] | None = None
    unreadable: dict[str, str] = field(default_factory=dict)


def findings(cluster: Cluster, agent_ports: Iterable[int]) -> list[Finding]:
    ports = set(agent_ports) | _deathwatch_ports(cluster.deathwatches or [])
    return [
        kubernetes(cluster),
        pod_ranges(cluster),
        probes(cluster, ports),
        selectors(cluster),
        agent_sandbox(cluster),
        kube_proxy(cluster),
        cni(cluster),
        runtimes(cluster),
    ]


def _skip(check: str, cluster: Cluster, what: str) -> Finding:
    why = cluster.unreadable.get(what, "not read")
    return Finding(check, Level.SKIP, f"cannot read {what}: {why}", "run with a role that may")


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN])
    return f"{shown} and {len(items) - SHOWN} more" if len(items) > SHOWN else shown


def kubernetes(cluster: Cluster) -> Finding:
    if cluster.version is None:
        return _skip("kubernetes", cluster, "/version")
    said = str(cluster.version.get("gitVersion") or "?")
    try:
        minor = int(str(cluster.version.get("minor") or "").rstrip("+"))
        major = int(str(cluster.version.get("major") or ""))
    except ValueError:
        return Finding("kubernetes", Level.WARN, f"{said}: its version is not a number",
                       "check that this is a Kubernetes API server")  # fmt: skip
    (low_major, low), (high_major, high) = TESTED
    tested = f"{low_major}.{low} to {high_major}.{high}"
    if (major, minor) < TESTED[0]:
        return Finding("kubernetes", Level.FAIL,
                       f"{said}: older than {low_major}.{low}, the oldest release the lanes test "
                       "and the chart installs on",
                       f"upgrade the control plane (tested: {tested})")  # fmt: skip
    if (major, minor) > TESTED[1]:
        return Finding("kubernetes", Level.WARN,
                       f"{said}: newer than the releases the lanes test ({tested})",
                       "watch the first verdicts closely")  # fmt: skip
    return Finding("kubernetes", Level.OK, f"{said}: a release the lanes test ({tested})")


def pod_ranges(cluster: Cluster) -> Finding:
    if cluster.nodes is None:
        return _skip("pod-ranges", cluster, "nodes")
    ranges: set[Network] = set()
    unranged: list[str] = []
    for node in cluster.nodes:
        spec = node.get("spec") or {}
        cidrs = [c for c in (spec.get("podCIDRs") or [spec.get("podCIDR")]) if isinstance(c, str)]
        found = [n for n in (_network(c) for c in cidrs) if n is not None]
        ranges.update(found)
        if not found:
            unranged.append(str((node.get("metadata") or {}).get("name")))
    outside: list[str] = []
    for pod in cluster.pods or []:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if spec.get("hostNetwork") or not status.get("podIP"):
            continue
        address = _address(str(status["podIP"]))
        if address is not None and not any(address in n for n in ranges):
            meta = pod.get("metadata") or {}
            outside.append(f"{meta.get('namespace')}/{meta.get('name')} ({address})")
    learned = ", ".join(str(n) for n in sorted(ranges, key=_order)) or "none"
    fix = ("set firewall.podCIDRs to the CNI's pod ranges (its IPAM: Calico IP pools, the VPC's "
           "pod subnets): the agents add them to the nodes'")  # fmt: skip
    if unranged or outside:
        parts = []
        if unranged:
            parts.append(f"{len(unranged)} node(s) without spec.podCIDRs ({_names(unranged)})")
        if outside:
            parts.append(f"{len(outside)} pod(s) outside the nodes' ranges ({_names(outside)})")
        return Finding("pod-ranges", Level.WARN,
                       f"{'; '.join(parts)}: the CNI has its own IPAM; without podCIDRs the "
                       f"inbound rule waits (Shielded=False PodRangesUnknown). Nodes': {learned}",
                       fix)  # fmt: skip
    return Finding("pod-ranges", Level.OK,
                   f"every node has a podCIDR and every pod is in one ({learned}): the agents "
                   "learn them, firewall.podCIDRs can stay empty")  # fmt: skip


def probes(cluster: Cluster, agent_ports: set[int]) -> Finding:
    if cluster.pods is None:
        return _skip("probes", cluster, "pods")
    dies: list[str] = []
    stalls: list[str] = []
    for pod in cluster.pods:
        for kind, port in _network_probes(pod):
            if port not in agent_ports:
                continue
            meta = pod.get("metadata") or {}
            said = f"{meta.get('namespace')}/{meta.get('name')} ({kind} on {port})"
            (dies if kind == "livenessProbe" else stalls).append(said)
    ports = ", ".join(str(p) for p in sorted(agent_ports))
    if not dies and not stalls:
        return Finding("probes", Level.OK,
                       f"no pod has a kubelet probe on an agent port ({ports})")  # fmt: skip
    fix = "give them exec probes (the kubelet probes from the host, which the firewall refuses)"
    if dies:
        return Finding("probes", Level.FAIL,
                       f"{len(dies)} pod(s) have a liveness probe on an agent port: the firewall "
                       f"would have them restarted for ever ({_names(dies)})"
                       + (f"; {len(stalls)} more never Ready" if stalls else ""), fix)  # fmt: skip
    return Finding("probes", Level.WARN,
                   f"{len(stalls)} pod(s) have a readiness or startup probe on an agent port: "
                   f"never Ready under the firewall ({_names(stalls)})", fix)  # fmt: skip


def selectors(cluster: Cluster) -> Finding:
    if cluster.crds is None:
        return _skip("selectors", cluster, "customresourcedefinitions")
    if DEATHWATCH_CRD not in cluster.crds:
        return Finding("selectors", Level.SKIP,
                       "deathwatch is not installed: no DeathWatch selects anything yet",
                       "after install, a DeathWatch per namespace (spec.podSelector; an empty "
                       "one selects every pod)")  # fmt: skip
    if cluster.deathwatches is None or cluster.pods is None:
        return _skip(
            "selectors", cluster, "deathwatches" if cluster.deathwatches is None else "pods"
        )
    registry = default_registry()
    rules: list[Rules] = []
    broken: list[str] = []
    for body in cluster.deathwatches:
        meta = body.get("metadata") or {}
        try:
            rules.append(read_deathwatch(body, registry))
        except SpecError as exc:
            broken.append(f"{meta.get('namespace')}/{meta.get('name')}: {exc}")
    views: dict[str, list[PodView]] = {}
    for pod in cluster.pods:
        try:
            view = read_pod(pod)
        except MalformedPod:
            continue
        views.setdefault(view.namespace, []).append(view)
    per: list[str] = []
    everything: list[str] = []
    for r in rules:
        pods = views.get(r.namespace, [])
        chosen = sum(1 for p in pods if r.selects(p))
        per.append(f"{r.namespace}/{r.name} {chosen} of {len(pods)}")
        if not r.selector.requirements and r.sandboxes is None:
            everything.append(f"{r.namespace}/{r.name}")
    if broken:
        return Finding("selectors", Level.FAIL, f"DeathWatches refused: {_names(broken)}",
                       "fix the field each names")  # fmt: skip
    if not rules:
        return Finding("selectors", Level.WARN, "no DeathWatch yet: nothing is judged",
                       "create one per namespace of sandboxes (manifests/examples)")  # fmt: skip
    said = f"pods selected: {_names(per)}"
    if everything:
        return Finding("selectors", Level.WARN,
                       f"{said}; an empty podSelector selects every pod of its namespace "
                       f"({_names(everything)})", "select the sandboxes by a label")  # fmt: skip
    return Finding("selectors", Level.OK, said)


def agent_sandbox(cluster: Cluster) -> Finding:
    if cluster.crds is None:
        return _skip("agent-sandbox", cluster, "customresourcedefinitions")
    if SANDBOX_CRD in cluster.crds:
        said = (
            "installed: a DeathWatch with spec.sandboxes: agent-sandbox judges its "
            "Sandboxes' pods, and verdicts name Sandbox, claim and warm pool"
        )
        return Finding("agent-sandbox", Level.OK, said)
    return Finding("agent-sandbox", Level.OK,
                   "not installed: DeathWatches select pods by spec.podSelector (picked up "
                   "without a restart if it is installed later)")  # fmt: skip


def kube_proxy(cluster: Cluster) -> Finding:
    if cluster.daemonsets is None:
        return _skip("kube-proxy", cluster, "daemonsets")
    running = any(_named(ds) == "kube-proxy" for ds in cluster.daemonsets)
    if cluster.kube_proxy is None and not running:
        return Finding("kube-proxy", Level.WARN,
                       "no kube-proxy DaemonSet or ConfigMap: Services are another component's "
                       "(a CNI's replacement), which the lanes do not test",
                       "after install, check that a host's connection to a sandbox's Service "
                       "is refused (docs/threat-model.md)")  # fmt: skip
    mode = ""
    if cluster.kube_proxy is not None:
        text = (cluster.kube_proxy.get("data") or {}).get("config.conf") or ""
        try:
            conf = yaml.safe_load(text) or {}
        except yaml.YAMLError:
            conf = {}
        mode = str(conf.get("mode") or "") if isinstance(conf, dict) else ""
    said = {
        "": "iptables (the default)",
        "iptables": "iptables",
        "nftables": "nftables (tested)",
        "ipvs": "IPVS: a pod's Service connection leaves with the pod's source and passes",
    }.get(mode, mode)
    return Finding("kube-proxy", Level.OK,
                   f"mode {said}: the output rule judges a host's Service connection after "
                   "its DNAT (priority -90)")  # fmt: skip


# DaemonSet name -> (the CNI, whether pods take their node's podCIDR, what to know)
_CNIS: Final[dict[str, tuple[str, bool, str]]] = {
    "calico-node": (
        "Calico",
        False,
        "IP pools: set firewall.podCIDRs to them; its tunnel "
        "addresses are learned from the node annotations",
    ),
    "cilium": (
        "Cilium",
        True,
        "kubernetes IPAM uses the nodes' podCIDRs (cluster-pool IPAM "
        "does not: set firewall.podCIDRs)",
    ),
    "kube-flannel-ds": ("flannel", True, "the nodes' podCIDRs"),
    "kube-flannel": ("flannel", True, "the nodes' podCIDRs"),
    "kindnet": ("kindnet", True, "the nodes' podCIDRs"),
    "aws-node": ("AWS VPC CNI", False, "VPC addresses: set firewall.podCIDRs to the pod subnets"),
    "azure-cns": ("Azure CNI", False, "VNet addresses: set firewall.podCIDRs to the pod subnets"),
    "weave-net": ("Weave Net", False, "its own IPAM: set firewall.podCIDRs to its range"),
    "antrea-agent": ("Antrea", True, "the nodes' podCIDRs"),
    "kube-router": ("kube-router", True, "the nodes' podCIDRs"),
    "ovnkube-node": ("OVN-Kubernetes", False, "its own node subnets: set firewall.podCIDRs"),
}


def cni(cluster: Cluster) -> Finding:
    if cluster.daemonsets is None:
        return _skip("cni", cluster, "daemonsets")
    found = sorted({_CNIS[n] for n in (_named(ds) for ds in cluster.daemonsets) if n in _CNIS})
    if not found:
        return Finding("cni", Level.WARN,
                       "no CNI recognised from the DaemonSets (a bridge, or one not listed)",
                       "after install, check Shielded on the verdicts")  # fmt: skip
    said = "; ".join(f"{name}: {note}" for name, _, note in found)
    if any(name == "Cilium" for name, _, _ in found) and _cilium_bypasses_netfilter(cluster):
        return Finding("cni", Level.WARN,
                       f"{said}. With its kube-proxy replacement and BPF masquerading on a 5.10+ "
                       "kernel, its eBPF host routing hands packets to pods past the host's "
                       "netfilter: the inbound rule may never see them, while the verdicts say "
                       "Shielded=True",
                       "set enable-host-legacy-routing: true in cilium-config, or count on the "
                       "output rule (each node's own hosts) alone")  # fmt: skip
    level = Level.OK if all(node_ipam for _, node_ipam, _ in found) else Level.WARN
    fix = "" if level is Level.OK else "set firewall.podCIDRs (see pod-ranges)"
    return Finding("cni", level, said, fix)


# a RuntimeClass's handler -> (the runtime, whether a lane proves deathwatch on it). Tested: the
# node lane runs runc and gVisor's runsc on a real kubelet (docs/compatibility.md, "Runtimes");
# Kata and Firecracker are reasoned only (no nested KVM on the lanes' machines)
_RUNTIMES: Final[tuple[tuple[str, str, bool], ...]] = (
    ("runc", "runc", True),
    ("runsc", "gVisor", True),
    ("gvisor", "gVisor", True),  # GKE Sandbox's handler name
    ("kata", "Kata Containers", False),
    ("firecracker", "Firecracker", False),
    ("crun", "crun", False),
    ("youki", "youki", False),
)


def _runtime(handler: str) -> tuple[str, bool] | None:
    """What a handler name runs (kata-qemu, kata-fc: Kata; runsc-kvm: gVisor), None: unknown."""
    for prefix, runtime, tested in _RUNTIMES:
        if handler == prefix or handler.startswith(f"{prefix}-"):
            return runtime, tested
    return None


def runtimes(cluster: Cluster) -> Finding:
    if cluster.runtime_classes is None:
        return _skip("runtimes", cluster, "runtimeclasses")
    used: Counter[str] = Counter()
    for pod in cluster.pods or []:
        name = (pod.get("spec") or {}).get("runtimeClassName")
        if isinstance(name, str) and name:
            used[name] += 1
    said: list[str] = []
    untested: list[str] = []
    for rc in sorted(cluster.runtime_classes, key=_named):
        name, handler = _named(rc), str(rc.get("handler") or "")
        known = _runtime(handler)
        runtime, tested = known if known is not None else ("unknown", False)
        status = "tested" if tested else "reasoned" if known is not None else "not known here"
        pods = f", {used[name]} pod(s)" if used[name] else ""
        said.append(f"{name} ({handler}: {runtime}, {status}{pods})")
        if not tested and used[name]:
            untested.append(name)
    missing = sorted(n for n in used if n not in {_named(rc) for rc in cluster.runtime_classes})
    default = "pods without a runtimeClassName run the nodes' default (runc: tested)"
    if not said:
        return Finding("runtimes", Level.OK, f"no RuntimeClass: {default}")
    listed = f"RuntimeClasses: {_names(said)}; {default}"
    if untested or missing:
        parts = [f"pods run under {_names(untested)}, which no lane tests"] if untested else []
        if missing:
            parts.append(f"pods name RuntimeClasses that do not exist ({_names(missing)})")
        return Finding("runtimes", Level.WARN, f"{listed}. {'; '.join(parts)}",
                       "watch its first deaths' causes and exit codes closely "
                       "(docs/compatibility.md, Runtimes: what is reasoned there)")  # fmt: skip
    return Finding("runtimes", Level.OK, listed)


def _cilium_bypasses_netfilter(cluster: Cluster) -> bool:
    """Cilium's eBPF host routing (kernel 5.10+, with its kube-proxy replacement and BPF
    masquerading: its upgrade notes) sends packets to pods past the host's netfilter; legacy
    host routing (`enable-host-legacy-routing`, Helm `bpf.hostLegacyRouting`) keeps them on
    it. Without its ConfigMap nothing rules it out."""
    if cluster.cilium is None:
        return True
    data = cluster.cilium.get("data") or {}
    if str(data.get("enable-host-legacy-routing", "")).lower() == "true":
        return False
    replaced = str(data.get("kube-proxy-replacement", "")).lower() in ("true", "strict")
    return replaced and str(data.get("enable-bpf-masquerade", "")).lower() == "true"


def _network_probes(pod: Mapping[str, Any]) -> Iterable[tuple[str, int]]:
    for container in (pod.get("spec") or {}).get("containers") or []:
        named = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            probe = container.get(kind) or {}
            for how in sorted(NETWORK_PROBES):
                handler = probe.get(how)
                if not isinstance(handler, dict):
                    continue
                port = handler.get("port")
                if isinstance(port, str):
                    port = int(port) if port.isdigit() else named.get(port)
                if isinstance(port, int):
                    yield kind, port


def _deathwatch_ports(deathwatches: list[Mapping[str, Any]]) -> set[int]:
    ports: set[int] = set()
    for body in deathwatches:
        for port in (body.get("spec") or {}).get("agentPorts") or []:
            if isinstance(port, int):
                ports.add(port)
    return ports


def _named(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _network(text: str) -> Network | None:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _order(n: Network) -> tuple[int, int, int]:
    return (n.version, int(n.network_address), n.prefixlen)


def summary(found: list[Finding]) -> Counter[str]:
    return Counter(f.level.value for f in found)
