"""The node agent: keep the table exactly as configured, for as long as it runs.

Every resync: reload the config if the file changed (a bad new config is logged and counted
and the previous rule stays in force), read the live table back (`nft -j`), and if anything
differs (deleted, flushed, edited by someone else) replace the whole table atomically, then
read it back again to prove the repair. On SIGTERM the agent exits and leaves the table:
a DaemonSet rollout must never open the hole, not even between two pods. Removal is the
explicit `cleanup` command (uninstall).
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import structlog

from deathwatch.firewall.config import ConfigError, FirewallConfig, load_config
from deathwatch.firewall.metrics import FirewallMetrics
from deathwatch.firewall.nft import Nft, NftError
from deathwatch.firewall.ruleset import desired
from deathwatch.firewall.table import Table, differences

log = structlog.get_logger("deathwatch.firewall")


class Agent:
    def __init__(
        self, config_path: str | Path, nft: Nft, metrics: FirewallMetrics | None = None
    ) -> None:
        self.path = Path(config_path)
        self.nft = nft
        self.metrics = metrics or FirewallMetrics()
        self.config: FirewallConfig | None = None
        self._digest: str | None = None
        self._rejected_seen = 0
        self._applied_once = False
        self._config_changed = False  # the next apply is for a new config, not a repair

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
        return changed

    def sync(self) -> str:
        """Make the live table match the config. Returns unchanged, applied or repaired."""
        if self.config is None:
            raise NftError("no valid config yet: the table is left as it is")
        want = desired(self.config)
        have = self.nft.list_table()
        diffs = differences(want, have)
        self._count_rejected(have)
        result = "unchanged"
        if diffs:
            result = "repaired" if self._applied_once and not self._config_changed else "applied"
            if result == "repaired":
                log.warning("drift repaired", differences=diffs)
            started = time.perf_counter()
            self.nft.apply(want)
            self.metrics.apply_seconds.observe(time.perf_counter() - started)
            after = differences(want, self.nft.list_table())
            if after:
                self.metrics.rule_present.set(0)
                raise NftError(f"the table differs right after applying it: {after}")
            self._rejected_seen = 0  # a replaced table starts its counters at zero
        self._applied_once = True
        self._config_changed = False
        self.metrics.rule_present.set(1)
        self.metrics.syncs.labels(result).inc()
        self.metrics.last_sync.set(time.time())
        return result

    def _count_rejected(self, have: Table | None) -> None:
        now = have.rejected_packets if have else 0
        if now >= self._rejected_seen:
            self.metrics.rejected.inc(now - self._rejected_seen)
        else:
            self.metrics.rejected.inc(now)  # replaced by someone else: counting restarted
        self._rejected_seen = now

    def step(self) -> None:
        """One resync: reload, sync, record the outcome. Never raises."""
        if self.reload():
            self._config_changed = True
        try:
            result = self.sync()
        except NftError as exc:
            self.metrics.sync_failures.labels("nft").inc()
            try:
                present = (
                    not differences(desired(self.config), self.nft.list_table())
                    if self.config
                    else False
                )
            except NftError:
                present = False
            self.metrics.rule_present.set(1 if present else 0)
            log.error("sync failed", error=str(exc))
            return
        if result != "unchanged":
            log.info("table synced", result=result)

    def run(self, stop: threading.Event) -> None:
        log.info("agent started", config=str(self.path))
        while not stop.is_set():
            self.step()
            interval = self.config.resync_seconds if self.config else 10.0
            stop.wait(interval)
        log.info("agent stopping; the table stays in place")
