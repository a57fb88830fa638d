"""The verdict engine: one pod's observed states in, its verdict and signals out.

Pure and deterministic: `step` takes the previous `Track`, the latest `PodView` and `now`,
and returns the next `Track` and what happened. No clock, no I/O; the operator and replay
feed it and act on the signals.

Order of judgement for each observation (the first that applies wins; docs/adr/0018):
1. Dead is sticky. A Dead pod seen Ready again stays Dead; it is a false positive (once).
2. Gone is terminal.
3. A disruption that can no longer be undone (DisruptionTarget=True, and the pod's deletion
   requested or its phase Failed): the policy says whether it was a death (the built-ins:
   always, named for the disruption: Drained, Preempted, TaintEvicted, NodeUnreachable,
   NodeDeleted, NodeShutdown, Evicted; `contract.by_disruption`); one it does not call a
   death is Gone with that cause. Before the first Ready: Gone with that cause.
4. Eviction by the kubelet (the pod's reason Evicted, or the kubelet's Evicted Event the
   controller read: `PodView.kubelet_eviction`), once the sandbox stopped: Dead, whatever
   the exit code and the phase left (a clean exit on the SIGTERM leaves it Succeeded), named
   by the kubelet's message (`contract.eviction_cause`): StorageLimitExceeded for the pod's
   own storage limits, the workload's; Evicted for node pressure, the infrastructure's. An
   eviction for a limit carries no DisruptionTarget.
5. Deletion requested: Gone (Deleted, or what its owner says), unless the pod had already
   died before the request.
6. phase Succeeded, or every container of the sandbox ended cleanly for good (exit 0, no
   restart to follow: the kubelet says Succeeded seconds later): Gone (Completed). phase
   Failed: Dead (from the container evidence).
7. Never Ready yet: Pending. No death is counted for a pod that was never Ready.
8. Otherwise the pod's policy decides Alive, Suspect (with a deadline) or Dead. While a
   disruption is pending (DisruptionTarget=True, not yet final) the pod is at most Suspect
   (`Disrupting`): Dead only on a dead container's proof, because the control plane clears
   a disruption that does not go ahead, and Dead is never taken back.

What the sandbox is (ADR 0029): its regular containers (those its DeathWatch names, or all),
and the native sidecars named vital. A helper's or a sidecar's exit, restart or unreadiness is
evidence (Track.sidecar_restarts, signal SIDECAR_RESTARTED), never a death: the Ready a
policy sees is the sandbox's (`sandbox_ready`), its container death the sandbox's.

A policy may be third-party code. If its `judge()` raises or returns anything but a sound
Decision (a Suspect deadline must lie ahead, within MAX_SUSPECT), that pod alone is judged by
container-state until the policy works again (Dead only on proof: a terminated or restarted
container, or a final disruption), and the track carries the error (`policy_error`, signal
POLICY_FAILED).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import msgspec

from deathwatch._engine import nodeexit
from deathwatch._engine.contract import (
    ClusterDisruption,
    ContainerDeath,
    Decision,
    Policy,
    PolicySettings,
    Situation,
    by_containers,
    by_disruption,
    disruption_of,
    eviction_cause,
)
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.podview import (
    READINESS_GATES_NOT_READY,
    ContainerView,
    Disruption,
    PodView,
    blocked_probes,
)
from deathwatch._engine.verdict import Cause, Evidence, Observer, State


class SignalKind(StrEnum):
    STATE_CHANGED = "StateChanged"
    READY_DROPPED = "ReadyDropped"
    FLAPPED = "Flapped"  # Ready True -> False -> True before any death verdict
    FALSE_POSITIVE = "FalsePositive"  # Ready True after a Dead verdict
    PROBE_BLOCKED = "ProbeBlockedByFirewall"
    POLICY_FAILED = "PolicyFailed"  # judge() raised or returned garbage: Track.policy_error
    DISPUTED = "NodeExitDisputed"  # the kubelet tells a node-observed death otherwise
    # a container that is not the sandbox (a native sidecar not named vital, a helper)
    # restarted: recorded (Track.sidecar_restarts), never a death
    SIDECAR_RESTARTED = "SidecarRestarted"


class Signal(msgspec.Struct, frozen=True, gc=False):
    kind: SignalKind
    previous: State | None = None  # for STATE_CHANGED: the state left


# The longest a policy may keep a pod Suspect in one decision: anything further is garbage.
MAX_SUSPECT = timedelta(days=1)


# gc=False: it holds no reference back to itself, so the cyclic collector need not scan it
class Track(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything the engine remembers about one pod (by uid). Immutable: each step makes a
    new one (msgspec's replace is C, cheap on the hot path of replay)."""

    uid: str
    namespace: str
    name: str
    policy: str
    state: State = State.PENDING
    cause: Cause | None = None
    ever_ready: bool = False
    ready: bool = False
    last_ready_at: datetime | None = None  # when it last became Ready
    ready_drop_at: datetime | None = None  # start of the current not-Ready spell
    deadline: datetime | None = None  # Suspect: when to judge again without news
    restart_baseline: Mapping[str, int] = msgspec.field(default_factory=dict)  # never mutated
    ready_drops: int = 0
    flaps: int = 0
    false_positive: bool = False
    probe_blocked: bool = False
    evidence: Evidence | None = None
    changed_at: datetime | None = None  # when `state` was entered
    policy_error: str | None = None  # the policy failed the last time it was asked: why
    # the DisruptionTarget behind a Suspect (Disrupting) or a verdict it ended, as written
    disruption: Disruption | None = None
    # a death the node saw, told otherwise by the kubelet's report: how (the verdict stands)
    disputed: str | None = None
    # restarts of the pod's containers that are not the sandbox (native sidecars not named
    # vital, helpers) since it was first Ready: evidence, never a death
    sidecar_restarts: int = 0


