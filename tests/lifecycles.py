"""Arbitrary pod lifecycles, for property tests (hypothesis strategies): the engine's, and
the controller's core that restarts at any point of one."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.builders import exec_probe, pod, running, terminated, termination, waiting

container_states = st.one_of(
    st.builds(waiting),
    st.builds(
        lambda ready, restarts, last: running(
            ready=ready, restarts=restarts, last=termination() if last else None
        ),
        st.booleans(),
        st.integers(0, 3),
        st.booleans(),
    ),
    st.builds(
        lambda code, oom: terminated(
            code=137 if oom else code, reason="OOMKilled" if oom else "Error"
        ),
        st.integers(0, 255),
        st.booleans(),
    ),
)

observation = st.fixed_dictionaries(
    {
        "dt": st.floats(0, 120, allow_nan=False),
        "ready": st.one_of(st.none(), st.booleans()),
        "phase": st.sampled_from(
            ["Pending", "Running", "Running", "Running", "Succeeded", "Failed"]
        ),
        "evicted": st.booleans(),
        "container": container_states,
        "delete": st.integers(0, 9),  # 0: deletion requested from here on
        "tick": st.booleans(),
    }
)

probes = st.sampled_from(
    [None, exec_probe(), {"tcpSocket": {"port": "agent"}}, {"httpGet": {"port": 8080}}]
)


def lifecycle(
    observations: list[dict[str, Any]], probe: dict[str, Any] | None
) -> list[tuple[float, dict[str, Any]]]:
    """The pod objects of a lifecycle that starts Pending, each with the second it is seen."""
    now, deletion_at = 0.0, None
    first = pod(ready=False, ready_at=0, phase="Pending", containers=[waiting()], probe=probe)
    out: list[tuple[float, dict[str, Any]]] = [(0.0, first)]
    for o in observations:
        now += o["dt"]
        if o["delete"] == 0 and deletion_at is None:
            deletion_at = now
        obj = pod(
            ready=o["ready"],
            ready_at=now,
            phase="Failed" if o["evicted"] else o["phase"],
            reason="Evicted" if o["evicted"] else None,
            containers=[o["container"]],
            probe=probe,
            deletion_at=deletion_at,
        )
        out.append((now, obj))
    return out
