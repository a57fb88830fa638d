"""What two releases must not share, checked at runtime (#59 item 2, ADR 0038): the same
rules as the chart's `lookup` refusal, and of two the release applied first keeps its part."""

from __future__ import annotations

from typing import Any

from deathwatch._kube.releases import (
    CONTROLLER_ID_CLASH,
    HOST_PORT_CLASH,
    TABLE_CLASH,
    Workload,
    collisions,
    workload,
)


def obj(namespace: str, release: str, component: str, created: str, name: str = "",
        **notes: str) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {
        "namespace": namespace,
        "name": name or f"{release}-deathwatch-{component}",
        "creationTimestamp": created,
        "labels": {
            "app.kubernetes.io/part-of": "deathwatch",
            "app.kubernetes.io/instance": release,
            "app.kubernetes.io/component": component,
        },
        "annotations": {f"deathwatch.dev/{k.replace('_', '-')}": v for k, v in notes.items()},
    }
    return {"metadata": meta}


def w(*args: Any, kind: str = "Deployment", **notes: str) -> Workload:
    found = workload(obj(*args, **notes), kind)
    assert found is not None
    return found


def test_a_controller_id_over_namespaces_both_serve_collides_and_the_later_release_yields() -> None:
    first = w("dw", "prod", "controller", "2026-12-01T00:00:00Z", controller_id="", scope="*")
    second = w("dw-2", "again", "controller", "2026-12-02T00:00:00Z", controller_id="",
               scope="team-a")  # fmt: skip
    [theirs] = collisions(second, [first, second])
    assert (theirs.what, theirs.yields, theirs.theirs.other) == (CONTROLLER_ID_CLASH, True,
                                                                  "dw/prod")  # fmt: skip
    assert "release prod (namespace dw, Deployment prod-deathwatch-controller)" in theirs.message
    assert "never leads" in theirs.message and "controller.controllerId" in theirs.message
    [ours] = collisions(first, [first, second])
    assert ours.yields is False and "applied later, which gives way" in ours.message
    # its own id, or namespaces the other does not serve: nothing shared
    other_id = w("dw-2", "again", "controller", "2026-12-02T00:00:00Z", controller_id="b")
    assert collisions(other_id, [first, other_id]) == []
    a = w("dw", "prod", "controller", "2026-12-01T00:00:00Z", scope="team-a,team-b")
    b = w("dw-2", "again", "controller", "2026-12-02T00:00:00Z", scope="team-c")
    assert collisions(b, [a, b]) == []


def test_a_sharded_release_is_as_old_as_its_oldest_shard_and_its_own_shards_never_collide() -> None:
    """Every shard of one release must agree with the other release on who gives way: a
    shard added by a later reshard is not younger than the other release for that."""
    shard0 = w("dw", "prod", "controller", "2026-12-01T00:00:00Z", "prod-shard-0")
    shard2 = w("dw", "prod", "controller", "2026-12-05T00:00:00Z", "prod-shard-2")
    other = w("dw-2", "again", "controller", "2026-12-03T00:00:00Z")
    listed = [shard0, shard2, other]
    assert [c.yields for c in collisions(shard2, listed)] == [False]
    assert [c.yields for c in collisions(shard0, listed)] == [False]
    assert [c.yields for c in collisions(other, listed)] == [True]  # one per release
    # a tie (the same second): both sides agree by namespace and release
    x = w("a", "x", "controller", "2026-12-01T00:00:00Z")
    y = w("b", "y", "controller", "2026-12-01T00:00:00Z")
    assert [c.yields for c in collisions(x, [x, y])] == [False]
    assert [c.yields for c in collisions(y, [x, y])] == [True]


def test_a_table_and_host_ports_collide_between_firewalls_only() -> None:
    first = w("dw", "prod", "firewall", "2026-12-01T00:00:00Z", kind="DaemonSet",
              table="deathwatch", host_ports="9101,9102")  # fmt: skip
    second = w("dw-2", "again", "firewall", "2026-12-02T00:00:00Z", kind="DaemonSet",
               table="deathwatch", host_ports="9102,9111")  # fmt: skip
    found = collisions(second, [first, second])
    assert [(c.what, c.yields) for c in found] == [(HOST_PORT_CLASH, True), (TABLE_CLASH, True)]
    assert (
        "host port 9102 on every node is taken by the firewall of release prod" in found[0].message
    )
    assert "table inet deathwatch" in found[1].message and "firewall.table" in found[1].message
    apart = w("dw-2", "again", "firewall", "2026-12-02T00:00:00Z", kind="DaemonSet",
              table="again", host_ports="9111,9112")  # fmt: skip
    assert collisions(apart, [first, apart]) == []
    # a controller is never compared with a firewall
    controller = w("dw-2", "again", "controller", "2026-12-02T00:00:00Z")
    assert collisions(controller, [first, controller]) == []


def test_what_is_not_a_release_workload_or_is_being_deleted_holds_nothing() -> None:
    assert workload({"metadata": {"labels": {"app.kubernetes.io/part-of": "other",
                                             "app.kubernetes.io/component": "controller"}}},
                    "Deployment") is None  # fmt: skip
    going = obj("dw", "prod", "controller", "2026-12-01T00:00:00Z")
    going["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    assert workload(going, "Deployment") is None  # an uninstall's: the next install takes over
