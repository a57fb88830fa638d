"""Start-up, in order, so that no pod is judged before the engine's memory and the
DeathWatches are in place: the verdicts are listed (the engine's memory restored from them), the
DeathWatches, agent-sandbox's Sandboxes (at most SANDBOXES_WAIT), then the pods; only then do
the writers, the election and the timed loops start. Each phase a function of the parts
(assembly.py) it starts."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable

import structlog

from deathwatch._engine.timeutil import parse_time
from deathwatch._kube.errors import describe, label
from deathwatch._operator.leadership.rivals import Rivals, heed, keep_off
from deathwatch._operator.memory.deathwatches import Revised
from deathwatch._operator.process import timers
from deathwatch._operator.process.assembly import Parts
from deathwatch._operator.sources import reads

log = structlog.get_logger("deathwatch.app")

SANDBOXES_WAIT = 30.0  # seconds start-up waits for the Sandboxes' first listing, at most


async def list_all(p: Parts, adopt: Callable[[Revised], None]) -> None:
    """Every watch, each waited for in the order the next needs it: the verdicts (memory
    restored), the DeathWatches (each finds its own pods), agent-sandbox's Sandboxes (at
    most SANDBOXES_WAIT), the pods; then the node exits and the kubelet's Evicted Events,
    which need the records."""
    s, sup = p.streams, p.supervisor
    for i, reflector in enumerate(s.verdicts):
        sup.start(f"watch-verdicts-{i}", reflector.run)
    await asyncio.gather(*(r.listed() for r in s.verdicts))
    for i, reflector in enumerate(s.deathwatches):  # before the pods: each finds its own
        sup.start(f"watch-deathwatches-{i}", reflector.run)
    await asyncio.gather(*(r.listed() for r in s.deathwatches))
    for receiver in p.deathwatch_receivers:  # a selection new from now: its pods listed
        receiver.adopt = adopt
    for i, reflector in enumerate(s.agent_sandboxes):
        sup.start(f"watch-sandboxes-{i}", reflector.run)
    try:
        # Sandboxes before pods, so the first verdicts already name their claims; never
        # held up by them: a Sandbox watch that cannot list (RBAC) is retried, and logged
        async with asyncio.timeout(SANDBOXES_WAIT):
            await asyncio.gather(*(r.settled() for r in s.agent_sandboxes))
    except TimeoutError:
        log.warning("agent-sandbox Sandboxes not listed yet: starting without them",
                    waited=SANDBOXES_WAIT)  # fmt: skip
    for i, reflector in enumerate(s.pods):
        sup.start(f"watch-pods-{i}", reflector.run)
    await asyncio.gather(*(r.listed() for r in s.pods))
    for i, reflector in enumerate(s.node_exits):  # after the pods: exits need records
        sup.start(f"watch-node-exits-{i}", reflector.run)
    for i, reflector in enumerate(s.evictions):  # after the pods: a notice needs its record
        sup.start(f"watch-evictions-{i}", reflector.run)


async def begin_writing(p: Parts) -> None:
    """The writers and the sender; without election, the only writer leads from here
    (if no older release serves its DeathWatches)."""
    cfg, sup = p.config, p.supervisor
    if p.elector is None and p.rivals is not None:
        # the only writer, without an elector to ask: it leads only if no older release
        # serves its DeathWatches (keep_off asks again from here on)
        await first_rivals(p, p.rivals)
        heed(p.rivals, p.leadership)
    p.leadership.begin()  # the only writer: it leads from here (else the elector says)
    if p.sender is not None:
        sender = p.sender
        for name in sender.deliveries.sinks:
            sup.start(f"deliver-{name}", functools.partial(sender.run, name))
    for i in range(cfg.writers):
        sup.start(f"writer-{i}", p.writer.work)
    pools = p.warm_pools
    sup.start("warm-connections", lambda: timers.warm(pools, p.metrics))


async def begin_election(p: Parts) -> None:
    """The Lease's owner and the other releases read before the first election; then the
    election, the Lease's watch, the shard's slots, and the releases checked for ever."""
    cfg, sup = p.config, p.supervisor
    if p.elector is not None:
        if p.lease_owner is not None:
            await p.lease_owner.learn()  # bounded; a failure is said, not fatal
        if p.rivals is not None:  # before the first election (without one: begin_writing)
            await first_rivals(p, p.rivals)
    if p.rivals is not None:
        rivals, every, leadership = p.rivals, cfg.release_check_interval, p.leadership
        sup.start("releases", lambda: rivals.run(every))
        if p.elector is None:
            sup.start("releases-keep-off", lambda: keep_off(rivals, leadership))
    if p.elector is not None:
        sup.start("leader-election", p.elector.run)
        sup.start("lease-watch", p.elector.watch)
        if cfg.shard.sharded:
            rest_ = p.lease_rest
            sup.start("shard-slots", lambda: p.ownership.run(rest_))


def start_timers(p: Parts) -> None:
    """The clock's loops: Suspect deadlines, publishing and retention, the API probe,
    the firewall's coverage."""
    cfg, sup, core, liveness, readiness = p.config, p.supervisor, p.core, p.liveness, p.readiness
    ps, m, probe, fw = p.passes, p.metrics, p.probe, cfg.firewall_daemonset
    sup.start("deadlines", lambda: timers.suspects(ps.pods, core.wake))
    sup.start("publish", lambda: timers.publishing(
        ps.status, ps.retention, ps.shielding, liveness, cfg.publish_interval,
        cfg.retire_interval))  # fmt: skip
    firewall = core.firewall
    sup.start("probe", lambda: reads.probe(firewall, probe, m, readiness, fw,
                                           cfg.probe_interval))  # fmt: skip
    if fw:
        namespace = fw.split("/", 1)[0]
        sup.start(
            "firewall-coverage",
            lambda: reads.coverage(ps.shielding, probe, m, namespace, cfg.coverage_interval),
        )


