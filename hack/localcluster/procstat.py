"""A process's resources as /proc says them, for benches and tests: resident memory (now, at
its peak so far, or sampled over a block), CPU seconds, open descriptors."""

from __future__ import annotations

import os
import threading
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident memory now (VmRSS) or at its peak so far (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


class PeakRss:
    """A process's resident memory sampled every 0.1 s while in the block: its peak there
    (VmHWM is the peak since the process began)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
            except OSError:
                return  # it has gone: its peak so far stands
            self._stop.wait(0.1)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


CGROUPS = Path("/sys/fs/cgroup")


def container_cpu(pod_uid: str, container_id: str) -> dict[str, float]:
    """A pod's container's CPU as its cgroup says it (v1, the kubelet's cgroupfs driver:
    kubepods[/burstable|/besteffort]/pod<uid>/<container id>): seconds used, CFS periods run,
    periods throttled by its CPU limit and the seconds it waited for them."""
    for qos in ("", "burstable/", "besteffort/"):
        rel = f"kubepods/{qos}pod{pod_uid}/{container_id}"
        if (CGROUPS / "cpu" / rel).is_dir():
            break
    else:
        raise FileNotFoundError(f"no cpu cgroup for container {container_id} of pod {pod_uid}")
    stat = dict(
        line.split() for line in (CGROUPS / "cpu" / rel / "cpu.stat").read_text().splitlines()
    )
    used = int((CGROUPS / "cpuacct" / rel / "cpuacct.usage").read_text())
    return {
        "cpu_seconds": used / 1e9,
        "periods": float(stat["nr_periods"]),
        "throttled_periods": float(stat["nr_throttled"]),
        "throttled_seconds": int(stat["throttled_time"]) / 1e9,
    }
