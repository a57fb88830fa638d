"""Container images without Docker or a registry: OCI layout tarballs of a busybox-static
rootfs, for `ctr -n k8s.io images import`.

    pause   sleeps forever (the pod sandbox)
    agent   the sandbox "execution agent" of the tests, controlled through files in /ctl (a
            hostPath the test writes from the host, so no kubectl exec is needed):
              listens on the agent port (49983) and another port (8080), echoing;
              /ctl/exit holding N      -> the container exits with code N
              /ctl/exit-once holding N -> it exits with code N, once (the file goes with it:
                                          a container restarted in place lives on)
              /ctl/fork holding N      -> it starts N sleeping processes (PID pressure)
              /ctl/oom                 -> it allocates past its memory limit (OOMKilled)
              /ctl/unready             -> its readiness command (/bin/ready) fails
              /ctl/bell, a FIFO made before it starts: a byte written there after a file
                                          above makes it act at once, not at its next
                                          0.1 s look (a bench times the kill from there)
            with TARGET=ip:port in its environment it is a client instead: every 0.2 s it
            connects and writes connected/refused/failed to /ctl/result.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
APPLETS = (
    "sh",
    "sleep",
    "nc",
    "cat",
    "test",
    "[",
    "echo",
    "dd",
    "head",
    "ls",
    "mkdir",
    "rm",
    "touch",
    "date",
    "timeout",
    "grep",
)
PAUSE = "deathwatch.local/pause:1"
AGENT = "deathwatch.local/agent:1"

AGENT_SH = r"""#!/bin/sh
# the deathwatch test agent (hack/localcluster/images.py)
if [ -n "$TARGET" ]; then
  while true; do
    out=$(echo | nc -w 1 ${TARGET%:*} ${TARGET#*:} 2>&1) && r=connected || r=failed
    case "$out" in *refused*) r=refused ;; esac
    echo $r > /ctl/result.tmp && mv /ctl/result.tmp /ctl/result 2>/dev/null || echo $r > /ctl/result
    sleep 0.2
  done
fi
nc -ll -p 49983 -e /bin/cat &
nc -ll -p 8080 -e /bin/cat &
# opened read-write: the open never blocks, and a host's write finds a reader at once
bell=
if [ -p /ctl/bell ] && exec 3<>/ctl/bell; then bell=1; fi
while true; do
  # -s, not -f: a file the host has made but not yet written is read as empty, and an
  # `exit ""` is exit 2 (seen in CI: a death asked with 3 judged, rightly, as exit 2)
  if [ -s /ctl/exit ]; then exit "$(cat /ctl/exit)"; fi
  if [ -s /ctl/exit-once ]; then c=$(cat /ctl/exit-once); rm -f /ctl/exit-once; exit "$c"; fi
  if [ -s /ctl/fork ]; then
    n=$(cat /ctl/fork); rm -f /ctl/fork; i=0
    while [ "$i" -lt "$n" ]; do sleep 3600 & i=$((i + 1)); done
  fi
  # exec: the main process itself must be the one the OOM killer ends
  if [ -f /ctl/oom ]; then exec dd if=/dev/zero of=/dev/null bs=512M count=1; fi
  if [ -n "$bell" ]; then read -t 0.1 ring <&3; else sleep 0.1; fi
done
"""
READY_SH = "#!/bin/sh\ntest ! -f /ctl/unready\n"


def _add(
    tar: tarfile.TarFile,
    name: str,
    data: bytes | None = None,
    mode: int = 0o755,
    link: str | None = None,
    directory: bool = False,
) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    if directory:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    elif link is not None:
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, link, 0o777
        tar.addfile(info)
    else:
        info.size, info.mode = len(data or b""), mode
        tar.addfile(info, io.BytesIO(data or b""))


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "tmp", "ctl", "proc", "sys", "dev", "etc"):
            _add(tar, d, directory=True)
        _add(tar, "bin/busybox", BUSYBOX.read_bytes())
        for applet in APPLETS:
            _add(tar, f"bin/{applet}", link="busybox")
        _add(tar, "etc/passwd", b"root:x:0:0:root:/:/bin/sh\n", mode=0o644)
        for name, data in files.items():
            _add(tar, name, data)
    return buf.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    _add(tar, f"blobs/sha256/{digest}", data, mode=0o644)
    return f"sha256:{digest}", len(data)


def build(
    path: Path, ref: str, entrypoint: list[str], files: dict[str, bytes] | None = None
) -> Path:
    """Write an OCI image layout tarball for `ref` to `path`."""
    layer = _layer(files or {})
    compressed = gzip.compress(layer, mtime=0)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        _add(tar, "blobs", directory=True)
        _add(tar, "blobs/sha256", directory=True)
        layer_digest, layer_size = _blob(tar, compressed)
        config_digest, config_size = _blob(tar, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest,
                    "size": layer_size,
                }
            ],
        }
        manifest_digest, manifest_size = _blob(tar, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": manifest_size,
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
                    },
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            ],
        }
        _add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode(), mode=0o644)
        _add(tar, "index.json", json.dumps(index).encode(), mode=0o644)
    path.write_bytes(out.getvalue())
    return path


def build_all(directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return {
        PAUSE: build(directory / "pause.tar", PAUSE, ["/bin/sleep", "2147483647"]),
        AGENT: build(
            directory / "agent.tar",
            AGENT,
            ["/bin/sh", "/bin/agent"],
            {"bin/agent": AGENT_SH.encode(), "bin/ready": READY_SH.encode()},
        ),
    }
