"""The three distributions are what the layout promises (docs/adr/0007): each wheel installs
only the `deathwatch` import namespace (deathwatch-kube only `deathwatch._kube`, what both
others share), each requires exactly what its code imports, the firewall nothing more (no
kopf, kubernetes client or aiohttp on a NET_ADMIN hostNetwork pod), and plugins find their
whole API in `deathwatch.policy`."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# distribution name -> import name, for what the firewall may require
IMPORT_NAME = {"pyyaml": "yaml", "prometheus-client": "prometheus_client", "grpcio": "grpc",
               "protobuf": "google"}  # fmt: skip
SHARED = "deathwatch._kube"  # imported as such; required as the deathwatch-kube distribution


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    # the three built side by side: each pip spends its time setting up a build environment
    builds = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--disable-pip-version-check",
                "-w",
                str(out),
                str(ROOT / part),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for part in ("controller", "firewall", "kube")
    ]
    for build in builds:
        output, _ = build.communicate(timeout=600)
        assert build.returncode == 0, output.decode()[-2000:]
    found = {p.name.split("-")[0]: p for p in out.glob("*.whl")}
    assert set(found) == {"deathwatch", "deathwatch_firewall", "deathwatch_kube"}
    return found


def _meta(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return next(z.read(n).decode() for n in z.namelist() if n.endswith(f".dist-info/{name}"))


def _files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return [n for n in z.namelist() if ".dist-info/" not in n]


def _requires(wheel: Path) -> set[str]:
    return {
        re.split(r"[<>=!~; \[]", line.split(":", 1)[1].strip(), maxsplit=1)[0].lower()
        for line in _meta(wheel, "METADATA").splitlines()
        if line.startswith("Requires-Dist:")
    }


def _imports(root: Path) -> Iterator[str]:
    """The distributions a source tree imports from: top-level modules, and deathwatch-kube
    for `deathwatch._kube` (the one part of the namespace another distribution ships)."""
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                shared = name == SHARED or name.startswith(SHARED + ".")
                yield "deathwatch-kube" if shared else name.split(".")[0]


def _third_party(root: Path) -> set[str]:
    return set(_imports(root)) - set(sys.stdlib_module_names) - {"deathwatch"}


def test_each_wheel_installs_only_the_deathwatch_namespace(wheels: dict[str, Path]) -> None:
    for wheel in wheels.values():
        assert _meta(wheel, "top_level.txt").split() == ["deathwatch"]
        assert all(f.startswith("deathwatch/") for f in _files(wheel)), _files(wheel)
    # PEP 420: none owns deathwatch/__init__.py, so all can be installed side by side
    assert "deathwatch/__init__.py" not in _files(wheels["deathwatch"])
    assert all(f.startswith("deathwatch/firewall/") for f in _files(wheels["deathwatch_firewall"]))
    assert all(f.startswith("deathwatch/_kube/") for f in _files(wheels["deathwatch_kube"]))
    assert not [f for f in _files(wheels["deathwatch"]) if f.startswith("deathwatch/_kube/")]


def test_test_and_demo_support_is_not_shipped(wheels: dict[str, Path]) -> None:
    files = _files(wheels["deathwatch"])
    assert not [f for f in files if not f.endswith((".py", "py.typed"))], files
    assert not [f for f in files if "sandbox_script" in f or "sample" in f]


def test_the_firewall_requires_exactly_what_it_imports(wheels: dict[str, Path]) -> None:
    requires = _requires(wheels["deathwatch_firewall"])
    assert not requires & {"kopf", "kubernetes", "aiohttp", "deathwatch"}, requires
    assert {IMPORT_NAME.get(r, r) for r in requires} == _third_party(ROOT / "firewall" / "src")


def test_the_controller_requires_what_it_imports(wheels: dict[str, Path]) -> None:
    requires = {IMPORT_NAME.get(r, r) for r in _requires(wheels["deathwatch"])}
    assert _third_party(ROOT / "controller" / "src") == requires


def test_the_shared_part_requires_what_it_imports_and_no_client(wheels: dict[str, Path]) -> None:
    requires = {IMPORT_NAME.get(r, r) for r in _requires(wheels["deathwatch_kube"])}
    assert requires == {"msgspec", "prometheus_client", "cryptography", "structlog"}, requires
    assert _third_party(ROOT / "kube" / "src") - {"deathwatch-kube"} == requires


def test_the_public_api_is_the_policy_and_client_modules_and_nothing_private_leaks() -> None:
    import deathwatch.client as consumers
    import deathwatch.policy as api

    for module in (api, consumers):
        for name in module.__all__:
            assert getattr(module, name) is not None, (module.__name__, name)
    assert {"Policy", "Situation", "Decision", "State", "Cause", "PodView"} <= set(api.__all__)
    assert {"Client", "Verdict", "Change", "get_verdict", "wait_for_verdict"} <= set(
        consumers.__all__
    )
    # everything else in the distribution is private
    src = ROOT / "controller" / "src" / "deathwatch"
    public = sorted(p.name for p in src.iterdir() if not p.name.startswith(("_", ".")))
    assert public == ["client.py", "policy.py", "py.typed"]
