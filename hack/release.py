"""A release, made on this machine and pushed nowhere: `hack/release.sh VERSION [OUT]`.

Into OUT (default dist/VERSION):
- deathwatch-VERSION.tgz: the Helm chart (`helm package`, version and appVersion VERSION);
- deathwatch-controller-VERSION.oci.tar, deathwatch-firewall-VERSION.oci.tar: both images
  as OCI layouts (built from their Dockerfiles by hack/build-images.sh), named
  deathwatch/controller:VERSION and deathwatch/firewall:VERSION, their digests in
  images.json (the manifest's: what a registry reports after a push);
- deathwatch-controller-VERSION.spdx.json, ...-firewall-...: an SBOM of each image (SPDX 2.3:
  every Debian package from the image's dpkg status, every Python distribution from its
  dist-info), read from the image's own layers;
- CHANGELOG.md: this version's entry (CHANGELOG.md's `## VERSION` section, else its
  `## Unreleased` one, titled with VERSION and today's date);
- SHA256SUMS: every file above.

VERSION must be the repository's VERSION file (one version for every part). Bad input is one
line and exit 2. docs/install.md says how a platform pushes the artifacts to its own registry.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def _layers(archive: tarfile.TarFile) -> Iterator[tarfile.TarFile]:
    index = json.loads(archive.extractfile("index.json").read())  # type: ignore[union-attr]
    manifest = json.loads(_blob(archive, index["manifests"][0]["digest"]))
    for layer in manifest["layers"]:
        data = _blob(archive, layer["digest"])
        if layer["mediaType"].endswith("gzip"):
            data = gzip.decompress(data)
        with tarfile.open(fileobj=io.BytesIO(data)) as opened:
            yield opened


def packages(archive_path: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(Debian packages, Python distributions) of the image, each (name, version), from its
    layers (a later layer's file replaces an earlier one's)."""
    dpkg = ""
    python: dict[str, tuple[str, str]] = {}
    with tarfile.open(archive_path) as archive:
        for layer in _layers(archive):
            for member in layer.getmembers():
                name = member.name.lstrip("./")
                if name == "var/lib/dpkg/status" and member.isfile():
                    dpkg = layer.extractfile(member).read().decode()  # type: ignore[union-attr]
                elif name.endswith(".dist-info/METADATA") and member.isfile():
                    text = layer.extractfile(member).read().decode(errors="replace")  # type: ignore[union-attr]
                    fields = dict(
                        line.split(": ", 1) for line in text.split("\n\n")[0].splitlines()
                        if ": " in line
                    )  # fmt: skip
                    if "Name" in fields and "Version" in fields:
                        python[fields["Name"].lower()] = (fields["Name"], fields["Version"])
    debian = []
    for stanza in dpkg.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line)
        if fields.get("Status", "").endswith("installed") and "Package" in fields:
            debian.append((fields["Package"], fields.get("Version", "")))
    return sorted(debian), sorted(python.values())


def sbom(image: str, digest: str, archive: Path, created: str) -> dict[str, Any]:
    debian, python = packages(archive)
    pkgs: list[dict[str, Any]] = []
    for kind, items in (("deb", debian), ("pypi", python)):
        for name, version in items:
            purl = (f"pkg:deb/debian/{name}@{version}" if kind == "deb"
                    else f"pkg:pypi/{name.lower()}@{version}")  # fmt: skip
            pkgs.append({
                "SPDXID": f"SPDXRef-{kind}-{re.sub(r'[^A-Za-z0-9.-]', '-', name)}",
                "name": name, "versionInfo": version, "downloadLocation": "NOASSERTION",
                "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER",
                                  "referenceType": "purl", "referenceLocator": purl}],
            })  # fmt: skip
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{image}@{digest}",
        "documentNamespace": f"https://deathwatch.dev/spdx/{image}/{digest}",
        "creationInfo": {"created": created, "creators": ["Tool: deathwatch hack/release.py"]},
        "packages": pkgs,
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def release(version: str, out: Path) -> dict[str, Any]:
    wanted = (ROOT / "VERSION").read_text().strip()
    if version != wanted:
        raise ReleaseError(f"VERSION {version!r}: the VERSION file says {wanted!r} (bump it first)")
    now = datetime.datetime.now(datetime.UTC)
    entry = changelog_entry((ROOT / "CHANGELOG.md").read_text(), version, now.date().isoformat())
    out.mkdir(parents=True, exist_ok=True)
    built = json.loads(subprocess.run([str(ROOT / "hack" / "build-images.sh"), "--json"],
                                      capture_output=True, text=True, check=True,
                                      timeout=3600).stdout)  # fmt: skip
    images: dict[str, Any] = {}
    for dist in IMAGES:
        name = f"deathwatch/{dist}:{version}"
        archive = out / f"deathwatch-{dist}-{version}.oci.tar"
        digest = retagged(Path(built[dist]["archive"]), archive, name)
        spdx = out / f"deathwatch-{dist}-{version}.spdx.json"
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        spdx.write_text(json.dumps(sbom(name, digest, archive, stamp), indent=1) + "\n")
        images[dist] = {"name": name, "digest": digest, "archive": archive.name,
                        "sbom": spdx.name}  # fmt: skip
    (out / "images.json").write_text(json.dumps(images, indent=1) + "\n")
    from hack.render_manifests import helm

    helm("package", str(ROOT / "charts" / "deathwatch"), "--version", version,
         "--app-version", version, "-d", str(out))  # fmt: skip
    (out / "CHANGELOG.md").write_text(entry)
    files = sorted(p for p in out.iterdir() if p.is_file() and p.name != "SHA256SUMS")
    (out / "SHA256SUMS").write_text("".join(f"{_sha256(p)}  {p.name}\n" for p in files))
    return {"version": version, "out": str(out), "images": images,
            "files": [p.name for p in files] + ["SHA256SUMS"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hack/release.sh", description=__doc__.splitlines()[0])
    ap.add_argument("version", help="the release's version: the VERSION file's")
    ap.add_argument("out", nargs="?", help="where (default: dist/VERSION)")
    args = ap.parse_args(argv)
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
        made = release(args.version, out)
    except ReleaseError as exc:
        print(f"hack/release.sh: {exc}", file=sys.stderr)
        if made_here:
            shutil.rmtree(out, ignore_errors=True)
        return 2
    print(json.dumps(made, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
