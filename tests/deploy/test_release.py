"""A release as a platform receives it (issue #53): `hack/release.sh` run in a worktree of the
newest tag, as its maintainer runs it (hack/localcluster/released.py): the chart, both images
as OCI layouts named where the chart looks for them, syft's SBOM of each, the CHANGELOG
entry, the public key, and SHA256SUMS signed by cosign. Verified the way docs/install.md
says; a changed byte fails it. The script refuses, in one line, what would not be that
release."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from hack.localcluster import released
from hack.release import published, tool

pytestmark = pytest.mark.deploy
ROOT = Path(__file__).resolve().parents[2]


def release(
    *args: str, cwd: Path = ROOT, key: Path | None = None
) -> subprocess.CompletedProcess[str]:
    more = ["--key", str(key)] if key else []
    return subprocess.run([str(cwd / "hack" / "release.sh"), *args, *more], capture_output=True,
                          text=True, timeout=3600, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def made() -> Path:
    if os.geteuid() != 0 or shutil.which("buildah") is None:
        pytest.skip("the images need root and buildah (hack/setup.sh)")
    return released.made(released.newest_tag())


def verify(out: Path, sums: Path) -> subprocess.CompletedProcess[str]:
    """docs/install.md's verify command."""
    return subprocess.run([str(tool("cosign")), "verify-blob", "--key", str(out / "cosign.pub"),
                           "--bundle", str(out / "SHA256SUMS.sigstore.json"),
                           "--insecure-ignore-tlog=true", str(sums)],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def test_the_release_of_the_tag_is_every_artifact_signed_with_sboms(made: Path) -> None:
    tag = released.newest_tag()
    version = tag.removeprefix("v")
    names = sorted(p.name for p in made.iterdir())
    assert names == sorted([
        "CHANGELOG.md", "SHA256SUMS", "SHA256SUMS.sigstore.json", "cosign.pub", "images.json",
        f"deathwatch-{version}.tgz",
        *(f"deathwatch-{d}-{version}.{kind}" for d in ("controller", "firewall")
          for kind in ("oci.tar", "spdx.json")),
    ])  # fmt: skip
    listed = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=made, capture_output=True,
                            text=True, timeout=120, check=False)  # fmt: skip
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert len(listed.stdout.splitlines()) == len(names) - 2  # all but itself and its signature
    ok = verify(made, made / "SHA256SUMS")
    assert ok.returncode == 0 and "Verified OK" in ok.stderr, ok.stderr
    tampered = made.parent / f"{made.name}.tampered-SHA256SUMS"
    text = (made / "SHA256SUMS").read_text()
    tampered.write_text(text.replace(text[0], "0" if text[0] != "0" else "1", 1))
    try:
        assert verify(made, tampered).returncode != 0
    finally:
        tampered.unlink()
    images = json.loads((made / "images.json").read_text())
    values = yaml.safe_load((ROOT / "charts" / "deathwatch" / "values.yaml").read_text())
    for dist, must in (("controller", "deathwatch"), ("firewall", "deathwatch-firewall")):
        image = images[dist]
        # where the chart's defaults look: installed with no image value, it runs these
        assert image["name"] == f"{published(values[dist]['image'])}:{version}"
        with tarfile.open(made / image["archive"]) as archive:
            index = json.loads(archive.extractfile("index.json").read())  # type: ignore[union-attr]
            [manifest] = index["manifests"]
            assert manifest["annotations"]["org.opencontainers.image.ref.name"] == image["name"]
            blob = archive.extractfile(f"blobs/sha256/{image['digest'].split(':')[1]}")
            assert blob is not None  # the digest is the manifest's own
            assert "sha256:" + hashlib.sha256(blob.read()).hexdigest() == image["digest"]
        spdx = json.loads((made / image["sbom"]).read_text())
        assert spdx["spdxVersion"] == "SPDX-2.3", spdx["spdxVersion"]
        assert any(c.startswith("Tool: syft-") for c in spdx["creationInfo"]["creators"])
        assert spdx["name"] == image["name"].rsplit(":", 1)[0]
        packages = {p["name"] for p in spdx["packages"]}
        assert {"python3", must, "msgspec"} <= packages, sorted(packages)[:20]
        if dist == "firewall":
            assert "nftables" in packages
    with tarfile.open(made / f"deathwatch-{version}.tgz") as chart:
        meta = yaml.safe_load(chart.extractfile("deathwatch/Chart.yaml").read())  # type: ignore[union-attr]
    assert (meta["version"], meta["appVersion"]) == (version, version)
    assert (made / "CHANGELOG.md").read_text().startswith(f"## {version} - ")


def test_release_refuses_what_would_not_be_the_tags_release(made: Path, tmp_path: Path) -> None:
    """Each refusal one line and exit 2: an untagged checkout, a changed one, a version the
    VERSION file does not say, a directory not empty, no key."""
    tag = released.newest_tag()
    version = tag.removeprefix("v")
    key = tmp_path / "release.key"
    subprocess.run([str(tool("cosign")), "generate-key-pair", "--output-key-prefix",
                    str(tmp_path / "release")], cwd=tmp_path, capture_output=True, check=True,
                   timeout=60, env={**os.environ, "COSIGN_PASSWORD": ""})  # fmt: skip
    worktree = tmp_path / "src"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), tag],
                   capture_output=True, check=True, timeout=120)  # fmt: skip
    try:
        untagged = subprocess.run(["git", "-C", str(worktree), "-c", "user.name=lane", "-c",
                                   "user.email=lane@deathwatch.dev", "commit", "-q", "--allow-empty",
                                   "-m", "after the tag"], capture_output=True, timeout=60,
                                  check=False)  # fmt: skip
        assert untagged.returncode == 0, untagged.stderr
        said = release(version, str(tmp_path / "a"), cwd=worktree, key=key)
        assert said.returncode == 2 and f"HEAD is not tag {tag}" in said.stderr, said.stderr
        subprocess.run(["git", "-C", str(worktree), "checkout", "-q", "--detach", tag], check=True,
                       timeout=60)  # fmt: skip
        with (worktree / "README.md").open("a") as readme:
            readme.write("\nchanged\n")
        said = release(version, str(tmp_path / "b"), cwd=worktree, key=key)
        assert said.returncode == 2 and "the checkout has changes" in said.stderr, said.stderr
        said = release("9.9.9", str(tmp_path / "c"), cwd=worktree, key=key)
        assert said.returncode == 2 and f"the VERSION file says '{version}'" in said.stderr
        said = release(version, str(made), cwd=worktree, key=key)
        assert said.returncode == 2 and "not empty" in said.stderr
        said = release(version, str(tmp_path / "d"), cwd=worktree, key=tmp_path / "none.key")
        assert said.returncode == 2 and "--key" in said.stderr and "no such file" in said.stderr
        said = release("v1", str(tmp_path / "e"), cwd=worktree, key=key)
        assert said.returncode == 2 and "not a semantic version" in said.stderr
        for refused in (tmp_path / n for n in "abcde"):
            assert not refused.exists(), refused
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                       capture_output=True, timeout=120, check=False)  # fmt: skip
