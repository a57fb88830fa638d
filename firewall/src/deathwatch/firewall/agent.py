"""The node agent: keep the table exactly as configured, for as long as it runs.

Every resync: reload the config if the file changed (a bad new config is logged and counted
and the previous rule stays in force), read the live table back (`nft -j`), and if anything
differs (deleted, flushed, edited by someone else) replace the whole table atomically, then
read it back again to prove the repair. In a cluster (`ClusterLink`) it also lists the
sandbox pods of its node for the inbound rule before the sync (woken at once by a watch when
they change), and after it renews the node's coverage Lease (coverage.py). An API it cannot
reach leaves the last known sandboxes in force and the Lease unrenewed: the controller then
sees the node's coverage go stale. On SIGTERM the agent exits and leaves the table:
a DaemonSet rollout must never open the hole, not even between two pods. Removal is the
explicit `cleanup` command, or, when the agent is told to (`remove_on_uninstall`), its own
DaemonSet found gone or being deleted as it stops (uninstall.py).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import structlog

from deathwatch._kube.configfile import ConfigError
from deathwatch._kube.errors import KubeError, describe
from deathwatch._kube.ports import Heartbeat
from deathwatch._kube.releases import TABLE_CLASH, Collision
from deathwatch.firewall.config import (
    AUDIT,
    ENFORCE,
    FirewallConfig,
    Network,
    load_config,
)
from deathwatch.firewall.coverage import LEASE_PREFIX, NodeState, lease_body, publish
from deathwatch.firewall.deathwatches import DeathWatches, selections
from deathwatch.firewall.hosts import Hosts, NodeAddresses, host_addresses, ranges_unknown
from deathwatch.firewall.kubeapi import Api
from deathwatch.firewall.metrics import FirewallMetrics
from deathwatch.firewall.nft import Nft, NftError
from deathwatch.firewall.rivals import FirewallReleases, table_holder
from deathwatch.firewall.ruleset import (
    HOST,
    HOST_IN_POD_RANGE,
    OUTSIDE,
    Address,
    audited,
    desired,
    recorded,
)
from deathwatch.firewall.sandboxes import PodWatch, list_sandboxes
from deathwatch.firewall.selfcheck import Measured, measure
from deathwatch.firewall.table import Table, differences, dump_state
from deathwatch.firewall.uninstall import DaemonSetWatch, assess

log = structlog.get_logger("deathwatch.firewall")
AUDIT_LOGGED = 10  # new sources logged a resync, at most (the rest counted in one line)
AUDIT_REMEMBERED = 10_000  # sources remembered as logged
# replaced this many times within this many seconds: the table is contested (another writer)
CONTEST_REPAIRS, CONTEST_WINDOW = 3, 120.0


def _kind(chain: str, source: str, config: FirewallConfig | None) -> str:
    """Which kind of source an audit record is (ruleset.py's kinds)."""
    if chain == "out":
        return HOST
    try:
        address = ipaddress.ip_address(source)
    except ValueError:
        return OUTSIDE
    in_range = config is not None and any(address in n for n in config.pod_cidrs)
    return HOST_IN_POD_RANGE if in_range else OUTSIDE


@dataclass(frozen=True)
class ClusterLink:
    """Where the agent runs: the API, its node, its own pod, its namespace."""

    api: Api
    node: str
    identity: str
    namespace: str
    # its own DaemonSet: with it, a stop that finds the DaemonSet gone or being deleted (an
    # uninstall, never a rollout) removes the table; None: the table always stays
    remove_on_uninstall: str | None = None
    lease_prefix: str = LEASE_PREFIX  # its coverage Lease: PREFIX.NODE
    # its own DaemonSet (in `namespace`): with it, another release's older firewall on the
    # same table makes this agent leave the table alone (rivals.py, ADR 0038)
    daemonset: str | None = None


class Agent:
    def __init__(
        self,
        config_path: str | Path,
        nft: Nft,
        metrics: FirewallMetrics | None = None,
        link: ClusterLink | None = None,
        sandboxes: Sequence[Address] = (),
        hosts: Sequence[Address] = (),
        heartbeat: Heartbeat | None = None,
        state_file: Path | None = None,
    ) -> None:
        self.path = Path(config_path)
        # what it last applied, for its readiness probe (`check --state-file`): the table
        # holds what the config alone does not say (the nodes' pod ranges, the sandboxes)
        self.state_file = state_file
        self._state_written: bytes | None = None
        self.nft = nft
        self.metrics = metrics or FirewallMetrics()
        self.link = link
        self.heartbeat = heartbeat or Heartbeat(stalled_after=300.0)  # /healthz on its port
        self.config: FirewallConfig | None = None
        # the sandboxes of this node: listed from the API in a cluster, else as given
        self.sandboxes: tuple[Address, ...] = tuple(sandboxes)
        self._sandboxes_known = link is None
        # every node's host addresses inside the pod ranges: learned from the Node objects in
        # a cluster (unknown until they are listed), else as given
        self._given_hosts = tuple(hosts)
        outside = () if link is None else None  # outside a cluster: no node to learn from
        self.hosts = Hosts(self._given_hosts, outside, (), outside)
        self.nodes: NodeAddresses | None = None
        # the DeathWatches, whose pods are this node's sandboxes unless a selector is given
        self.deathwatches: DeathWatches | None = None
        # every release's firewall DaemonSet: whether another holds this agent's table
        self.releases: FirewallReleases | None = None
        self.held_by: Collision | None = None  # the older release holding the table
        self._releases_waited = False  # "waiting for the releases' DaemonSets" logged
        self._deathwatches_waited = False  # "waiting for the DeathWatches listing" logged
        self._file_digest = "invalid"  # the config the mounted file asks for
        self._in_force = False
        self.wake = threading.Event()
        self._digest: str | None = None
        self._rejected_seen = 0
        self._applied: Table | None = None  # what it last applied (or found in force)
        self._ranges_said: tuple[Network, ...] | None = None  # the pod ranges last logged
        self.daemonset: DaemonSetWatch | None = None  # with remove_on_uninstall: its own
        self.measured = Measured.NONE  # the output rule, as last measured (selfcheck.py)
        self._waiting_said = False  # "waiting for the Node listing" logged
        self._measured_turn = 0  # which of this node's sandboxes is tried next
        self._audited_seen: dict[tuple[str, int], int] = {}  # audit rules' counters, last read
        self._audit_logged: set[tuple[str, str, int, str]] = set()  # sources said already
        self._mode_said: str | None = None
        # the table replaced or removed under it: how often, when last, and whether that
        # keeps happening (contested: another writer of the same table)
        self.repairs = 0
        self.repaired_at: datetime | None = None
        self._recent_repairs: list[float] = []
        self.contested = False

    def reload(self) -> bool:
        """Pick up a changed config file. True when a new valid config took effect."""
        try:
            digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError as exc:
            digest = f"unreadable:{exc.strerror}"
        if digest == self._digest:
            return False
        self._digest = digest
        try:
            config = load_config(self.path)
        except ConfigError as exc:
            self._file_digest = "invalid"
            self.metrics.sync_failures.labels("config").inc()
            log.error(
                "config rejected; the previous rule stays in force",
                error=str(exc),
                in_force=self.config is not None,
            )
            return False
        changed = config != self.config
        if changed:
            log.info(
                "config loaded",
                pod_cidrs=[str(n) for n in config.pod_cidrs],
                agent_ports=list(config.agent_ports),
                resync_seconds=config.resync_seconds,
            )
        self.config = config
        self._file_digest = config.digest()
        return changed

    def sync(self) -> str:
        """Make the live table match the config. Returns unchanged, applied or repaired."""
        want = self._wanted()
        if want is None:
            raise NftError("no valid config yet: the table is left as it is")
        have = self.nft.list_table()
        diffs = differences(want, have)
        self._count_rejected(have)
        result = "unchanged"
        if diffs:
            # replaced or removed under it: the live table is not what it last applied (a
            # change of its own, a new sandbox or config or node label, is no repair)
            drift = differences(self._applied, have) if self._applied is not None else []
            result = "repaired" if drift else "applied"
            if drift:
                self._repaired(drift, have is None)
            for kind, port in audited(want):  # each series at 0 before it can count
                self.metrics.audited.labels(str(port), kind)
            started = time.perf_counter()
            self.nft.apply(want)
            self.metrics.apply_seconds.observe(time.perf_counter() - started)
            after = differences(want, self.nft.list_table())
            if after:
                self.metrics.rule_present.set(0)
                raise NftError(f"the table differs right after applying it: {after}")
            self._rejected_seen = 0  # a replaced table starts its counters at zero
            self._audited_seen = {}
        self._applied = want
        if self.contested and time.monotonic() - self._recent_repairs[-1] >= CONTEST_WINDOW:
            self.contested = False  # left alone for a whole window: no longer contested
            log.info("the table is no longer contested", table=self.nft.table_name)
        self._write_state(want)
        self._say_mode()
        self.metrics.rule_present.set(1)
        self.metrics.syncs.labels(result).inc()
        self.metrics.last_sync.set(time.time())
        return result

    def _repaired(self, diffs: list[str], missing: bool) -> None:
        """The table was replaced or removed under this agent: said, counted, remembered for
        the coverage Lease; replaced again and again (another release's agent writing the same
        table, or something on the node rewriting it), it is contested: this release's rule
        is out of force between each replacement and its repair, so the Lease says so and
        the verdicts are not Shielded (ADR 0029)."""
        now = time.monotonic()
        self.repairs += 1
        self.repaired_at = datetime.now(UTC)
        self._recent_repairs = [t for t in self._recent_repairs if now - t < CONTEST_WINDOW]
        self._recent_repairs.append(now)
        contested = len(self._recent_repairs) >= CONTEST_REPAIRS
        self.metrics.table_replaced.labels("removed" if missing else "changed").inc()
        if contested and not self.contested:
            log.error("the table is contested: replaced again and again under this agent (is "
                      "another release's agent writing the same table? give each release its "
                      "own firewall.table)", table=self.nft.table_name,
                      repairs=len(self._recent_repairs), within_seconds=CONTEST_WINDOW,
                      differences=diffs[:5])  # fmt: skip
        else:
            log.warning("drift repaired", table=self.nft.table_name, removed=missing,
                        differences=diffs[:20])  # fmt: skip
        self.contested = contested

    def _wanted(self) -> Table | None:
        """The table this agent enforces now: the config, this node's sandboxes, every host's
        addresses in the pod ranges. One place, for the sync and for its failure path alike
        (the failure path once judged presence without the hosts, and called the table
        missing on overlay CNIs while it was in force: false SandboxUnshielded)."""
        enforced = self.enforced()
        if enforced is None:
            return None
        return desired(enforced, self.sandboxes, self.hosts.addresses, self.nft.table_name)

    def _say_mode(self) -> None:
        mode = self.mode
        self.metrics.enforcing.set(1 if mode == ENFORCE else 0)
        if mode == self._mode_said:
            return
        self._mode_said = mode
        config = self.config
        staged = config is not None and config.mode == AUDIT and mode == ENFORCE
        log.info("firewall mode", mode=mode,
                 why="this node's labels match enforceNodeSelector" if staged else "the config",
                 refuses="every connection the rules match" if mode == ENFORCE else
                 "nothing: counts and records what it would refuse")  # fmt: skip

    def _write_state(self, table: Table) -> None:
        if self.state_file is None or self.config is None:
            return
        state = dump_state(self.config.digest(), table)
        if state == self._state_written:
            return
        staged = self.state_file.with_name(self.state_file.name + ".new")
        try:
            staged.write_bytes(state)
            os.replace(staged, self.state_file)  # the probe reads all of it or none
        except OSError as exc:  # the probe then fails: said, counted
            self.metrics.sync_failures.labels("state").inc()
            log.error("cannot write the state file", path=str(self.state_file),
                      error=exc.strerror or str(exc))  # fmt: skip
            return
        self._state_written = state

    def enforced(self) -> FirewallConfig | None:
        """The config as enforced now: its pod ranges and the nodes'; the inbound rule only
        once those are complete (a range missing would refuse real pods: config.py); this
        node's mode (audit mode, unless its labels match `enforceNodeSelector`)."""
        if self.config is None:
            return None
        config = self.config.with_pod_ranges(self.hosts.ranges).for_node(self._node_labels())
        if config.inbound and ranges_unknown(self.config, self.hosts) != ():
            config = replace(config, inbound=False)
        return config

    def _node_labels(self) -> dict[str, str] | None:
        """This node's labels as its Node watch last showed them (None: not known)."""
        if self.link is None or self.nodes is None:
            return None
        for node in self.nodes.snapshot() or ():
            meta = node.get("metadata") or {}
            if meta.get("name") == self.link.node:
                return dict(meta.get("labels") or {})
        return None

    @property
    def mode(self) -> str:
        """This node's mode now: enforce or audit."""
        enforced = self.enforced()
        return enforced.mode if enforced is not None else ENFORCE

    def _count_rejected(self, have: Table | None) -> None:
        now = have.rejected_packets if have else 0
        if now >= self._rejected_seen:
            self.metrics.rejected.inc(now - self._rejected_seen)
        else:
            self.metrics.rejected.inc(now)  # replaced by someone else: counting restarted
        self._rejected_seen = now
        self._count_audited(have)

    def _count_audited(self, have: Table | None) -> None:
        """Audit mode: what each rule would have refused (by port and kind of source), and
        the sources the kernel recorded, each logged once (at most AUDIT_LOGGED a resync)."""
        counts = audited(have)
        for (kind, port), now in counts.items():
            seen = self._audited_seen.get((kind, port), 0)
            self.metrics.audited.labels(str(port), kind).inc(now - seen if now >= seen else now)
        self._audited_seen = counts
        fresh = [r for r in recorded(have) if r not in self._audit_logged]
        for chain, source, port, sandbox in fresh[:AUDIT_LOGGED]:
            log.warning("audit: would refuse", source=source, port=port, sandbox=sandbox,
                        kind=_kind(chain, source, self.enforced()))  # fmt: skip
        if len(fresh) > AUDIT_LOGGED:
            log.warning("audit: would refuse more", more=len(fresh) - AUDIT_LOGGED,
                        counted="deathwatch_firewall_audited_connections_total")  # fmt: skip
        if len(self._audit_logged) > AUDIT_REMEMBERED:
            self._audit_logged.clear()  # each set element lives an hour: said again at worst
        self._audit_logged.update(fresh[:AUDIT_LOGGED])

    def list_sandboxes(self) -> None:
        """Learn this node's sandboxes; on failure keep the last known (counted, logged)."""
        if self.link is None or self.config is None or not self.config.inbound:
            return
        chosen = None
        if not self.config.sandbox_selector:  # the pods the DeathWatches select (ADR 0037)
            read = self.deathwatches.snapshot() if self.deathwatches is not None else None
            if read is None:
                self._sandboxes_known = False
                if not self._deathwatches_waited:
                    self._deathwatches_waited = True
                    log.warning("waiting for the DeathWatches listing; the last known "
                                "sandboxes stay guarded", guarded=len(self.sandboxes))  # fmt: skip
                return
            self._deathwatches_waited = False
            served = self.config.controller_id  # this release's DeathWatches only
            chosen = tuple(s for s in selections(read) if s.controller == served)
        try:
            found = list_sandboxes(self.link.api, self.link.node, self.config.sandbox_selector,
                                   chosen)  # fmt: skip
        except (KubeError, ValueError) as exc:  # the API's, or an answer that is not JSON
            self._sandboxes_known = False
            self.metrics.sync_failures.labels("sandboxes").inc()
            log.error("cannot list this node's sandboxes; the last known stay guarded",
                      error=describe(exc)[:300], guarded=len(self.sandboxes))  # fmt: skip
            return
        if found != self.sandboxes:
            log.info("sandboxes changed", sandboxes=[str(a) for a in found])
        self.sandboxes, self._sandboxes_known = found, True
        self.metrics.sandboxes.set(len(found))

    def learn_hosts(self) -> None:
        """Every node's host addresses in the pod ranges, from the Node objects as last
        watched; until they are listed, none are known (the coverage Lease says so)."""
        if self.config is None:
            return
        nodes = self.nodes.snapshot() if self.nodes is not None else []
        if nodes is None:
            self.hosts = Hosts(self._given_hosts, None, (), None)
            self._count_ranges()
            return
        found = host_addresses(nodes, self.config)
        hosts = Hosts(tuple(sorted({*found.addresses, *self._given_hosts},
                                   key=lambda a: (a.version, int(a)))), found.unknown,
                      found.ranges, found.unranged)  # fmt: skip
        if hosts.addresses != self.hosts.addresses or hosts.unknown != self.hosts.unknown:
            unknown = "not listed" if hosts.unknown is None else list(hosts.unknown)
            log.info("host addresses in the pod ranges", count=len(hosts.addresses),
                     unknown=unknown)  # fmt: skip
        before = ranges_unknown(self.config, self.hosts)
        self.hosts = hosts
        after = ranges_unknown(self.config, hosts)
        if after != before or self._ranges_said != hosts.ranges:
            self._ranges_said = hosts.ranges
            if after == () or not self.config.inbound:
                log.info("pod ranges", learned=[str(n) for n in hosts.ranges],
                         configured=[str(n) for n in self.config.pod_cidrs])  # fmt: skip
            else:
                log.warning(
                    "pod ranges incomplete: the inbound rule waits (give firewall.podCIDRs)",
                    learned=[str(n) for n in hosts.ranges],
                    nodes_without_podCIDRs="not listed" if after is None else list(after[:20]),
                )
        self.metrics.host_addresses.set(len(hosts.addresses))
        self._count_ranges()

    def _count_ranges(self) -> None:
        enforced = self.enforced()
        self.metrics.inbound_enforced.set(1 if enforced is not None and enforced.inbound else 0)
        self.metrics.pod_ranges.set(len(enforced.pod_cidrs) if enforced is not None else 0)

    def publish(self) -> None:
        """Renew this node's coverage Lease with what is in force now."""
        if self.link is None or self.config is None:
            return  # nothing enforced yet: no claim to make (a missing Lease says so)
        link = self.link
        enforced = self.enforced()
        guarded = None  # what the inbound rule holds, when it is enforced
        if enforced is not None and enforced.inbound:
            guarded = tuple(a for a in self.sandboxes if any(a in n for n in enforced.pod_cidrs))
        state = NodeState(
            self.config,
            self._file_digest,
            self._in_force and not self.contested,
            len(self.sandboxes) if self._sandboxes_known else None,
            self.hosts,
            self.measured,
            self.mode,
            table=self.nft.table_name,
            guarded=guarded,
            repairs=self.repairs,
            repaired_at=self.repaired_at,
            contested=self.contested,
            held_by=self.held_by.theirs.who if self.held_by else "",
        )
        try:
            publish(
                link.api,
                lease_body(
                    link.node,
                    link.identity,
                    link.namespace,
                    state,
                    datetime.now(UTC),
                    link.lease_prefix,
                ),
            )
        except (KubeError, KeyError, TypeError) as exc:
            self.metrics.sync_failures.labels("coverage").inc()
            log.error("cannot renew the coverage Lease", error=describe(exc)[:300])
            return
        self.metrics.coverage_published.set(time.time())

    def step(self) -> None:
        """One resync: reload, list sandboxes, sync, publish, record the outcome. Never
        raises."""
        self.reload()
        self.list_sandboxes()
        self.learn_hosts()
        if self._yields_the_table():
            return
        if self._keeps_the_live_table():
            return
        self._in_force = False
        try:
            result = self.sync()
        except NftError as exc:
            # no valid config yet (a new agent given one it refuses): the config's failure,
            # as the alert must say, not nft's
            self.metrics.sync_failures.labels("config" if self.config is None else "nft").inc()
            want = self._wanted()
            try:
                present = want is not None and not differences(want, self.nft.list_table())
            except NftError:
                present = False
            self.metrics.rule_present.set(1 if present else 0)
            log.error("sync failed", error=str(exc))
            self._in_force = present
            self.publish()
            return
        self._in_force = True
        if result != "unchanged":
            log.info("table synced", result=result)
        self.self_check()
        self.publish()

    def _yields_the_table(self) -> bool:
        """Another release's firewall, applied first, holds this agent's table (rivals.py):
        it touches nothing, is not in force, and says so (log on change, gauge, Lease).
        Before the DaemonSets are listed it cannot know: a table in force (another release's,
        or its own predecessor's) stays untouched until then; with none, it applies at once
        (there is nothing to contest, and a node without a table is an open one)."""
        link = self.link
        if link is None or not link.daemonset or self.releases is None:
            return False
        listed = self.releases.snapshot()
        if listed is None:
            if not self._table_in_force():
                return False
            if not self._releases_waited:
                self._releases_waited = True
                log.info("waiting for the releases' DaemonSets: the table in force stays "
                         "untouched until then")  # fmt: skip
            return True
        held = table_holder(listed, link.namespace, link.daemonset)
        before, self.held_by = self.held_by, held
        gauge, table = self.metrics.release_collisions, self.nft.table_name
        if (held and held.theirs.other) != (before and before.theirs.other):
            if before is not None:
                gauge.remove(TABLE_CLASH, before.theirs.other, "true")
                log.info("the table is no longer held by another release", table=table)
            if held is not None:
                gauge.labels(TABLE_CLASH, held.theirs.other, "true").set(1)
                log.error("another release's firewall holds this table: leaving it alone",
                          table=table, message=held.message)  # fmt: skip
        if held is None:
            return False
        self._in_force = False
        self.metrics.rule_present.set(0)
        self.publish()
        return True

    def _table_in_force(self) -> bool:
        """Whether a table is on the node now (anyone's): what an agent that does not yet
        know enough must leave untouched. Unreadable: none known, so nothing to keep."""
        try:
            return self.nft.list_table() is not None
        except NftError:
            return False

    def _keeps_the_live_table(self) -> bool:
        """A new agent (a rollout, a restart) that has not listed the Node objects yet knows
        none of the pod ranges it learns from them, nor the hosts' addresses: the table it
        would apply could cover less than the one in force, which its predecessor left. So
        it touches nothing until the listing comes (its watch wakes it); without a table in
        force there is nothing to keep, and it applies what it knows. Measured on the Helm
        lane: applied at once, 202 of 1,686 host connections got through an agent rollout."""
        if self.link is None or self.nodes is None or self.nodes.snapshot() is not None:
            return False
        if not self._table_in_force():
            return False
        if not self._waiting_said:
            self._waiting_said = True
            log.info("waiting for the Node listing: the table in force stays until then")
        return True

    def self_check(self) -> None:
        """Measure the output rule on one of this node's sandboxes (in turn), and say what
        changed. Its own refusal is not counted as a neighbour's (`rejected`)."""
        enforced = self.enforced()
        if enforced is None:
            return
        ranges = enforced.pod_cidrs
        candidates = [a for a in self.sandboxes if any(a in n for n in ranges)]
        if not candidates:
            found, did = Measured.NONE, ""
        else:
            target = candidates[self._measured_turn % len(candidates)]
            self._measured_turn += 1
            audit = enforced.mode == AUDIT
            found, did = measure(self.nft.list_table, target, enforced.agent_ports[0],
                                 audit=audit)  # fmt: skip
            if found is Measured.VERIFIED and not audit:  # ours: left out of `rejected`
                self._rejected_seen += 1
            if found is not self.measured:
                report = log.error if found is Measured.BYPASSED else log.info
                report("the output rule measured", outcome=str(found), sandbox=str(target),
                       port=enforced.agent_ports[0], connection=did)  # fmt: skip
        self.measured = found
        self.metrics.self_checks.labels(str(found)).inc()
        self.metrics.rule_bypassed.set(1 if found is Measured.BYPASSED else 0)

    def run(self, stop: threading.Event) -> None:
        log.info("agent started", config=str(self.path),
                 node=self.link.node if self.link else None)  # fmt: skip
        if self.link is not None:
            link = self.link
            PodWatch(
                link.api,
                link.node,
                lambda: self.config.sandbox_selector if self.config else "",
                self.wake.set,
                lambda: self.metrics.sync_failures.labels("watch").inc(),
                stop,
            ).start()
            self.nodes = NodeAddresses(
                link.api, self.wake.set, lambda: self.metrics.sync_failures.labels("nodes").inc(),
                stop,
            )  # fmt: skip
            self.nodes.start()
            self.deathwatches = DeathWatches(
                link.api, self.wake.set,
                lambda: self.metrics.sync_failures.labels("deathwatches").inc(), stop,
            )  # fmt: skip
            self.deathwatches.start()
            if link.daemonset:
                self.releases = FirewallReleases(
                    link.api, self.wake.set,
                    lambda: self.metrics.sync_failures.labels("releases").inc(), stop,
                )  # fmt: skip
                self.releases.start()
            if link.remove_on_uninstall is not None:
                self.daemonset = DaemonSetWatch(
                    link.api, link.namespace, link.remove_on_uninstall,
                    lambda: self.metrics.sync_failures.labels("watch").inc(), stop,
                )  # fmt: skip
                self.daemonset.start()
        while not stop.is_set():
            self.step()
            self.heartbeat.beat(ready=self._in_force)
            interval = self.config.resync_seconds if self.config else 10.0
            self.wake.wait(interval)  # a resync, a sandbox change, or stop
            self.wake.clear()
        self.leave()

    def leave(self) -> bool:
        """The agent stops: the table stays, unless it was told to remove it on uninstall and
        its DaemonSet says this is one. True when it removed the table."""
        link = self.link
        if link is None or link.remove_on_uninstall is None:
            log.info("agent stopping; the table stays in place")
            return False
        if self.held_by is not None:  # never another release's table
            log.info("agent stopping; the table is another release's and stays",
                     held_by=self.held_by.theirs.who)  # fmt: skip
            return False
        seen = assess(link.api, link.namespace, link.remove_on_uninstall, self.daemonset)
        if not seen.uninstalling:
            log.info("agent stopping; the table stays in place", why=seen.why)
            return False
        try:
            self.nft.delete_table()
        except NftError as exc:
            self.metrics.sync_failures.labels("uninstall").inc()
            log.error("uninstalled, but the table could not be removed: remove it with "
                      "`deathwatch-firewall cleanup` (runbook: open the firewall now)",
                      why=seen.why, error=str(exc))  # fmt: skip
            return False
        # its coverage Lease stays, and goes stale within two resyncs: deleting it would need
        # the grant the uninstall has just deleted
        log.warning("uninstalled: the table removed from this node", table=self.nft.table_name,
                    why=seen.why)  # fmt: skip
        return True