replace = msgspec.structs.replace  # in C: a new Track with the fields changed


class Step(msgspec.Struct, frozen=True, gc=False):
    track: Track
    signals: tuple[Signal, ...] = ()
    # the track is a new one (the fleet sets it): an observation that changed nothing the
    # verdict says costs its caller nothing more
    changed: bool = True


def new_track(pod: PodView, policy: Policy, settings: PolicySettings) -> Track:
    return Track(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        policy=policy.name,
        restart_baseline=pod.restart_counts(),
        probe_blocked=bool(blocked_probes(pod, settings.agent_ports)),
    )


Parts = tuple[tuple[ContainerView, ...], tuple[ContainerView, ...]]


def sandbox_of(pod: PodView, settings: PolicySettings) -> Parts:
    """The containers that are the sandbox: its regular ones (those the DeathWatch names, or
    all of them when it names none the pod has), and the sidecars it names vital. Everything
    else in the pod is evidence, never the sandbox (ADR 0029)."""
    regular = pod.containers
    names = settings.sandbox_containers
    if names:
        chosen = tuple(c for c in regular if c.name in names)
        if chosen:
            regular = chosen
    wanted = settings.vital_sidecars
    if wanted and pod.sidecars:
        return regular, tuple(c for c in pod.sidecars if c.name in wanted)
    return regular, ()


def sandbox_ready(pod: PodView, parts: Parts) -> bool:
    """Whether the sandbox is Ready, as the pod's Ready condition would say of it alone.

    The kubelet's Ready is every container's, native sidecars included, and the readiness
    gates'. A drop it explains by something that is not the sandbox is no drop of the
    sandbox's: only a readiness gate held back; or every sandbox container still meant to run
    runs ready, and what is not ready is a sandbox container that completed, a helper, or a
    sidecar not named vital. A drop that nothing in the pod explains (every container ready
    and running: the node controller's, its kubelet silent) stays a drop."""
    if pod.ready:
        return True
    if pod.ready_status is None:
        return False
    if pod.ready_reason == READINESS_GATES_NOT_READY:
        return True  # the kubelet says this only with every container ready
    regular, sidecars = parts
    explained = False
    for c in regular:
        t = c.terminated
        if t is None:
            if c.ready and c.running_since is not None:
                continue  # runs ready
            return False  # its own unreadiness (a failing probe, a restart): the sandbox's
        if t.exit_code == 0 and pod.completed(c):
            explained = True
            continue
        return False
    for c in sidecars:
        if not c.runs:
            return False
    if explained:
        return True
    if len(regular) + len(sidecars) == len(pod.containers) + len(pod.sidecars):
        return False  # nothing but the sandbox: nothing else can explain it
    vital = {c.name for c in regular}.union(c.name for c in sidecars)
    return any(not c.ready for c in (*pod.containers, *pod.sidecars) if c.name not in vital)


