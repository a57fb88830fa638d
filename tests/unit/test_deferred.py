"""The builds beside the lanes (hack/deferred.py, hack/build-deferred.sh): a test waits for
its build, a failed build fails it with the build's end, a build gone without a status fails
it, and without a CI run of every lane nothing waits. Real processes, a real script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hack import deferred

ROOT = Path(__file__).resolve().parents[2]


def test_without_a_run_of_every_lane_nothing_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(deferred.ENV, raising=False)
    assert deferred.wait("k8s-matrix") == 0.0
    assert deferred.report() == []


def test_an_unknown_build_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(deferred.ENV, str(tmp_path))
    with pytest.raises(ValueError, match="'helm'"):
        deferred.wait("helm")


def _beside(tmp_path: Path, name: str, script: str) -> subprocess.Popen[bytes]:
    """A build's process in a session of its own, as hack/setup.sh starts each."""
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    (tmp_path / f"{name}.pid").write_text(f"{process.pid}\n")
    return process


def test_a_test_waits_until_its_build_has_ended_well(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(deferred.ENV, str(tmp_path))
    monkeypatch.setattr(deferred, "POLL_SECONDS", 0.05)
    rc = tmp_path / "gvisor.rc"
    # the build ends when the test says so: a file it creates, then the status written whole
    go = tmp_path / "go"
    process = _beside(
        tmp_path,
        "gvisor",
        f"""
import pathlib, time
while not pathlib.Path({str(go)!r}).exists():
    time.sleep(0.01)
pathlib.Path({str(rc)!r} + ".tmp").write_text("0\\n")
pathlib.Path({str(rc)!r} + ".tmp").rename({str(rc)!r})
""",
    )
    try:
        assert deferred.status("gvisor") is None
        assert deferred.report()[0].startswith("gvisor: running")
        go.touch()
        waited = deferred.wait("gvisor", timeout=30)
        assert deferred.status("gvisor") == 0 and waited > 0
    finally:
        process.wait(10)


def test_a_failed_build_fails_the_wait_with_its_end(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(deferred.ENV, str(tmp_path))
    (tmp_path / "k8s-matrix.log").write_text("building kube-apiserver v1.33.13\nno space left\n")
    (tmp_path / "k8s-matrix.rc").write_text("1\n")
    with pytest.raises(deferred.DeferredBuildFailed, match=r"exit 1(.|\n)*no space left"):
        deferred.wait("k8s-matrix", timeout=5)


def test_a_build_gone_without_a_status_fails_the_wait(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(deferred.ENV, str(tmp_path))
    _beside(tmp_path, "release-tools", "pass").wait(10)
    with pytest.raises(deferred.DeferredBuildFailed, match="not running and left no status"):
        deferred.wait("release-tools", timeout=5)


def test_a_build_that_overruns_its_wait_fails_it_and_stop_ends_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(deferred.ENV, str(tmp_path))
    monkeypatch.setattr(deferred, "POLL_SECONDS", 0.05)
    process = _beside(tmp_path, "k8s-matrix", "import time; time.sleep(60)")
    with pytest.raises(deferred.DeferredBuildFailed, match="has not ended in 0 s"):
        deferred.wait("k8s-matrix", timeout=0.2)
    deferred.stop()
    assert process.wait(10) != 0  # ended by SIGTERM to its session


def test_the_script_records_each_builds_status_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    """hack/build-deferred.sh --record: an unknown name is the build's failure, recorded, and
    the builds after it still run."""
    done = subprocess.run([str(ROOT / "hack" / "build-deferred.sh"), "--record", str(tmp_path),
                           "nothing", "nothing-else"], capture_output=True, text=True,
                          timeout=30, check=False, env={**os.environ})  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name in ("nothing", "nothing-else"):
        assert (tmp_path / f"{name}.rc").read_text().strip() == "2"
        log = (tmp_path / f"{name}.log").read_text()
        assert f"unknown build: {name}" in log and f"{name}: exit 2 after" in log


def test_each_module_that_needs_a_build_is_named_and_the_version_lane_runs_last() -> None:
    """tests/conftest.py waits, before a test's timeout starts, for what its module needs."""
    assert deferred.needed(ROOT / "tests/apiserver/test_versions.py", ROOT) == ("k8s-matrix",)
    assert deferred.needed(ROOT / "tests/node/test_agent_sandbox.py", ROOT) == ("gvisor",)
    assert deferred.needed(ROOT / "tests/deploy/test_release.py", ROOT) == ("release-tools",)
    assert deferred.needed(ROOT / "tests/unit/test_engine.py", ROOT) == ()
    assert deferred.needed(Path("/elsewhere/test_x.py"), ROOT) == ()
    for modules in deferred.NEEDED_BY.values():
        assert all((ROOT / m).is_file() for m in modules), modules
    assert deferred.LAST == ("tests/apiserver/test_versions.py",)
