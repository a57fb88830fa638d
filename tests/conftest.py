"""Suite-wide rules. A test's folder is its lane: tests/unit/ needs nothing but the Python
packages (the fast loop: `python3 -m pytest tests/unit`), every other folder is named for the
marker its tests carry (tests/apiserver/: `apiserver`, ...), and a test where its marker does
not say it is refused at collection. In CI (CI=true) a skipped test that needs a real
component is a failure: a missing install step must not hide behind a skip."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator
from pathlib import Path

import pytest

from hack import deferred

ENFORCED_IN_CI = (
    "apiserver",
    "netns",
    "node",
    "chaos",
    "deploy",
    "helm",
    "prometheus",
    "monitoring",
    "browser",
)
# the folders of tests/ that are lanes, each named for its marker (tests/unit: no marker)
LANES = ("apiserver", "netns", "node", "chaos", "deploy", "e2e", "helm", "prometheus", "browser")
LANE_MARKERS = (*LANES, "monitoring")
TESTS = Path(__file__).resolve().parent
_skipped_real: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The folder says the lane, and the markers agree: a unit test needs no real component,
    a test in tests/<lane>/ is marked <lane> (so `-m` and the folder select the same tests).
    The modules that wait for a build beside the lanes run last (hack/deferred.py: LAST), each
    whole and in its order, so the build has the rest of the run's time."""
    last = {(TESTS.parent / module).resolve() for module in deferred.LAST}
    items.sort(key=lambda item: Path(item.path).resolve() in last)  # stable: the rest in order
    wrong = []
    for item in items:
        try:
            parts = Path(item.path).resolve().relative_to(TESTS).parts
        except ValueError:
            continue  # not one of ours (a path given outside tests/)
        folder = parts[0] if len(parts) > 1 else ""
        marks = {m for m in LANE_MARKERS if item.get_closest_marker(m)}
        if folder == "unit":
            if marks:
                wrong.append(f"{item.nodeid}: a unit test marked {sorted(marks)}")
        elif folder not in LANES:
            wrong.append(f"{item.nodeid}: tests live in tests/unit or tests/<lane>, {LANES}")
        elif folder not in marks:
            wrong.append(f"{item.nodeid}: in tests/{folder}/ but not marked {folder}")
    if wrong:
        raise pytest.UsageError("tests in the wrong lane:\n  " + "\n  ".join(wrong))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    """A module that needs a build made beside the lanes (hack/deferred.py) waits for it here,
    before its test's timeout starts (pytest-timeout's wrapper is inside this one): the wait is
    the build's, not the test's. A failed build is said by the test's own `deferred.wait`."""
    for name in deferred.needed(Path(item.path), TESTS.parent):
        with contextlib.suppress(deferred.DeferredBuildFailed):
            deferred.wait(name)
    yield


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped:
        marks = [m for m in ENFORCED_IN_CI if item.get_closest_marker(m)]
        if marks:
            reason = (
                report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            )
            _skipped_real.append(f"{item.nodeid} [{','.join(marks)}]: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped_real and in_ci():
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("")
            reporter.write_line(
                f"CI: {len(_skipped_real)} test(s) needing real components were skipped:", red=True
            )
            for line in _skipped_real[:20]:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- the real control plane (marker: apiserver) -------------------------------------------

import shutil  # noqa: E402
import subprocess  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

from hack.localcluster import controlplane  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _binaries_or_skip(*extra: str) -> None:
    """The control plane's binaries (and `extra` components), built once if missing."""
    wanted = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", *extra)
    missing = [b for b in wanted if not (controlplane.bin_dir() / b).exists()]
    if not missing:
        return
    if shutil.which("go") is None:
        pytest.skip(
            f"no Go to build the control plane ({', '.join(missing)} missing); see hack/build-k8s.sh"
        )
    # builds once (minutes), then cached in ~/.cache/deathwatch for every later run
    subprocess.run([str(ROOT / "hack" / "build-k8s.sh"), *wanted], check=True, timeout=3600)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[controlplane.ControlPlane]:
    _binaries_or_skip()
    with controlplane.running() as cp:
        cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests" / "base" / "crds"))
        cp.kubectl_run(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/deathwatches.deathwatch.dev",
            "crd/sandboxverdicts.deathwatch.dev",
        )
        yield cp


@pytest.fixture(scope="session")
def api(control_plane: controlplane.ControlPlane) -> Iterator[object]:
    """An admin kubernetes.client.ApiClient for the test control plane."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(
        config_file=str(control_plane.kubeconfig), client_configuration=configuration
    )
    with client.ApiClient(configuration) as api_client:
        yield api_client


@pytest.fixture
def namespace(control_plane: controlplane.ControlPlane, api: object) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists (pods can be created at once)."""
    from kubernetes import client

    from tests.kube import fresh_namespace

    name = f"t-{uuid.uuid4().hex[:10]}"
    fresh_namespace(api, name)
    yield name
    client.CoreV1Api(api).delete_namespace(name, _request_timeout=30)


# --- the controller as a process under its ServiceAccount (tests/controller_env.py) ---------

from tests.controller_env import Env  # noqa: E402


@pytest.fixture(scope="session")
def controller_rbac(control_plane: controlplane.ControlPlane) -> str:
    """The controller's ServiceAccount and ClusterRole, and who may read its metrics, exactly
    as manifests/ ship them."""
    control_plane.kubectl_run("create", "namespace", "deathwatch-system", check=False)
    for role in ("controller.yaml", "metrics-reader.yaml"):
        control_plane.kubectl_run("apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / role))
    return "deathwatch-controller"


@pytest.fixture
def env(
    control_plane: controlplane.ControlPlane,
    api: object,
    namespace: str,
    controller_rbac: str,
    tmp_path: Path,
) -> Iterator[Env]:
    e = Env(control_plane, api, namespace, tmp_path)
    e.bind_controller()
    yield e
    if e.controller is not None:
        forbidden = e.forbidden_calls()
        print(e.controller.tail(60))
        e.controller.stop()
        if not e.forbidden_expected:
            assert forbidden == 0, "the controller was refused an API call its role should allow"