def _sidecar_restarts(pod: PodView, parts: Parts, baseline: Mapping[str, int]) -> int:
    """Restarts since the baseline of the containers that are not the sandbox."""
    regular, sidecars = parts
    if len(regular) + len(sidecars) == len(pod.containers) + len(pod.sidecars):
        return 0
    vital = {c.name for c in regular}.union(c.name for c in sidecars)
    return sum(
        max(0, c.restart_count - baseline.get(c.name, c.restart_count))
        for c in (*pod.containers, *pod.sidecars)
        if c.name not in vital
    )


def _restarted(pod: PodView, track: Track, parts: Parts) -> bool:
    """A sandbox container of the pod restarted since the pod was first Ready."""
    baseline = track.restart_baseline
    return any(
        c.restart_count > baseline.get(c.name, c.restart_count) for c in (*parts[0], *parts[1])
    )


def _container_death(
    pod: PodView, baseline: Mapping[str, int], parts: Parts
) -> ContainerDeath | None:
    """The sandbox container (or vital sidecar) whose termination or restart ends the
    sandbox, most telling first. A clean exit with no restart to follow is a completion,
    never a death."""
    regular, sidecars = parts
    for c in regular:  # the common case, answered without building anything
        if c.terminated is not None or c.restart_count > baseline.get(c.name, c.restart_count):
            break
    else:
        for c in sidecars:
            if c.terminated is not None or c.restart_count > baseline.get(c.name, c.restart_count):
                break
        else:
            return None
    found: list[tuple[int, ContainerView, ContainerDeath]] = []
    for c in (*regular, *sidecars):
        term = c.terminated
        if term is not None and term.exit_code == 0 and c in regular and pod.completed(c):
            continue  # ended cleanly for good: its part is done, nothing died
        if term is None and c.restart_count > baseline.get(c.name, c.restart_count):
            term = c.last_termination  # restarted since we last saw it: its previous life
            if term is None:  # restart counted but the kubelet kept no lastState
                found.append((3, c, ContainerDeath(c.name, None, None, None, c.restart_count)))
                continue
        if term is None:
            continue
        rank = 0 if term.reason == "OOMKilled" else 1 if term.exit_code != 0 else 2
        found.append(
            (
                rank,
                c,
                ContainerDeath(
                    c.name, term.exit_code, term.reason, term.finished_at, c.restart_count
                ),
            )
        )
    if not found:
        return None
    return min(found, key=lambda f: f[0])[2]


def _ran_and_stopped(pod: PodView, parts: Parts) -> ContainerDeath | None:
    """For a pod first seen not Ready with no record: proof that it ran and then stopped.

    Used only under no-probe, where Ready means "running": every sandbox container started
    and one is terminated now, so the pod was Ready and is not. A pod that restarted and runs
    again is not inferred dead: nothing says the restart was not during its start-up.
    """
    if not parts[0]:
        return None
    for c in (*parts[0], *parts[1]):
        started = c.running_since or (c.terminated.started_at if c.terminated else None)
        if started is None:
            return None
    return _container_death(pod, pod.restart_counts(), parts)


def _instance(pod: PodView, death: ContainerDeath | None) -> str | None:
    """The runtime's id of the container instance that ended (the one the death names)."""
    if death is None:
        return None
    for c in (*pod.containers, *pod.sidecars):
        if c.name == death.container:
            return c.container_id if c.terminated is not None else None
    return None


