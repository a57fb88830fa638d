"""A container's exit as its node heard it, and the kubelet's report it stands for.

The kubelet learns of an exit at its next relist (up to a second later) and only then writes
the pod's status; deathwatch's node agent hears the runtime's exit event in milliseconds
(ADR 0028). `reported` turns one such exit into the pod as the kubelet will report it (the
container terminated with that code, the pod not Ready, its phase as the kubelet computes
it), so the engine judges it by the same rules as every other observation: a deletion or a
disruption the API already holds wins, an exit before the first Ready is start-up, a policy
decides the rest. `disputes` compares the kubelet's report, when it comes, with the verdict
the node's exit made.

Never a false Dead: only the exit of a container of the sandbox (ADR 0029: its regular
containers, or those its DeathWatch names, and the sidecars named vital), the instance the
pod's status names now (by its runtime id), while it runs, counts. An init container, a
helper, a sidecar not named vital, an ephemeral container, an exec probe's process, an
earlier instance: the node abstains, and the kubelet's report judges what it meant. What an
exit leads to (a restart, a completion) is the kubelet's own rule (`PodView.restarts_after`:
the container's restart rules, its policy, the pod's). A clean exit with no restart to
follow is a completion, and the node leaves it to the kubelet's report (`engine.exited`):
it may be the end of an eviction whose word has not been read yet, and Gone is final.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import msgspec

from deathwatch._engine.contract import disruption_of, eviction_cause
from deathwatch._engine.podview import ContainerView, PodView, Termination
from deathwatch._engine.verdict import Evidence

OOM_KILLED = "OOMKilled"
# the reason the kubelet writes beside an exit code (from the runtime: containerd's CRI)
_REASON = {True: "Completed", False: "Error"}


class NodeExit(msgspec.Struct, frozen=True, gc=False):
    """One container's exit, as the runtime on its node reported it."""

    container_id: str  # as the pod's containerStatuses name it: "containerd://<id>"
    exit_code: int
    oom: bool  # the kernel's OOM killer ended it
    exited_at: datetime
    node: str

    @property
    def reason(self) -> str:
        return OOM_KILLED if self.oom else _REASON[self.exit_code == 0]


def watched(
    pod: PodView, exit: NodeExit, sandbox: Iterable[ContainerView] | None = None
) -> ContainerView | None:
    """The container of the pod this exit ends: the instance its status names, running, and
    one of `sandbox` (every regular container and sidecar when None)."""
    for c in sandbox if sandbox is not None else (*pod.containers, *pod.sidecars):
        if c.container_id == exit.container_id:
            return c if c.terminated is None and c.running_since is not None else None
    return None


def _next_phase(pod: PodView, ended: ContainerView, exit: NodeExit) -> str:
    """The pod's phase once the kubelet has seen this exit of a regular container (its
    getPhase, with restart rules): Running while any runs or any restarts. The kubelet
    says a terminal phase only once its pod worker has stopped the rest, seconds later; the
    engine judges a completion from the containers either way."""
    others = [c for c in pod.containers if c is not ended]
    if any(c.terminated is None for c in others):
        return "Running"  # another container runs on: the pod does
    ended_all: list[tuple[int | None, str | None, str]] = [(exit.exit_code, None, ended.name)]
    ended_all += [(c.terminated.exit_code, c.terminated.reason, c.name)
                  for c in others if c.terminated is not None]  # fmt: skip
    if any(pod.restarts_after(name, code, reason) for code, reason, name in ended_all):
        return "Running"  # restarted in place
    return "Succeeded" if all(code == 0 for code, _, _ in ended_all) else "Failed"


