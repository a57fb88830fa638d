"""The product's two images, built from its own Dockerfiles with no engine and no registry.

    python3 -m hack.localcluster.productimages [--json]     (hack/build-images.sh)

- **Bases**: Debian bookworm root filesystems made by mmdebstrap (python3 and pip; the
  firewall's also nftables), committed as images in buildah's own storage. The Dockerfiles'
  `ARG BASE` defaults to the public python:3.11-slim-bookworm; this build passes these.
- **Wheelhouse**: no package index is reachable from inside a build here, so every wheel the
  images need (and setuptools/wheel to build ours) is fetched on the host first and put in
  the build context; the Dockerfiles install from it when it is there, from PyPI otherwise.
- **Images**: `buildah bud --isolation chroot` of controller/Dockerfile and
  firewall/Dockerfile, pushed to OCI archives in the cache, keyed by the content of
  everything that goes into them, then `ctr images import` into a node's containerd.

Everything lives in $DEATHWATCH_CACHE/images (default ~/.cache/deathwatch/images): a
second run with nothing changed builds nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hack.localcluster.controlplane import cache_dir

ROOT = Path(__file__).resolve().parent.parent.parent
SUITE = "bookworm"
COMMON = ("python3", "python3-pip", "ca-certificates", "passwd")
BASES = {"python": COMMON, "python-nft": (*COMMON, "nftables")}
# which base each image is built on, and the import name its Dockerfile installs
IMAGES = {"controller": ("python", "deathwatch"), "firewall": ("python-nft", "deathwatch-firewall")}
LOCAL_TAG = "dev"  # what manifests/overlays/local-node runs
BUILD_TOOLS = ("setuptools>=68", "wheel")
SOURCES = ("VERSION", ".dockerignore", "kube", "controller", "firewall")  # the build context


@dataclass(frozen=True)
class Image:
    name: str  # deathwatch.local/controller:dev
    archive: Path  # the OCI archive, keyed by content
    key: str
    bytes_uncompressed: int
    bytes_archive: int
    python_packages: list[str]  # pip freeze inside the image


def images_dir() -> Path:
    return cache_dir() / "images"


def _run(*args: str, timeout: float = 1800) -> str:
    result = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])} ...: {result.stderr.strip()[-2000:]}")
    return str(result.stdout)


def _buildah(*args: str, timeout: float = 1800) -> str:
    storage = images_dir() / "storage"
    return _run(
        "buildah", "--storage-driver", "vfs", "--root", str(storage),
        "--runroot", str(images_dir() / "run"), *args, timeout=timeout,
    )  # fmt: skip


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _tracked(*paths: str) -> list[Path]:
    """The files git knows under `paths` (tracked, or new and not ignored): the build input."""
    out = _run("git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "--", *paths)
    return sorted(ROOT / line for line in out.splitlines() if (ROOT / line).exists())


def _content_key(files: list[Path], *extra: str) -> str:
    return _digest(*extra, *(f"{p.relative_to(ROOT)}\0" for p in files),
                   *(p.read_bytes() for p in files))  # fmt: skip


# --- bases ---------------------------------------------------------------------------------


def base(name: str) -> str:
    """The local base image `name`, made by mmdebstrap once and kept in buildah's storage."""
    packages = BASES[name]
    key = _digest(SUITE, *packages)
    ref = f"localhost/deathwatch-base-{name}:{key}"
    if _buildah("images", "-q", "--filter", f"reference={ref}").strip():
        return ref
    rootfs = images_dir() / f"rootfs-{name}-{key}"  # a directory: mmdebstrap's fastest output
    if not rootfs.exists():
        partial = images_dir() / f"rootfs-{name}-{key}-partial"
        shutil.rmtree(partial, ignore_errors=True)
        _run(
            "mmdebstrap", "--variant=apt", "--aptopt=APT::Install-Recommends \"false\"",
            "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*", f"--include={','.join(packages)}",
            # pip installs into the system, as in the python image: no PEP 668 marker
            '--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
            '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
            SUITE, str(partial),
        )  # fmt: skip
        partial.rename(rootfs)
    container = _buildah("from", "scratch").strip()
    try:
        _buildah("add", container, str(rootfs), "/")
        _buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "--env", "LANG=C.UTF-8", container)  # fmt: skip
        _buildah("commit", "-q", container, ref)
    finally:
        _buildah("rm", container)
    return ref


# --- the wheelhouse ----------------------------------------------------------------------


def wheelhouse() -> Path:
    """Every third-party wheel the two distributions need, and the tools to build them."""
    inputs = [ROOT / d / "pyproject.toml" for d in ("kube", "controller", "firewall")]
    key = _content_key(inputs, *BUILD_TOOLS, f"py{sys.version_info.major}{sys.version_info.minor}")
    path = images_dir() / f"wheelhouse-{key}"
    if path.exists():
        return path
    partial = Path(tempfile.mkdtemp(prefix="wheelhouse-", dir=images_dir()))
    _run(sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "-q",
         "-w", str(partial), str(ROOT / "kube"), str(ROOT / "controller"), str(ROOT / "firewall"),
         *BUILD_TOOLS)  # fmt: skip
    for ours in (*partial.glob("deathwatch-*.whl"), *partial.glob("deathwatch_*.whl")):
        ours.unlink()  # built again inside the image, from the sources in the context
    partial.rename(path)
    return path


