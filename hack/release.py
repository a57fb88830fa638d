"""A release, made on this machine from its tag and pushed nowhere:
`hack/release.sh VERSION [OUT] --key COSIGN_KEY`, in a checkout of tag vVERSION.

Into OUT (default dist/VERSION):
- deathwatch-VERSION.tgz: the Helm chart (`helm package`, version and appVersion VERSION);
- deathwatch-controller-VERSION.oci.tar, deathwatch-firewall-VERSION.oci.tar: both images
  as OCI layouts (built from their Dockerfiles by hack/build-images.sh), named as the chart's
  default images (ghcr.io/deathwatch-dev/{controller,firewall}:VERSION), their digests in
  images.json (the manifest's: what a registry reports after a push);
- deathwatch-controller-VERSION.spdx.json, ...-firewall-...: each image's SPDX 2.3 SBOM,
  written by syft from the image's own layers;
- CHANGELOG.md: this version's entry (CHANGELOG.md's `## VERSION` section, else its
  `## Unreleased` one, titled with VERSION and today's date);
- cosign.pub: the public half of the key that signed the release;
- SHA256SUMS: every file above; SHA256SUMS.sigstore.json: its cosign signature (a Sigstore
  bundle; offline, no transparency log), which so covers every file and both image digests.

cosign and syft are built from their pinned modules (hack/build-release-tools.sh). VERSION
must be the repository's VERSION file, and the checkout its tag vVERSION, clean. Bad input is
one line and exit 2. docs/install.md says how to verify a release and push it to a registry.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import yaml

from hack.localcluster.controlplane import cache_dir, versions

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ("controller", "firewall")


class ReleaseError(Exception):
    pass


def changelog_entry(text: str, version: str, today: str) -> str:
    """This version's section of a Keep-a-Changelog file, titled with the version."""
    sections = re.split(r"(?m)^## ", text)
    by_title = {s.split("\n", 1)[0].strip(): s for s in sections[1:]}
    for title, body in by_title.items():
        if title.split()[0].strip("[]") == version:
            return "## " + body.rstrip() + "\n"
    unreleased = by_title.get("Unreleased")
    if unreleased is None:
        raise ReleaseError(f"CHANGELOG.md: no `## {version}` and no `## Unreleased` section")
    return f"## {version} - {today}" + unreleased[len("Unreleased") :].rstrip() + "\n"


def _blob(archive: tarfile.TarFile, digest: str) -> bytes:
    member = archive.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
    if member is None:
        raise ReleaseError(f"{archive.name!s}: no blob {digest}")
    return member.read()


def retagged(source: Path, target: Path, name: str) -> str:
    """The OCI archive at `source` copied to `target` with its one image named `name`; the
    image's digest (its manifest's, unchanged: index.json is not part of the image)."""
    with tarfile.open(source) as src, tarfile.open(target, "w") as out:
        index = json.loads(src.extractfile("index.json").read())  # type: ignore[union-attr]
        [manifest] = index["manifests"]
        manifest.setdefault("annotations", {})["org.opencontainers.image.ref.name"] = name
        for member in src.getmembers():
            if member.name == "index.json":
                data = json.dumps(index).encode()
                info = tarfile.TarInfo("index.json")
                info.size, info.mtime, info.mode = len(data), member.mtime, member.mode
                out.addfile(info, io.BytesIO(data))
            else:
                out.addfile(member, src.extractfile(member) if member.isfile() else None)
    return str(manifest["digest"])


def tool(name: str) -> Path:
    """A release tool (cosign, syft) built from its pinned module (hack/build-release-tools.sh)."""
    version = versions()[name.upper() + "_VERSION"]
    binary = cache_dir() / "release-tools" / f"{name}-{version}" / "bin" / name
    if not binary.exists():
        subprocess.run([str(ROOT / "hack" / "build-release-tools.sh")], check=True, timeout=3600)
    return binary


def _run(*args: str | Path) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False,
                          timeout=600, env={**os.environ, "SYFT_CHECK_FOR_APP_UPDATE": "false"})  # fmt: skip
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["(nothing)"])[-1]
        raise ReleaseError(f"{Path(str(args[0])).name} {args[1]}: {said}")
    return done.stdout


def sbom(image: str, version: str, archive: Path, out: Path) -> None:
    """The image's SPDX 2.3 SBOM, by syft, from the archive's own layers (every Debian package
    and Python distribution in it)."""
    _run(tool("syft"), "scan", f"oci-archive:{archive}", "--source-name", image.rsplit(":", 1)[0],
         "--source-version", version, "-q", "-o", f"spdx-json={out}")  # fmt: skip