def _kill(
    track: Track,
    pod: PodView,
    now: datetime,
    cause: Cause,
    death: ContainerDeath | None,
    disruption: ClusterDisruption | None = None,
    observer: Observer = Observer.KUBELET,
    message: str | None = None,
) -> Track:
    """Dead. By a disruption of the cluster's, the condition's reason and message are the
    evidence, beside a container's exit where there is one (an exit 137 under a node
    shutdown is the kill, not an OOM: only the kubelet's word OOMKilled makes that), and the
    drop is dated by the disruption, not by the exit. `message`: the kubelet's eviction's,
    where no condition carries it."""
    since = disruption.since if disruption is not None else (death.finished_at if death else None)
    evidence = Evidence(
        state=State.DEAD,
        cause=cause,
        policy=track.policy,
        pod_uid=track.uid,
        namespace=track.namespace,
        name=track.name,
        container=death.container if death else None,
        exit_code=death.exit_code if death else None,
        reason=(death.reason if death else None) or pod.reason,
        restart_count=death.restart_count if death else None,
        last_ready_at=track.last_ready_at,
        ready_drop_at=track.ready_drop_at or since or now,
        declared_at=now,
        disruption=disruption.reason if disruption is not None else None,
        message=disruption.message if disruption is not None else message,
        observed_by=observer,
        container_id=_instance(pod, death),
    )
    return replace(
        track,
        state=State.DEAD,
        cause=cause,
        deadline=None,
        evidence=evidence,
        ready_drop_at=evidence.ready_drop_at,
        changed_at=now,
        disruption=pod.disruption if disruption is not None else track.disruption,
    )


def _bury(
    track: Track,
    now: datetime,
    cause: Cause,
    pod: PodView | None,
    disruption: ClusterDisruption | None = None,
) -> Track:
    evidence = Evidence(
        state=State.GONE,
        cause=cause,
        policy=track.policy,
        pod_uid=track.uid,
        namespace=track.namespace,
        name=track.name,
        container=None,
        exit_code=None,
        reason=pod.reason if pod else None,
        restart_count=None,
        last_ready_at=track.last_ready_at,
        ready_drop_at=track.ready_drop_at,
        declared_at=now,
        disruption=disruption.reason if disruption else None,
        message=disruption.message if disruption else None,
    )
    return replace(
        track,
        state=State.GONE,
        cause=cause,
        deadline=None,
        evidence=evidence,
        changed_at=now,
        disruption=pod.disruption if disruption is not None and pod is not None else None,
    )


def _died_before(death_at: datetime | None, deletion_requested_at: datetime) -> bool:
    # Equal (the API stores seconds) counts as after: a death verdict needs proof.
    return death_at is not None and death_at < deletion_requested_at


def step(
    track: Track,
    pod: PodView,
    now: datetime,
    policy: Policy,
    settings: PolicySettings,
    *,
    first: bool = False,
    deletion: Cause = Cause.DELETED,
    observer: Observer = Observer.KUBELET,
) -> Step:
    """Judge one observation of the pod. `policy` must be the one named by `track.policy`;
    `first` marks the first observation since the track was made or restored; `deletion` is
    what its deletion means when the pod's owner says (Suspended, Expired): the pod itself
    never tells why it was deleted; `observer`: whose report the observation is (the node's:
    `exited`).

    In phases: a final verdict learns only facts (`_after_death`); otherwise the Ready edges
    (`_edges`) and the notices beside them (`_notices`) are recorded, then the lifecycle's
    facts judge (`_judge_lifecycle`), or else the policy (`_by_policy`)."""
    before = track.state
    if before is State.GONE:
        return Step(track)
    # the sandbox's containers, and whether it is Ready (not a helper's or a sidecar's drop)
    if settings.sandbox_containers or settings.vital_sidecars:
        parts = sandbox_of(pod, settings)
    else:  # the default, and nearly every pod: every regular container, no sidecar vital
        parts = (pod.containers, ())
    ready = pod.ready or sandbox_ready(pod, parts)
    if before is State.DEAD:
        return _after_death(track, pod, ready, parts)

    signals: list[Signal] = []
    track = _edges(track, pod, now, ready, parts, policy, first, signals)
    track = _notices(track, pod, parts, settings, first, signals)
    death = _container_death(pod, track.restart_baseline, parts) if track.ever_ready else None
    disruption = disruption_of(pod) if pod.disruption is not None else None
    after = _judge_lifecycle(track, pod, now, death, deletion, disruption, parts, observer)
    if after is None:
        after = _by_policy(
            track, pod, now, policy, settings, death, disruption, deletion, observer, signals
        )
    if after.state is not before:
        if after.changed_at != now:
            after = replace(after, changed_at=now)
        signals.append(Signal(SignalKind.STATE_CHANGED, before))
    return Step(after, tuple(signals))


