"""The two distributions are what the layout promises (docs/adr/0007): each wheel installs
only the `deathwatch` import namespace, the firewall's requires nothing its code does not
import (no kopf, kubernetes client or aiohttp on a NET_ADMIN hostNetwork pod), and plugins
find their whole API in `deathwatch.policy`."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# distribution name -> import name, for what the firewall may require
IMPORT_NAME = {"pyyaml": "yaml", "prometheus-client": "prometheus_client"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
         "-w", str(out), str(ROOT / "controller"), str(ROOT / "firewall")],
        check=True, timeout=600, capture_output=True,
    )  # fmt: skip
    found = {p.name.split("-")[0]: p for p in out.glob("*.whl")}
    assert set(found) == {"deathwatch", "deathwatch_firewall"}
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
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield from (a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield node.module.split(".")[0]


def test_each_wheel_installs_only_the_deathwatch_namespace(wheels: dict[str, Path]) -> None:
    for wheel in wheels.values():
        assert _meta(wheel, "top_level.txt").split() == ["deathwatch"]
        assert all(f.startswith("deathwatch/") for f in _files(wheel)), _files(wheel)
    # PEP 420: neither owns deathwatch/__init__.py, so both can be installed side by side
    assert "deathwatch/__init__.py" not in _files(wheels["deathwatch"])
    assert all(f.startswith("deathwatch/firewall/") for f in _files(wheels["deathwatch_firewall"]))


def test_test_and_demo_support_is_not_shipped(wheels: dict[str, Path]) -> None:
    files = _files(wheels["deathwatch"])
    assert not [f for f in files if not f.endswith((".py", "py.typed"))], files
    assert not [f for f in files if "sandbox_script" in f or "sample" in f]


def test_the_firewall_requires_exactly_what_it_imports(wheels: dict[str, Path]) -> None:
    requires = _requires(wheels["deathwatch_firewall"])
    assert not requires & {"kopf", "kubernetes", "aiohttp", "deathwatch"}, requires
    imported = set(_imports(ROOT / "firewall" / "src"))
    third_party = imported - set(sys.stdlib_module_names) - {"deathwatch"}
    assert {IMPORT_NAME.get(r, r) for r in requires} == third_party


def test_the_controller_requires_what_it_imports(wheels: dict[str, Path]) -> None:
    requires = {IMPORT_NAME.get(r, r) for r in _requires(wheels["deathwatch"])}
    imported = set(_imports(ROOT / "controller" / "src"))
    third_party = imported - set(sys.stdlib_module_names) - {"deathwatch"}
    assert third_party == requires


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