def image_names(version: str) -> dict[str, str]:
    """Each image's release name: the chart's default repository (where the project publishes
    its releases: stated once, in values.yaml) and the version."""
    values = yaml.safe_load((ROOT / "charts" / "deathwatch" / "values.yaml").read_text())
    return {dist: f"{published(values[dist]['image'])}:{version}" for dist in IMAGES}


def published(image: dict[str, str]) -> str:
    """An image of the chart's values, as published: its registry, then its repository."""
    return f"{image['registry']}/{image['repository']}"


def sign(key: Path, path: Path) -> Path:
    """`path` signed with the release's cosign key (COSIGN_PASSWORD, if it has one): a
    Sigstore bundle beside it. Offline: no transparency log, no certificate authority."""
    bundle = path.with_name(path.name + ".sigstore.json")
    _run(tool("cosign"), "sign-blob", "--key", key, "--bundle", bundle,
         "--use-signing-config=false", "--tlog-upload=false", "--yes", path)  # fmt: skip
    return bundle


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def release(version: str, out: Path, key: Path) -> dict[str, Any]:
    wanted = (ROOT / "VERSION").read_text().strip()
    if version != wanted:
        raise ReleaseError(f"VERSION {version!r}: the VERSION file says {wanted!r} (bump it first)")
    tagged = subprocess.run(["git", "-C", str(ROOT), "tag", "--points-at", "HEAD"],
                            capture_output=True, text=True, timeout=30, check=False).stdout.split()  # fmt: skip
    if f"v{version}" not in tagged:
        raise ReleaseError(f"VERSION {version!r}: HEAD is not tag v{version} (a release is made "
                           f"from its tag: git worktree add DIR v{version})")  # fmt: skip
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=30, check=False).stdout  # fmt: skip
    if dirty.strip():
        raise ReleaseError(f"tag v{version}: the checkout has changes ({dirty.split()[-1]} ...)")
    now = datetime.datetime.now(datetime.UTC)
    entry = changelog_entry((ROOT / "CHANGELOG.md").read_text(), version, now.date().isoformat())
    out.mkdir(parents=True, exist_ok=True)
    built = json.loads(subprocess.run([str(ROOT / "hack" / "build-images.sh"), "--json"],
                                      capture_output=True, text=True, check=True,
                                      timeout=3600).stdout)  # fmt: skip
    images: dict[str, Any] = {}
    for dist, name in image_names(version).items():
        archive = out / f"deathwatch-{dist}-{version}.oci.tar"
        digest = retagged(Path(built[dist]["archive"]), archive, name)
        spdx = out / f"deathwatch-{dist}-{version}.spdx.json"
        sbom(name, version, archive, spdx)
        images[dist] = {"name": name, "digest": digest, "archive": archive.name,
                        "sbom": spdx.name}  # fmt: skip
    (out / "images.json").write_text(json.dumps(images, indent=1) + "\n")
    from hack.render_manifests import helm

    helm("package", str(ROOT / "charts" / "deathwatch"), "--version", version,
         "--app-version", version, "-d", str(out))  # fmt: skip
    (out / "CHANGELOG.md").write_text(entry)
    (out / "cosign.pub").write_text(_run(tool("cosign"), "public-key", "--key", key))
    files = sorted(p for p in out.iterdir() if p.is_file() and p.name != "SHA256SUMS")
    sums = out / "SHA256SUMS"
    sums.write_text("".join(f"{_sha256(p)}  {p.name}\n" for p in files))
    # one signature covers every file, the images' digests (images.json) among them
    bundle = sign(key, sums)
    return {"version": version, "out": str(out), "images": images,
            "files": [p.name for p in files] + [sums.name, bundle.name]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hack/release.sh", description=__doc__.splitlines()[0])
    ap.add_argument("version", help="the release's version: the VERSION file's")
    ap.add_argument("out", nargs="?", help="where (default: dist/VERSION)")
    ap.add_argument("--key", required=True, type=Path,
                    help="the release's cosign private key (`cosign generate-key-pair`; its "
                         "password in COSIGN_PASSWORD)")  # fmt: skip
    args = ap.parse_args(argv)
    if not args.key.is_file():
        print(f"hack/release.sh: --key {args.key}: no such file", file=sys.stderr)
        return 2
    if not re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", args.version):
        print(f"hack/release.sh: VERSION {args.version!r}: not a semantic version like 1.2.3",
              file=sys.stderr)  # fmt: skip
        return 2
    out = Path(args.out) if args.out else ROOT / "dist" / args.version
    if out.exists() and any(out.iterdir()):
        print(f"hack/release.sh: {out}: not empty (a release is made once)", file=sys.stderr)
        return 2
    made_here = not out.exists()
    try:
        made = release(args.version, out, args.key)
    except ReleaseError as exc:
        print(f"hack/release.sh: {exc}", file=sys.stderr)
        if made_here:
            shutil.rmtree(out, ignore_errors=True)
        return 2
    print(json.dumps(made, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
