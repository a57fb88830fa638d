"""A node's firewall coverage, as its agent claims it on a Lease and the controller reads it.

One `coordination.k8s.io/v1` Lease per node (`PREFIX.NODE`, label
`app.kubernetes.io/component: firewall-coverage`), renewed at every resync of the node's
agent: "this node is shielded, with this config, until renewTime + leaseDurationSeconds"
(ADR 0012). What the agent enforces rides in its annotations. Pure: the format and its
reading, written once and shared by both sides (the agent writes it: firewall/coverage.py;
the controller reads it: the judging of `Shielded`), so neither can drift from the other.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from deathwatch._kube.selector import Selector, SelectorError, parse_selector

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

PREFIX: Final = "deathwatch.dev/"
NODE, CONFIG, CONFIG_FILE, RULE = (f"{PREFIX}{k}" for k in ("node", "config", "config-file",
                                                            "rule"))  # fmt: skip
POD_CIDRS, AGENT_PORTS, INBOUND, SANDBOXES = (
    f"{PREFIX}{k}" for k in ("pod-cidrs", "agent-ports", "inbound", "sandboxes")
)
# every node's host addresses inside the pod ranges, as the inbound rule refuses them: how
# many, and the nodes whose addresses could not be learned ("*": the nodes were not listed)
HOST_ADDRESSES, HOSTS_UNKNOWN = f"{PREFIX}host-addresses", f"{PREFIX}hosts-unknown"
# why the inbound rule waits for complete pod ranges: "" it does not, "*" the nodes were not
# listed (or none has a podCIDR), else the nodes with no spec.podCIDRs (podCIDRs not given)
POD_RANGES_UNKNOWN: Final = f"{PREFIX}pod-ranges-unknown"
# the output rule as the agent last measured it: verified, bypassed, inconclusive or none
RULE_MEASURED: Final = f"{PREFIX}rule-measured"
# enforce (refused) or audit (counted and let through: its sandboxes are not shielded)
MODE: Final = f"{PREFIX}mode"
# what the agent guards (ADR 0029): its table (inet TABLE), the label selector that picks its
# node's sandboxes, and the addresses its inbound rule holds (absent: inbound not enforced);
# how many times its table was replaced or removed under it and repaired, when last
TABLE, SANDBOX_SELECTOR, GUARDED = (f"{PREFIX}{k}" for k in ("table", "sandbox-selector",
                                                             "guarded"))  # fmt: skip
REPAIRS, REPAIRED_AT = f"{PREFIX}repairs", f"{PREFIX}repaired-at"
# which pods the inbound rule guards: "deathwatches" (the pods the DeathWatches select, the
# default: ADR 0037), or "selector" (the operator's sandbox selector, noted above)
SANDBOXES_FROM: Final = f"{PREFIX}sandboxes-from"
# the older release whose firewall holds this agent's table (NAMESPACE/RELEASE): this agent
# leaves it alone (ADR 0038); absent: none
TABLE_HELD_BY: Final = f"{PREFIX}table-held-by"
FROM_DEATHWATCHES, FROM_SELECTOR = "deathwatches", "selector"

COMPONENT: Final = "firewall-coverage"
LABELS: Final = {"app.kubernetes.io/name": "deathwatch", "app.kubernetes.io/component": COMPONENT}
SELECTOR: Final = f"app.kubernetes.io/component={COMPONENT}"
LEASE_PREFIX: Final = "deathwatch-firewall"  # the chart: FULLNAME-firewall (--lease-prefix)
# published at every resync; valid for 1.5 of them, so one late renewal is not a gap, and a
# stopped agent is seen within 2 resyncs
VALIDITY: Final = 1.5
IN_FORCE, MISSING, CONTESTED = "in-force", "missing", "contested"  # the rule's annotation


def lease_name(node: str, prefix: str = LEASE_PREFIX) -> str:
    """PREFIX.NODE; hashed where that would pass the 253 characters an object name may have
    (the chart's admission policy then checks the node annotation alone)."""
    name = f"{prefix}.{node}"
    if len(name) > 253:
        name = f"{prefix}.{hashlib.sha256(node.encode()).hexdigest()[:32]}"
    return name


@dataclass(frozen=True, slots=True)
class NodeCoverage:
    """One node's claim, as its Lease says it."""

    node: str
    holder: str
    renew_time: str  # as written: a change of it is a renewal
    renewed_at: datetime | None
    valid_for: float
    config: str  # the digest of the config the table was made for
    config_file: str  # the mounted file's config digest ("invalid": the agent refused it)
    rule_in_force: bool
    pod_cidrs: tuple[Network, ...]
    agent_ports: frozenset[int]
    inbound: bool
    # nodes whose hosts' addresses in the pod ranges the agent does not know ("*": nodes not
    # listed at all): their hosts could pass the inbound rule from a tunnel address
    hosts_unknown: str = ""
    # nodes with no pod range while none is configured ("*": not listed): inbound waits
    pod_ranges_unknown: str = ""
    measured: str = ""  # the agent's self-check of its output rule ("": an older agent)
    mode: str = "enforce"  # enforce, or audit ("enforce": an older agent, which only enforced)
    table: str = "deathwatch"
    # its sandbox selector (None: it guards the DeathWatches' pods, or an older agent)
    selector: str | None = None
    guarded: frozenset[str] | None = None  # the inbound rule's addresses (None: not said)
    repairs: int = 0  # times its table was replaced under it and repaired
    repaired_at: str = ""  # when last ("": never)
    contested: bool = False  # replaced again and again: another writer of the same table
    sandboxes: int | None = None  # this node's sandboxes as last listed (None: unknown)
    host_addresses: int = 0  # every node's host addresses in the pod ranges, refused inbound
    held_by: str = ""  # the release whose firewall holds its table ("": none; ADR 0038)


def stamp(at: datetime) -> str:
    """A Lease's MicroTime, as the API writes it."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease(claim: NodeCoverage, namespace: str, prefix: str = LEASE_PREFIX) -> dict[str, Any]:
    """The Lease that says `claim` (its acquireTime is the API's business: `publish`)."""
    rule = CONTESTED if claim.contested else IN_FORCE if claim.rule_in_force else MISSING
    notes = {
        NODE: claim.node,
        CONFIG: claim.config,
        CONFIG_FILE: claim.config_file,
        RULE: rule,
        POD_CIDRS: ",".join(str(n) for n in claim.pod_cidrs),
        AGENT_PORTS: ",".join(str(p) for p in sorted(claim.agent_ports)),
        INBOUND: "true" if claim.inbound else "false",
        SANDBOXES: "unknown" if claim.sandboxes is None else str(claim.sandboxes),
        HOST_ADDRESSES: str(claim.host_addresses),
        HOSTS_UNKNOWN: claim.hosts_unknown,
        POD_RANGES_UNKNOWN: claim.pod_ranges_unknown,
        RULE_MEASURED: claim.measured,
        MODE: claim.mode,
        TABLE: claim.table,
        REPAIRS: str(claim.repairs),
    }
    if claim.selector is not None:
        notes[SANDBOX_SELECTOR] = claim.selector
    notes[SANDBOXES_FROM] = FROM_DEATHWATCHES if claim.selector is None else FROM_SELECTOR
    if claim.held_by:
        notes[TABLE_HELD_BY] = claim.held_by
    if claim.guarded is not None:
        notes[GUARDED] = ",".join(sorted(claim.guarded, key=_address_order))
    if claim.repaired_at:
        notes[REPAIRED_AT] = claim.repaired_at
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(claim.node, prefix),
            "namespace": namespace,
            "labels": dict(LABELS),
            "annotations": notes,
        },
        "spec": {
            "holderIdentity": claim.holder,
            "leaseDurationSeconds": max(1, round(claim.valid_for)),
            "renewTime": claim.renew_time,
        },
    }


