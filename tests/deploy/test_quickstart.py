"""The README's Install section, run as written on a fresh cluster (issue #53). Its commands
are read from README.md itself and run one by one in a shell with kubectl, helm and
deathwatch on PATH and the cluster's kubeconfig, from the repository (where
manifests/examples lives). One change: the chart's address. The published
`oci://ghcr.io/deathwatch-dev/charts/deathwatch --version X` is the newest release as made from
its tag (hack/localcluster/released.py), whose images are imported under the names the chart
looks for, as a registry would serve them. Then a sandbox the example DeathWatch selects
lives and dies, told by `deathwatch wait`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.localcluster import cluster, controlplane, images, released
from hack.render_manifests import helm_bin
from tests.conftest import _binaries_or_skip

pytestmark = pytest.mark.deploy
ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = re.compile(r"oci://ghcr\.io/deathwatch-dev/charts/deathwatch --version (\S+)")


def install_commands(readme: str) -> list[str]:
    """The shell commands of README.md's `## Install` section, a line continued by a
    backslash joined to the next."""
    section = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    return [c.strip() for block in blocks for c in block.replace("\\\n", " ").splitlines()
            if c.strip() and not c.strip().startswith("#")]  # fmt: skip


def test_the_readme_install_section_is_commands_in_order() -> None:
    commands = install_commands((ROOT / "README.md").read_text())
    assert [c.split()[:2] for c in commands] == [
        ["deathwatch", "preflight"], ["kubectl", "create"], ["kubectl", "label"],
        ["helm", "install"], ["kubectl", "create"], ["kubectl", "apply"], ["kubectl", "get"],
    ], commands  # fmt: skip


@pytest.fixture(scope="module")
def fresh() -> Iterator[cluster.Cluster]:
    reason = cluster.available()
    if reason:
        pytest.skip(reason)
    _binaries_or_skip("kubelet", "kube-scheduler", "kube-proxy")
    with cluster.running() as c:
        yield c


def test_the_readme_install_runs_as_written_and_judges_a_sandbox(
    fresh: cluster.Cluster, tmp_path: Path
) -> None:
    tag = released.newest_tag()
    release = released.made(tag)
    for image in json.loads((release / "images.json").read_text()).values():
        fresh.node.import_image(release / image["archive"], image["name"])
    readme = (ROOT / "README.md").read_text()
    [version] = set(PUBLISHED.findall(readme))
    assert version == tag.removeprefix("v"), f"the README installs {version}, the newest is {tag}"
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, path in (("kubectl", controlplane.bin_dir() / "kubectl"), ("helm", helm_bin()),
                       ("deathwatch", Path(shutil.which("deathwatch") or "deathwatch"))):  # fmt: skip
        (tools / name).symlink_to(path)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}",
           "KUBECONFIG": str(fresh.cp.kubeconfig)}  # fmt: skip
    for written in install_commands(readme):
        command = PUBLISHED.sub(str(release / f"deathwatch-{version}.tgz"), written)
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600, check=False)  # fmt: skip
        # preflight reports what will not work with exit 1; anything else must succeed
        allowed = (0, 1) if command.startswith("deathwatch preflight") else (0,)
        assert done.returncode in allowed, f"{command}\n{done.stdout}\n{done.stderr}"
        if command.startswith("deathwatch preflight"):
            assert "kubernetes" in done.stdout, done.stdout
    fresh.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "first", "namespace": "sandboxes", "labels": {"app": "sandbox"}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                 "containers": [{"name": "agent", "image": images.AGENT, "imagePullPolicy": "Never",
                                 "command": ["sh", "-c", "sleep 12; exit 3"]}]},
    }))  # fmt: skip
    for state in ("alive", "dead"):
        waited = subprocess.run(["deathwatch", "wait", "sandboxes/first", "--for", state,
                                 "--timeout", "90s", "--kubeconfig", str(fresh.cp.kubeconfig)],
                                capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert waited.returncode == 0, (state, waited.stdout, waited.stderr, fresh.diagnose())
    listed = fresh.kubectl("get", "sv", "-n", "sandboxes", "first", "-o",
                           "jsonpath={.status.state} {.status.cause} {.status.exitCode}").stdout  # fmt: skip
    assert listed == "Dead ContainerExited 3", listed
