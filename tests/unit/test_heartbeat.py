"""The liveness probe no neighbour can starve (issue #51): the heartbeat written to a file at
every beat, read by the chart's exec probe (sh and coreutils, as in the images). Here the
probe's own command against a real heartbeat: alive, stalled, failing, unwritable; the chart
runs exactly this command for each process. Under a flood from the kubelet's own address:
tests/netns/test_ports.py."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from deathwatch._kube.ports import HEARTBEAT_PROBE, Heartbeat, heartbeat_file


def probe(path: Path, seconds: int = 30) -> bool:
    command = HEARTBEAT_PROBE.format(path=path, seconds=seconds)
    return subprocess.run(["sh", "-c", command], timeout=10, check=False).returncode == 0


def test_the_probe_says_alive_while_the_loop_beats_ok_and_recently(tmp_path: Path) -> None:
    file = heartbeat_file(str(tmp_path / "heartbeat"))
    assert not probe(file)  # written at start: "starting", not yet a beat
    beats = Heartbeat(file=file)
    beats.beat()
    assert probe(file) and file.read_text() == "ok\n"
    beats.beat(failing=("reflector",))
    assert not probe(file) and "reflector" in file.read_text()
    beats.beat()
    old = time.time() - 31
    os.utime(file, (old, old))  # the loop stopped turning 31 s ago
    assert not probe(file)
    assert probe(file, seconds=60)
    assert not list(tmp_path.glob("*.new"))  # written whole, by a rename


def test_a_heartbeat_file_that_cannot_be_written_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot write"):
        heartbeat_file(str(tmp_path / "no-such-dir" / "heartbeat"))


def test_a_write_failing_later_is_said_and_the_probe_fails(tmp_path: Path) -> None:
    file = heartbeat_file(str(tmp_path / "heartbeat"))
    beats = Heartbeat(file=file)
    beats.beat()
    assert probe(file)
    file.unlink()
    (tmp_path / "heartbeat.new").mkdir()  # the staged write cannot be made
    beats.beat()
    assert beats.file_error is not None and not probe(file)
