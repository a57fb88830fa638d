"""docs/architecture.md names modules, classes and functions as the code has them: every
`package/module(.Name(.attr))` it writes resolves, so a rename that leaves the map behind
fails here, not in a newcomer's hands."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = {
    "": ROOT / "controller/src/deathwatch/_operator",  # its folders, named bare in the doc
    "_engine": ROOT / "controller/src/deathwatch/_engine",
    "_api": ROOT / "controller/src/deathwatch/_api",
    "_policies": ROOT / "controller/src/deathwatch/_policies",
    "_replay": ROOT / "controller/src/deathwatch/_replay",
    "_verdicts": ROOT / "controller/src/deathwatch/_verdicts",
    "_preflight": ROOT / "controller/src/deathwatch/_preflight",
    "_operator": ROOT / "controller/src/deathwatch/_operator",
    "_kube": ROOT / "kube/src/deathwatch/_kube",
    "firewall": ROOT / "firewall/src/deathwatch/firewall",
}
# a/b/c, optionally .py, optionally .Name.attr: the way the doc writes a place in the code
REFERENCE = re.compile(
    r"(?<![\w./-])((?:_?[a-z][a-z0-9_]*/)+_?[a-z][a-z0-9_]*)(?:\.py)?((?:\.[A-Za-z_]\w*)*)"
)


def _module(path: str) -> Path | None:
    """The file a doc path names, or None when it is not one of the packages' (docs/adr)."""
    first, _, rest = path.partition("/")
    bases = [PACKAGES[first] / rest] if first in PACKAGES else []
    bases.append(PACKAGES[""] / path)
    for base in bases:
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


@cache
def _names(path: Path) -> dict[str, set[str]]:
    """Top-level names of a module, each with what it defines inside (a class's methods and
    fields, as far as the AST shows them)."""
    tree = ast.parse(path.read_text())
    names: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            inner = {
                n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
            inner |= {
                n.target.id
                for n in node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            }
            names[node.name] = inner
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = set()
        elif isinstance(node, ast.Assign):
            names.update({t.id: set() for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
    return names


def _references() -> list[tuple[str, str]]:
    text = DOC.read_text()
    return [(m.group(1), m.group(2)) for m in REFERENCE.finditer(text)]


def test_every_module_and_name_the_map_gives_exists() -> None:
    wrong = []
    checked = 0
    for path, attrs in _references():
        first = path.split("/", 1)[0]
        is_ours = first in PACKAGES or (PACKAGES[""] / first).is_dir()
        if not is_ours:
            continue  # docs/adr, manifests/...: not a module
        module = _module(path)
        if module is None:
            wrong.append(f"{path}: no such module")
            continue
        checked += 1
        parts = [a for a in attrs.split(".") if a]
        if not parts:
            continue
        names = _names(module)
        if parts[0] not in names:
            wrong.append(f"{path}.{parts[0]}: not defined in {module.relative_to(ROOT)}")
        elif len(parts) > 1 and names[parts[0]] and parts[1] not in names[parts[0]]:
            wrong.append(f"{path}.{parts[0]}.{parts[1]}: not in the class")
    assert wrong == [], "\n".join(wrong)
    assert checked > 50  # the check reads the map: it names far more than this


def test_a_renamed_module_or_name_is_found() -> None:
    records = _module("memory/records")
    assert records is not None and _module("memory/nowhere") is None
    assert "Records" in _names(records) and "Nothing" not in _names(records)
    assert _module("_kube/listwatch") is not None and _module("_kube/nothing") is None