def read(lease: Mapping[str, Any]) -> NodeCoverage | None:
    """A coverage Lease read back; None when it is not one (or unreadable: then it counts as
    no agent, which is what an unreadable claim is worth)."""
    meta = lease.get("metadata") or {}
    spec = lease.get("spec") or {}
    notes = meta.get("annotations") or {}
    node = notes.get(NODE)
    if not node:
        return None
    try:
        cidrs = tuple(
            ipaddress.ip_network(c) for c in str(notes.get(POD_CIDRS, "")).split(",") if c
        )
        ports = frozenset(int(p) for p in str(notes.get(AGENT_PORTS, "")).split(",") if p)
        valid_for = float(spec.get("leaseDurationSeconds") or 0)
        repairs = int(notes.get(REPAIRS) or 0)
        guarded = (
            frozenset(str(ipaddress.ip_address(a)) for a in str(notes[GUARDED]).split(",") if a)
            if GUARDED in notes
            else None
        )
        selector = str(notes[SANDBOX_SELECTOR]) if SANDBOX_SELECTOR in notes else None
        if selector is not None:
            selection(selector)  # a claim whose selector cannot be read is no claim
        counted = str(notes.get(SANDBOXES, "unknown"))
        sandboxes = None if counted == "unknown" else int(counted)
        host_addresses = int(notes.get(HOST_ADDRESSES) or 0)
        renew = str(spec.get("renewTime") or "")
        renewed_at = datetime.fromisoformat(renew) if renew else None
    except (ValueError, SelectorError):
        return None
    rule = notes.get(RULE)
    return NodeCoverage(
        node=node,
        holder=str(spec.get("holderIdentity") or ""),
        renew_time=renew,
        renewed_at=renewed_at,
        valid_for=valid_for,
        config=str(notes.get(CONFIG, "")),
        config_file=str(notes.get(CONFIG_FILE, "")),
        rule_in_force=rule == IN_FORCE,
        pod_cidrs=cidrs,
        agent_ports=ports,
        inbound=notes.get(INBOUND) == "true",
        hosts_unknown=str(notes.get(HOSTS_UNKNOWN, "")),
        pod_ranges_unknown=str(notes.get(POD_RANGES_UNKNOWN, "")),
        measured=str(notes.get(RULE_MEASURED, "")),
        mode=str(notes.get(MODE) or "enforce"),
        table=str(notes.get(TABLE) or "deathwatch"),
        selector=selector,
        guarded=guarded,
        repairs=repairs,
        repaired_at=str(notes.get(REPAIRED_AT, "")),
        contested=rule == CONTESTED,
        sandboxes=sandboxes,
        host_addresses=host_addresses,
        held_by=str(notes.get(TABLE_HELD_BY, "")),
    )


_SELECTIONS: dict[str, Selector] = {}


def selection(text: str) -> Selector:
    """An agent's sandbox selector, parsed once (a fleet's agents share one or a few); empty
    selects every pod. Raises SelectorError for one that cannot be read."""
    found = _SELECTIONS.get(text)
    if found is None:
        found = parse_selector(text) if text.strip() else Selector()
        if len(_SELECTIONS) < 64:
            _SELECTIONS[text] = found
    return found


def _address_order(text: str) -> tuple[int, int]:
    a = ipaddress.ip_address(text)
    return a.version, int(a)


def nodes(names: Iterable[str] | None, shown: int = 20) -> str:
    """Nodes named in an annotation: "" none, "*" unknown (None), more than `shown` counted."""
    if names is None:
        return "*"
    listed = list(names)
    more = len(listed) - shown
    return ",".join(listed[:shown]) + (f",+{more}" if more > 0 else "")
