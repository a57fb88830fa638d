"""A container's OOM kills, counted by the kernel in its memory cgroup (ADR 0028).

containerd's OOM event for a container can come after its exit (1 of 240 OOM kills in
bench/node_latency.py, 5.4 ms after), so a SIGKILL's exit (137) with no OOM event yet is held
for one (`--oom-wait`): every plain SIGKILL waited those 20 ms. The kernel counts an OOM kill
in the victim's memory cgroup before it signals the victim (mm/oom_kill.c: the
MEMCG_OOM_KILL event, then SIGKILL), so at the victim's exit the count is already there:
`oom_kill` in memory.oom_control (cgroup v1) or memory.events (v2). None counted: no OOM
killer took the container's process, and its exit is published at once; one or more, or the
cgroup unreadable (removed already, not mounted): held for the OOM event as before.

Read only: the host's cgroup tree is mounted read-only, and this module opens files in it
for reading. Paths come from the container's OCI spec (linux.cgroupsPath) as the runtime
holds it, in either form the kubelet's cgroup drivers write: cgroupfs
(/kubepods/burstable/pod<uid>/<id>) or systemd
(kubepods-burstable-pod<uid>.slice:cri-containerd:<id>).
"""

from __future__ import annotations

from pathlib import Path


def relative(cgroups_path: str) -> str | None:
    """The directory a spec's linux.cgroupsPath names, relative to a hierarchy's root
    (None: not a form this reads)."""
    if not cgroups_path:
        return None
    if cgroups_path.startswith("/"):  # cgroupfs: the path itself
        parts = [p for p in cgroups_path.split("/") if p]
        return "/".join(parts) if parts and ".." not in parts else None
    # systemd: SLICE:PREFIX:NAME, the slice nested by its dashes (a-b.slice in a.slice)
    fields = cgroups_path.split(":")
    if len(fields) != 3 or not fields[0].endswith(".slice") or not fields[2]:
        return None
    slice_, prefix, name = fields
    if "/" in slice_ or "/" in prefix or "/" in name or ".." in name:
        return None
    stem = slice_.removesuffix(".slice")
    words = stem.split("-")
    slices = ["-".join(words[: i + 1]) + ".slice" for i in range(len(words)) if words[i]]
    if not slices or slices[-1] != slice_:
        return None
    unit = f"{prefix}-{name}.scope" if prefix else f"{name}.scope"
    return "/".join([*slices, unit])


class OomKills:
    """OOM kills counted in containers' memory cgroups under `root` (the host's
    /sys/fs/cgroup, mounted read-only): v1 where it has a memory hierarchy, v2 otherwise."""

    def __init__(self, root: Path) -> None:
        self.root = root
        if (root / "memory").is_dir():
            self.base, self.file, self.key = root / "memory", "memory.oom_control", "oom_kill"
        else:
            self.base, self.file, self.key = root, "memory.events", "oom_kill"

    def count(self, cgroups_path: str, pod: bool = False) -> int | None:
        """OOM kills in the container's cgroup so far, or with `pod` in its pod's (the
        parent: where a gVisor sandbox's processes are, runtime.py). None: unreadable, or a
        path this does not read: the caller waits for the runtime's OOM event as before."""
        rel = relative(cgroups_path)
        if rel is not None and pod:
            rel = rel.rpartition("/")[0] or None
        if rel is None:
            return None
        try:
            text = (self.base / rel / self.file).read_text()
        except OSError:  # removed with its container already, or never mounted here
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == self.key and value.strip().isdigit():
                return int(value)
        return None  # a kernel without the counter (< 4.13): the OOM event decides