def _after_death(track: Track, pod: PodView, ready: bool, parts: Parts) -> Step:
    """Steps 1-2: a Dead verdict is final; only facts about it can still be learned. The
    kubelet's report disputing the node's (once), or the false positive: the pod Ready again,
    from not Ready, and still running (a pod GC marks an orphan Failed and leaves its Ready
    as it was). A pod Ready again after its containers restarted in place (restartPolicy, a
    container restart rule, a restart of the whole pod) is a new life of the pod, not a sign
    that the death was not one: the container did exit."""
    evidence = track.evidence
    if evidence is not None and evidence.observed_by is Observer.NODE:
        if nodeexit.stale(pod, evidence):
            return Step(track)  # the kubelet has not relisted yet: it says nothing new
        if track.disputed is None:
            disputed = nodeexit.disputes(pod, evidence)
            if disputed is not None:
                track = replace(track, disputed=disputed, ready=ready)
                return Step(track, (Signal(SignalKind.DISPUTED),))
    if (
        ready
        and not track.ready
        and not track.false_positive
        and pod.phase not in ("Failed", "Succeeded")
        and pod.deletion_requested_at is None
        and not _restarted(pod, track, parts)
    ):
        fp = replace(track, false_positive=True, ready=True)
        return Step(fp, (Signal(SignalKind.FALSE_POSITIVE),))
    return Step(track if track.ready == ready else replace(track, ready=ready))


def _edges(
    track: Track,
    pod: PodView,
    now: datetime,
    ready: bool,
    parts: Parts,
    policy: Policy,
    first: bool,
    signals: list[Signal],
) -> Track:
    """The Ready edges, whatever the policy: drops, recoveries (flaps), the last Ready time,
    and the restart baseline at the first Ready; appends their signals."""
    changes: dict[str, Any] = {}
    ready_at = pod.ready_changed_at or now
    if ready:
        if not track.ready:
            if track.ever_ready and track.ready_drop_at is not None:
                signals.append(Signal(SignalKind.FLAPPED))
                changes["flaps"] = track.flaps + 1
            if not track.ever_ready:
                # Restarts before the first Ready were start-up; count from here.
                changes["restart_baseline"] = pod.restart_counts()
            changes.update(ever_ready=True, ready=True, last_ready_at=ready_at)
        if track.ready_drop_at is not None:
            changes["ready_drop_at"] = None
    elif track.ready:
        drop_at = ready_at
        if track.last_ready_at is not None and drop_at < track.last_ready_at:
            drop_at = now  # a stale transition time cannot predate the Ready we saw
        signals.append(Signal(SignalKind.READY_DROPPED))
        changes.update(ready=False, ready_drop_at=drop_at, ready_drops=track.ready_drops + 1)
    elif not track.ever_ready and first and getattr(policy, "ready_means_running", False) is True:
        # First sight of a pod with no record: did it run and stop while nobody watched?
        inferred = _ran_and_stopped(pod, parts)
        if inferred is not None:
            started = [
                c.running_since or (c.terminated.started_at if c.terminated else None)
                for c in (*parts[0], *parts[1])
            ]
            changes.update(
                ever_ready=True,
                last_ready_at=max((t for t in started if t), default=None),
                ready_drop_at=inferred.finished_at or ready_at,
                restart_baseline={},
            )
    return replace(track, **changes) if changes else track


