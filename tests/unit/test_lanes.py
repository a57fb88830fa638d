"""hack/lanes.py runs the node's lanes beside the rest: that is safe only while no test of the
rest reaches the one local node this machine has. A test that does must live in a node lane."""

from __future__ import annotations

import ast
from pathlib import Path

from hack import lanes

ROOT = Path(__file__).resolve().parents[2]
NODE = "hack.localcluster.node"


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """The modules a file imports (`from a import b` counts `a` and `a.b`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _reaching_the_node() -> set[str]:
    """Every module of hack/ and tests/ that imports the node, directly or through others."""
    graph = {
        _module(path): _imports(path)
        for folder in ("hack", "tests")
        for path in (ROOT / folder).rglob("*.py")
    }
    reaching = {NODE}
    while True:
        more = {name for name, imports in graph.items() if imports & reaching} - reaching
        if not more:
            return reaching
        reaching |= more


def test_only_the_node_group_reaches_the_local_node() -> None:
    reaching = _reaching_the_node()
    node_lanes = tuple(f"tests.{Path(lane).name}." for lane in lanes.NODE_LANES)
    outside = sorted(
        name for name in reaching if name.startswith("tests.") and not name.startswith(node_lanes)
    )
    # a helper module of tests/ itself may reach the node only if no test outside uses it:
    # the closure above has already counted such users, so any name here is a real leak
    assert outside == [], f"tests outside {lanes.NODE_LANES} reach the node: {outside}"
    # and the check sees what it guards: the node lanes do reach it
    assert any(name.startswith(node_lanes) for name in reaching)


def test_the_two_groups_together_are_every_lane_once() -> None:
    node, rest = lanes.GROUPS["node"], lanes.GROUPS["rest"]
    assert node == list(lanes.NODE_LANES)
    assert rest == ["tests", *(f"--ignore={lane}" for lane in lanes.NODE_LANES)]
    assert all((ROOT / lane).is_dir() for lane in lanes.NODE_LANES)