async def first_rivals(p: Parts, rivals: Rivals) -> None:
    """Before the first election: what another release shares with this one, so a
    controller that must give way never leads, not even once. Bounded; a failure is
    said (log, metric) and the check goes on in its task."""
    try:
        await asyncio.wait_for(rivals.check(), 30)
    except Exception as exc:
        rivals.error = describe(exc)[:300]
        p.metrics.api_errors.labels("list_releases", label(exc)).inc()
        log.warning("cannot read the other releases before the election: collisions with "
                    "them are checked once they can be read", error=rivals.error)  # fmt: skip


async def learn_epoch(p: Parts) -> None:
    """--shard-epoch=pod:NAMESPACE/NAME: the shard's epoch is that pod's creation, in
    seconds, on the API server's clock. A reshard's pods are created after the pods they
    replace, however the chart was rendered (`helm template` has no revision to give), so
    the newer configuration's shards are the newer epoch (ADR 0025, #53)."""
    if p.config.shard_epoch_pod is None:
        return
    namespace, name = p.config.shard_epoch_pod
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    try:
        pod = await asyncio.wait_for(p.probe.get(path), 30)
        created = parse_time(pod["metadata"]["creationTimestamp"])
    except Exception as exc:
        log.error("cannot read this replica's pod for its shard epoch; start-up is tried "
                  "again", pod=f"{namespace}/{name}", error=describe(exc)[:300])  # fmt: skip
        raise
    if created is None:
        raise ValueError(f"pod {namespace}/{name}: no creationTimestamp")
    spec = dataclasses.replace(p.ownership.spec, epoch=int(created.timestamp()))
    p.ownership.spec = p.core.shards.spec = spec  # before the first claim is written
    log.info("shard epoch: this replica's pod's creation", epoch=spec.epoch,
             pod=f"{namespace}/{name}", shard=f"{spec.index}/{spec.count}")  # fmt: skip
