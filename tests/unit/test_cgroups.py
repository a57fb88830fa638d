"""A container's OOM kills as its memory cgroup counts them (deathwatch.firewall.cgroups): the
spec's cgroupsPath in both drivers' forms, and cgroup v1's and v2's files, laid out here as the
kernel lays them out (the node lane reads the real tree)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deathwatch.firewall.cgroups import OomKills, relative

UID = "0c6f2a1e-5b7d-4c1e-9a61-3f2d8e7b9c10"


@pytest.mark.parametrize(
    ("path", "want"),
    [
        (f"/kubepods/burstable/pod{UID}/abc", f"kubepods/burstable/pod{UID}/abc"),
        (f"/kubepods/pod{UID}/abc", f"kubepods/pod{UID}/abc"),
        (
            "kubepods-burstable-pod0c6f_2a1e.slice:cri-containerd:abc",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0c6f_2a1e.slice/"
            "cri-containerd-abc.scope",
        ),
        ("kubepods-pod1.slice:crio:abc", "kubepods.slice/kubepods-pod1.slice/crio-abc.scope"),
        ("", None),
        ("/", None),
        ("/kubepods/../../etc", None),  # never outside the tree
        ("kubepods.slice:cri-containerd:../x", None),
        ("kubepods-.slice:cri:abc", None),
        ("not-a-slice:cri:abc", None),
        ("a:b", None),
    ],
)
def test_the_spec_s_cgroups_path_in_both_drivers_forms(path: str, want: str | None) -> None:
    assert relative(path) == want


def test_v1_reads_memory_oom_control_and_v2_memory_events(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    leaf = v1 / "memory" / "kubepods" / "burstable" / f"pod{UID}" / "abc"
    leaf.mkdir(parents=True)
    (leaf / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    path = f"/kubepods/burstable/pod{UID}/abc"
    assert OomKills(v1).count(path) == 2
    assert OomKills(v1).count(f"/kubepods/burstable/pod{UID}/gone") is None  # removed already
    v2 = tmp_path / "v2"
    scope = v2 / "kubepods.slice" / "kubepods-pod1.slice" / "cri-containerd-abc.scope"
    scope.mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory pids\n")
    (scope / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 0\n")
    assert OomKills(v2).count("kubepods-pod1.slice:cri-containerd:abc") == 0
    (scope / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\n")  # before 4.13
    assert OomKills(v2).count("kubepods-pod1.slice:cri-containerd:abc") is None
    assert OomKills(v2).count("") is None