def reported(
    pod: PodView, exit: NodeExit, sandbox: Iterable[ContainerView] | None = None
) -> PodView | None:
    """The pod as the kubelet will report it after this exit; None when the exit does not
    end a container of `sandbox` (the sandbox's containers, ADR 0029) that the pod's status
    names running. `pod` must be the pod as the API holds it now (a fresh read): what the
    API already says of it (a deletion, a disruption) stands beside the exit."""
    if pod.phase != "Running":
        return None
    ended = watched(pod, exit, sandbox)
    if ended is None:
        return None
    at = exit.exited_at
    term = Termination(exit.exit_code, exit.reason, ended.running_since, at)
    gone = msgspec.structs.replace(ended, running_since=None, terminated=term, ready=False)
    phase = pod.phase
    containers, sidecars = pod.containers, pod.sidecars
    if any(c is ended for c in containers):
        phase = _next_phase(pod, ended, exit)
        containers = tuple(gone if c is ended else c for c in containers)
    else:  # a sidecar: it never moves the phase
        sidecars = tuple(gone if c is ended else c for c in sidecars)
    ready_changed_at = at if pod.ready or pod.ready_changed_at is None else pod.ready_changed_at
    latest = pod.latest_time if pod.latest_time is not None and pod.latest_time > at else at
    return msgspec.structs.replace(
        pod,
        phase=phase,
        ready_status="False",
        ready_reason="ContainersNotReady",
        ready_changed_at=ready_changed_at,
        containers=containers,
        sidecars=sidecars,
        latest_time=latest,
    )


def stale(pod: PodView, evidence: Evidence) -> bool:
    """The pod still shows the instance the node saw end as running: the kubelet has not
    relisted yet, so this report says nothing of the pod after the exit."""
    if evidence.container_id is None:
        return False
    return any(
        c.container_id == evidence.container_id and c.terminated is None
        for c in (*pod.containers, *pod.sidecars)
    )


def disputes(pod: PodView, evidence: Evidence) -> str | None:
    """Where the kubelet's report of the pod (or what the API says of it) tells the end the
    node saw otherwise: the verdict stands (Dead is never taken back) and the difference is
    counted and said. None while it agrees, or has not reported yet."""
    # the API keeps whole seconds: only a second wholly before the exit's is before it
    at = evidence.ready_drop_at.replace(microsecond=0) if evidence.ready_drop_at else None
    if at is not None and pod.deletion_requested_at is not None and pod.deletion_requested_at < at:
        return (
            f"the pod's deletion was requested at {pod.deletion_requested_at.isoformat()}, "
            "before the exit the node saw: the kubelet's report makes it Gone"
        )
    d = pod.disruption
    reported_at = _finished(pod, evidence)
    taken = disruption_of(pod) if d is not None else None
    if taken is not None and taken.cause is evidence.cause:
        return None  # the node's verdict already named what the cluster did (a kubelet's eviction)
    if d is not None and d.since is not None and at is not None:
        finished = reported_at or at
        if not finished < d.since:  # the engine's rule (contract.by_disruption), in seconds
            return (
                f"the cluster took it ({d.reason}, since {d.since.isoformat()}): the node saw "
                f"exit code {evidence.exit_code} and called it {evidence.cause}"
            )
    eviction = pod.kubelet_eviction
    if eviction is not None and pod.phase in ("Failed", "Succeeded"):
        cause = eviction_cause(eviction)
        if cause is not evidence.cause:
            return (
                f"the kubelet evicted it ({cause}): the node saw exit code "
                f"{evidence.exit_code} and called it {evidence.cause}"
            )
        return None
    term = _reported(pod, evidence)
    if term is not None:
        if term.exit_code != evidence.exit_code:
            return (
                f"exit code: the node saw {evidence.exit_code}, the kubelet reports "
                f"{term.exit_code}"
            )
        if (term.reason == OOM_KILLED) != (evidence.reason == OOM_KILLED):
            return f"reason: the node saw {evidence.reason}, the kubelet reports {term.reason}"
    return None


def _reported(pod: PodView, evidence: Evidence) -> Termination | None:
    """The kubelet's own report of the instance the node saw end, once it has made one."""
    for c in (*pod.containers, *pod.sidecars):
        if c.name != evidence.container:
            continue
        if c.container_id == evidence.container_id:
            return c.terminated
        return c.last_termination  # restarted: its previous life is the one that ended
    return None


def _finished(pod: PodView, evidence: Evidence) -> datetime | None:
    term = _reported(pod, evidence)
    return term.finished_at if term is not None else None
