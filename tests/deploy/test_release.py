"""`hack/release.sh VERSION`: the chart package, both images as OCI layouts with their digests,
an SBOM of each read from the image's own layers, the CHANGELOG entry and checksums, made on
this machine (the images as the deploy lane builds them) and pushed nowhere."""

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

pytestmark = pytest.mark.deploy
ROOT = Path(__file__).resolve().parents[2]
VERSION = (ROOT / "VERSION").read_text().strip()


def release(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / "hack" / "release.sh"), *args], capture_output=True,
                          text=True, timeout=3600, check=False)  # fmt: skip


def test_a_release_is_every_artifact_with_digests_sboms_and_checksums(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("buildah") is None:
        pytest.skip("the images need root and buildah (hack/setup.sh)")
    out = tmp_path / "dist"
    done = release(VERSION, str(out))
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([
        "CHANGELOG.md", "SHA256SUMS", "images.json", f"deathwatch-{VERSION}.tgz",
        *(f"deathwatch-{d}-{VERSION}.{kind}" for d in ("controller", "firewall")
          for kind in ("oci.tar", "spdx.json")),
    ])  # fmt: skip
    assert sorted(made["files"]) == names
    # every checksum holds
    for line in (out / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name
    images = json.loads((out / "images.json").read_text())
    for dist, must in (("controller", "deathwatch"), ("firewall", "deathwatch-firewall")):
        image = images[dist]
        assert image["name"] == f"deathwatch/{dist}:{VERSION}"
        with tarfile.open(out / image["archive"]) as archive:
            index = json.loads(archive.extractfile("index.json").read())  # type: ignore[union-attr]
            [manifest] = index["manifests"]
            assert manifest["annotations"]["org.opencontainers.image.ref.name"] == image["name"]
            blob = archive.extractfile(f"blobs/sha256/{image['digest'].split(':')[1]}")
            assert blob is not None  # the digest is the manifest's own
            assert "sha256:" + hashlib.sha256(blob.read()).hexdigest() == image["digest"]
        spdx = json.loads((out / image["sbom"]).read_text())
        assert spdx["spdxVersion"] == "SPDX-2.3" and image["digest"] in spdx["name"]
        listed = {p["name"] for p in spdx["packages"]}
        assert {"python3", must, "msgspec"} <= listed, sorted(listed)[:20]
        if dist == "firewall":
            assert "nftables" in listed
    with tarfile.open(out / f"deathwatch-{VERSION}.tgz") as chart:
        meta = yaml.safe_load(chart.extractfile("deathwatch/Chart.yaml").read())  # type: ignore[union-attr]
    assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)
    assert (out / "CHANGELOG.md").read_text().startswith(f"## {VERSION}")
    # made once: the same directory again is refused, as is a version the repo is not at
    again = release(VERSION, str(out))
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "not empty" in again.stderr
    other = release("9.9.9", str(tmp_path / "other"))
    assert other.returncode == 2 and f"the VERSION file says '{VERSION}'" in other.stderr
    assert not (tmp_path / "other").exists()
    bad = release("v1", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "not a semantic version" in bad.stderr