def _notices(
    track: Track,
    pod: PodView,
    parts: Parts,
    settings: PolicySettings,
    first: bool,
    signals: list[Signal],
) -> Track:
    """What is said beside the verdict, never a death: a readiness probe the firewall blocks
    (said on first sight), a helper or sidecar restarted; appends their signals."""
    changes: dict[str, Any] = {}
    if (
        not track.probe_blocked
        and pod.readiness_probes
        and settings.agent_ports
        and blocked_probes(pod, settings.agent_ports)
    ):
        changes["probe_blocked"] = True
    if first and (track.probe_blocked or changes.get("probe_blocked")):
        signals.append(Signal(SignalKind.PROBE_BLOCKED))
    if track.ever_ready and (pod.sidecars or len(parts[0]) < len(pod.containers)):
        restarts = _sidecar_restarts(pod, parts, track.restart_baseline)
        if restarts > track.sidecar_restarts:
            signals.append(Signal(SignalKind.SIDECAR_RESTARTED))
            changes["sidecar_restarts"] = restarts
    return replace(track, **changes) if changes else track


def _by_policy(
    track: Track,
    pod: PodView,
    now: datetime,
    policy: Policy,
    settings: PolicySettings,
    death: ContainerDeath | None,
    disruption: ClusterDisruption | None,
    deletion: Cause,
    observer: Observer,
    signals: list[Signal],
) -> Track:
    """Steps 3, 5 and 8: the policy judges; for a pod whose deletion was requested after its
    Ready drop, it judges the pod as of the request: only a death complete by then stands.
    A policy that fails is said (POLICY_FAILED, `policy_error`) and container-state judges."""
    final = disruption is not None and disruption.final
    deleting = pod.deletion_requested_at
    situation = Situation(  # positional: msgspec's keyword path costs a third more
        pod,
        deleting if deleting is not None and deleting < now and not final else now,
        track.ready_drop_at,
        death,
        settings,
        disruption,
    )
    decision, error = _judge(policy, situation)
    if error is not None:
        signals.append(Signal(SignalKind.POLICY_FAILED))
    if error != track.policy_error:
        track = replace(track, policy_error=error)
    if disruption is not None and disruption.final:
        # 3: the policy called it a death or not; either way it was the cluster's doing
        if decision.state is State.DEAD:
            cause = decision.cause or disruption.cause
            return _kill(track, pod, now, cause, death, disruption, observer)
        return _bury(track, now, disruption.cause, pod, disruption)
    if deleting is not None and decision.state is not State.DEAD:
        return _bury(track, now, deletion, pod)
    if disruption is not None and (
        decision.state is State.ALIVE or (decision.state is State.DEAD and death is None)
    ):
        return _disrupting(track, pod, now)  # 8: pending: at most Suspect
    return _apply(track, pod, now, decision, death, observer)


def _fallback(s: Situation) -> Decision:
    """container-state's judgement: what a pod whose policy failed is judged by."""
    return by_disruption(s) or by_containers(s)


def _judge(policy: Policy, s: Situation) -> tuple[Decision, str | None]:
    """The policy's decision, or container-state's and the reason the policy's was refused."""
    try:
        decision = policy.judge(s)
    except Exception as exc:  # third-party code: its failure is data, never ours to raise
        return _fallback(s), f"{type(exc).__name__}: {exc}"[:300]
    problem = _unsound(decision, s.now)
    if problem is not None:
        return _fallback(s), f"returned {problem}"[:300]
    return decision, None


def _disrupting(track: Track, pod: PodView, now: datetime) -> Track:
    """A disruption announced and not final: Suspect until the pod is deleted (Dead) or the
    condition is cleared (judged again as ever). No deadline: only the API ends it."""
    if track.state is State.SUSPECT and track.cause is Cause.DISRUPTING:
        return track if track.disruption == pod.disruption else replace(
            track, disruption=pod.disruption
        )  # fmt: skip
    return replace(
        track,
        state=State.SUSPECT,
        cause=Cause.DISRUPTING,
        deadline=None,
        disruption=pod.disruption,
        changed_at=now if track.state is not State.SUSPECT else track.changed_at,
    )