# --- images --------------------------------------------------------------------------------


def _context(dist: str, wheels: Path) -> Path:
    """The build context: what the Dockerfile may COPY (see .dockerignore), and the wheels."""
    ctx = Path(tempfile.mkdtemp(prefix=f"ctx-{dist}-", dir=images_dir()))
    for f in _tracked(*SOURCES):
        target = ctx / f.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.is_symlink():
            target.symlink_to(os.readlink(f))
        else:
            shutil.copy2(f, target)
    shutil.copytree(wheels, ctx / "wheelhouse")
    return ctx


def build(dist: str) -> Image:
    base_name, package = IMAGES[dist]
    base_ref = base(base_name)
    wheels = wheelhouse()
    sources = _tracked(*SOURCES)
    key = _content_key(sources, base_ref, wheels.name)
    name = f"deathwatch.local/{dist}:{LOCAL_TAG}"
    archive = images_dir() / f"{dist}-{key}.oci.tar"
    report = archive.with_suffix(".json")
    if archive.exists() and report.exists():
        os.utime(archive)  # recently used: kept by _prune
        return Image(**{**json.loads(report.read_text()), "archive": archive})
    ctx = _context(dist, wheels)
    try:
        _buildah("bud", "--isolation", "chroot", "--layers=false", "--build-arg", f"BASE={base_ref}",
                 "-f", str(ctx / dist / "Dockerfile"), "-t", name, str(ctx))  # fmt: skip
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    container = _buildah("from", name).strip()
    try:
        freeze = _buildah("run", "--isolation", "chroot", container, "--",
                          "python3", "-m", "pip", "list", "--format=freeze",
                          "--disable-pip-version-check")  # fmt: skip
    finally:
        _buildah("rm", container)
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    _buildah("push", name, f"oci-archive:{partial}:{name}")
    partial.rename(archive)
    image = Image(
        name=name,
        archive=archive,
        key=key,
        bytes_uncompressed=_image_size(name),
        bytes_archive=archive.stat().st_size,
        python_packages=sorted(line for line in freeze.splitlines() if "==" in line),
    )
    if package not in {p.split("==")[0] for p in image.python_packages}:
        raise RuntimeError(f"{name} does not carry {package}: {image.python_packages}")
    report.write_text(json.dumps({**asdict(image), "archive": str(archive)}, indent=1))
    _prune(dist)
    _buildah("rmi", "--prune")
    return image


KEEP = 3  # the current sources' images, a release tag's (the upgrade lane's), one more


def _prune(dist: str) -> None:
    """The cache keeps each image's KEEP most recently used builds: HEAD's and a release's
    both stay, so neither build undoes the other's."""
    archives = sorted(images_dir().glob(f"{dist}-*.oci.tar"), key=lambda p: p.stat().st_mtime)
    for old in archives[:-KEEP]:
        old.unlink()
        old.with_suffix(".json").unlink(missing_ok=True)


def _image_size(name: str) -> int:
    """The image's unpacked size (the sum of its layers), as buildah reports it."""
    for line in _buildah("images", "--format", "{{.Name}}:{{.Tag}} {{.Size}}").splitlines():
        ref, _, size = line.partition(" ")
        if ref == name:
            return _parse_size(size)
    return 0


def _parse_size(text: str) -> int:
    number, unit = text.replace(" ", "")[:-2], text.replace(" ", "")[-2:]
    scale = {"kB": 1e3, "MB": 1e6, "GB": 1e9}.get(unit, 1)
    return (
        int(float(number) * scale) if unit in ("kB", "MB", "GB") else int(float(text.rstrip("B")))
    )


def build_all() -> dict[str, Image]:
    return {dist: build(dist) for dist in IMAGES}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true", help="print the images as JSON")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("build-images: buildah's chroot isolation needs root", file=sys.stderr)
        return 2
    for tool in ("buildah", "mmdebstrap"):
        if shutil.which(tool) is None:
            print(f"build-images: {tool} not found (hack/setup.sh installs it)", file=sys.stderr)
            return 2
    images_dir().mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    images = build_all()
    if args.json:
        print(
            json.dumps(
                {d: {**asdict(i), "archive": str(i.archive)} for d, i in images.items()}, indent=1
            )
        )
    else:
        for dist, image in images.items():
            print(f"{image.name}  {image.bytes_uncompressed / 1e6:.0f} MB unpacked, "
                  f"{image.bytes_archive / 1e6:.0f} MB archive  {image.archive}")  # fmt: skip
            if dist == "firewall":
                print("  python packages: " + ", ".join(image.python_packages))
        print(f"done in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