def _unsound(decision: object, now: datetime) -> str | None:
    if (
        type(decision) is Decision
        and decision.state is not State.SUSPECT
        and (decision.cause is None or type(decision.cause) is Cause)
    ):
        return None  # Alive or Dead with a Cause: sound by construction (the common case)
    if not isinstance(decision, Decision):
        return f"{type(decision).__name__}, not a Decision: {decision!r}"
    if decision.state is State.SUSPECT:
        deadline = decision.deadline
        if not isinstance(deadline, datetime) or deadline.tzinfo is None:
            return f"a Suspect deadline that is not an aware datetime: {deadline!r}"
        if not now < deadline <= now + MAX_SUSPECT:
            return f"a Suspect deadline outside (now, now + {MAX_SUSPECT}]: {deadline.isoformat()}"
    if decision.cause is not None and not isinstance(decision.cause, Cause):
        return f"a cause that is not a Cause: {decision.cause!r}"
    return None


def _judge_lifecycle(
    track: Track,
    pod: PodView,
    now: datetime,
    death: ContainerDeath | None,
    deletion: Cause,
    disruption: ClusterDisruption | None,
    parts: Parts,
    observer: Observer = Observer.KUBELET,
) -> Track | None:
    """Steps 3-7: the facts no policy may reinterpret. None: the policy decides."""
    if disruption is not None and disruption.final:
        if track.ever_ready:
            return None  # step 3: the policy says whether it was a death
        return _bury(track, now, disruption.cause, pod, disruption)
    # the kubelet's eviction (its word in the pod's status or in its Evicted Event): a death
    # once the sandbox stopped, whatever its exit code and the phase it left (ADR 0044)
    eviction = pod.kubelet_eviction
    stopped = _stopped(parts) if eviction is not None else None
    evicted = eviction is not None and (pod.phase in _TERMINAL_PHASES or stopped is not None)
    if pod.deletion_requested_at is not None and not evicted:
        died_at = track.ready_drop_at or (death.finished_at if death else None)
        if track.ever_ready and not pod.ready and _died_before(died_at, pod.deletion_requested_at):
            return None  # it dropped before the request: the policy says whether that was death
        return _bury(track, now, deletion, pod)
    if evicted:
        if track.ever_ready:
            cause = eviction_cause(eviction)
            return _kill(track, pod, now, cause, death or stopped, observer=observer,
                         message=eviction or None)  # fmt: skip
        return _bury(track, now, Cause.FAILED_BEFORE_READY, pod)
    if pod.phase == "Succeeded" or _completed(pod, parts):
        return _bury(track, now, Cause.COMPLETED, pod)
    if pod.phase == "Failed":
        if track.ever_ready:
            cause = death.cause if death else Cause.UNKNOWN
            return _kill(track, pod, now, cause, death, observer=observer)
        return _bury(track, now, Cause.FAILED_BEFORE_READY, pod)
    if not track.ever_ready:
        # Restarts and exits before the first Ready are start-up, not death.
        counts = pod.restart_counts()
        return (
            track if counts == track.restart_baseline else replace(track, restart_baseline=counts)
        )
    return None


_TERMINAL_PHASES = ("Failed", "Succeeded")


def _stopped(parts: Parts) -> ContainerDeath | None:
    """The first container of the sandbox that has terminated, a clean exit too (under an
    eviction it is the kill's, not a completion)."""
    for c in (*parts[0], *parts[1]):
        t = c.terminated
        if t is not None:
            return ContainerDeath(c.name, t.exit_code, t.reason, t.finished_at, c.restart_count)
    return None


def _completed(pod: PodView, parts: Parts) -> bool:
    """Every container of the sandbox ended cleanly for good (exit 0, no restart to follow by
    the restart policies and rules): a completion, whatever the phase says yet. The kubelet
    reports the phase Running until its pod worker has stopped the rest (1-7 s), and the
    node's exit comes before either: judged on the containers, both paths agree."""
    regular = parts[0]
    for c in regular:  # the common case (one runs) answered without a call
        t = c.terminated
        if t is None or t.exit_code != 0:
            return False
    return bool(regular) and all(pod.completed(c) for c in regular)


def _apply(
    track: Track,
    pod: PodView,
    now: datetime,
    decision: Decision,
    death: ContainerDeath | None,
    observer: Observer = Observer.KUBELET,
) -> Track:
    if decision.state is State.DEAD:
        return _kill(track, pod, now, decision.cause or Cause.UNKNOWN, death, observer=observer)
    if decision.state is State.SUSPECT:
        if (track.state, track.cause, track.deadline) == (
            State.SUSPECT,
            decision.cause,
            decision.deadline,
        ) and track.disruption == pod.disruption:
            return track
        return replace(
            track,
            state=State.SUSPECT,
            cause=decision.cause,
            deadline=decision.deadline,
            disruption=pod.disruption,
            changed_at=now if track.state is not State.SUSPECT else track.changed_at,
        )
    if (
        track.state is State.ALIVE
        and track.cause is None
        and track.deadline is None
        and track.disruption is None
    ):
        return track
    changed_at = now if track.state is not State.ALIVE else track.changed_at
    return replace(
        track, state=State.ALIVE, cause=None, deadline=None, disruption=None, changed_at=changed_at
    )


def expire(
    track: Track, last: PodView | None, now: datetime, policy: Policy, settings: PolicySettings
) -> Step:
    """Judge again with no new observation (`last` is the latest): a Suspect's window may
    have closed."""
    if track.state is not State.SUSPECT or last is None:
        return Step(track)
    return step(track, last, now, policy, settings)


def exited(
    track: Track,
    pod: PodView,
    exit: NodeExit,
    now: datetime,
    policy: Policy,
    settings: PolicySettings,
    *,
    deletion: Cause = Cause.DELETED,
) -> tuple[Step, PodView] | None:
    """A container's exit as its node heard it, `pod` as the API holds it now (a fresh
    read: a deletion or a disruption it shows stands beside the exit). Judged as the
    kubelet's report of it will be (`nodeexit.reported`), by the same rules; a death is
    observed by the node. None when the exit is not of a sandbox container (another
    instance, a helper, a sidecar not named vital, an init container, an exec probe's
    process): the kubelet's report judges it then, as ever. With the step, the pod as it
    was judged (the kubelet's report to come)."""
    if track.state.terminal:
        return None
    regular, sidecars = sandbox_of(pod, settings)
    after = nodeexit.reported(pod, exit, (*regular, *sidecars))
    if after is None:
        return None
    judged = step(track, after, now, policy, settings, deletion=deletion, observer=Observer.NODE)
    if judged.track.state is State.GONE and judged.track.cause is Cause.COMPLETED:
        # a completion is the kubelet's to say: a clean exit may be the kill of an eviction
        # whose word the controller has not read yet (a process that exits 0 on the kubelet's
        # SIGTERM), and Gone cannot be taken back; the kubelet's report follows within seconds
        return None
    return judged, after


def remove(
    track: Track,
    now: datetime,
    last: PodView | None,
    policy: Policy,
    settings: PolicySettings,
    deletion: Cause = Cause.DELETED,
) -> Step:
    """The pod object is gone from the API.

    With its final object (a DELETED event), that object is judged first, so a death it shows
    before the deletion request is kept; anything not terminal by then is Gone (Deleted).
    Without it (found missing after a restart or a relist), nobody saw how it ended: Gone
    (Unobserved), never a claim that it was deleted without dying.
    """
    result = (
        step(track, last, now, policy, settings, deletion=deletion)
        if last is not None
        else Step(track)
    )
    if result.track.state.terminal:
        return result
    cause = deletion if last is not None else Cause.UNOBSERVED
    gone = _bury(result.track, now, cause, last)
    return Step(gone, (*result.signals, Signal(SignalKind.STATE_CHANGED, result.track.state)))
