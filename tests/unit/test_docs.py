"""The documentation (issue #41): the README is a front page a newcomer can decide from (300
lines at most, every link it makes leads somewhere), and docs/ builds as a site with MkDocs
strictly: a broken link, an anchor that is not there, a page left out of the navigation or a
navigation entry with no page fails the build (mkdocs.yml's validation, all warnings)."""

from __future__ import annotations

import decimal
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from hack.release import published

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_readme_is_a_front_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for heading in ("## Install", "## What each verdict means", "## Documentation"):
        assert heading in text, heading
    assert "![" in text  # a picture


def test_every_relative_link_of_the_readme_leads_to_a_file() -> None:
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if target.startswith(("http://", "https://")):
            continue
        assert (ROOT / target).exists(), target


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "install" / "index.html").exists()
    assert (tmp_path / "site" / "adr" / "0027-safe-to-roll-onto-a-fleet" / "index.html").exists()


def test_a_page_left_out_of_the_navigation_fails_the_build(tmp_path: Path) -> None:
    """The strictness is real: a copy of the docs with one page more than the navigation."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "docs" / "orphan.md").write_text("# Orphan\n\n[gone](nowhere.md)\n")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=copy, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode != 0
    assert "orphan.md" in done.stderr and "nowhere.md" in done.stderr, done.stderr[-2000:]


_COUNTS = {w: i for i, w in enumerate(
    ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty", "twenty-one", "twenty-two", "twenty-three", "twenty-four", "twenty-five", "twenty-six", "twenty-seven", "twenty-eight", "twenty-nine", "thirty"]
)}  # fmt: skip


def test_every_alert_is_in_the_table_and_the_runbook_and_the_counts_said_are_the_counts() -> None:
    """The alerts are the rules file's (rendered from the chart); the operating table names
    each, the runbook has a section for each, and "N of the M fire there" counts what the Helm
    lane makes fire against what there is (#53: the docs said 24 while the chart had 26)."""
    rules = yaml.safe_load((ROOT / "monitoring" / "deathwatch.rules.yaml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    lane = (ROOT / "tests" / "deploy" / "test_helm_lane.py").read_text()
    fired = set(re.findall(r'fires\(\s*"(\w+)"', lane)) & alerts
    operating = (ROOT / "docs" / "operating.md").read_text()
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    rows = {name for line in operating.splitlines() if line.startswith("| Deathwatch")
            for name in re.findall(r"Deathwatch\w+", line.split("|")[1])}  # fmt: skip
    assert alerts - rows == set(), "alerts the operating table leaves out"
    sections = set(re.findall(r"^## (Deathwatch\w+)$", runbook, flags=re.M))
    assert alerts - sections == set(), "alerts without a runbook section"
    for text in (operating, runbook):
        said = [(part, whole) for part, whole in re.findall(
            r"(\w+(?:-\w+)?) of the ([\w-]+) fire", text.replace("\n", " "))
            if part.lower() in _COUNTS and whole in _COUNTS]  # fmt: skip
        assert said, "the count of alerts the lane fires is said"
        for part, whole in said:
            assert (_COUNTS[part.lower()], _COUNTS[whole]) == (len(fired), len(alerts))


_DASH = "\u2013"  # the en dash of a range, 57\u201361
_BENCH = re.compile(
    r"([0-9][0-9,.]*)(?:" + _DASH + r"([0-9][0-9,.]*))?(?: ms)?<!-- bench: (\S+) (\S+) -->"
)


def _said(value: float, digits: int) -> str:
    """`value` as people write it: rounded half up to `digits` decimals, thousands
    separated."""
    exact = decimal.Decimal(repr(value)).quantize(
        decimal.Decimal(1).scaleb(-digits), rounding=decimal.ROUND_HALF_UP
    )
    return f"{exact:,.{digits}f}"


def test_every_number_marked_in_the_docs_is_its_bench_results(tmp_path: Path) -> None:
    """A number the docs quote from a bench carries its source, `<!-- bench: FILES KEY -->`
    (a glob in bench/results, a dotted key): it must be that value (rounded), or the range of
    it over the files (#53: the README, docs/node-exits.md and the performance chart quoted
    three kill → verdict p99s). A marker with no number, or a file or key that is not there,
    fails too."""
    seen = 0
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for low, high, files, key in _BENCH.findall(text):
            paths = sorted((ROOT / "bench" / "results").glob(files))
            assert paths, f"{doc.name}: no result file {files}"
            values = []
            for path in paths:
                node: Any = json.loads(path.read_text())
                for part in key.split("."):
                    node = node[part]
                values.append(float(node))
            digits = len(low.partition(".")[2])  # as precise as the docs write it
            want = (_said(min(values), digits), _said(max(values), digits))
            got = (low, high or low)
            assert got == want, f"{doc.name}: {got} for {files} {key}, results say {want}"
            seen += 1
        assert text.count("<!-- bench:") == len(_BENCH.findall(text)), (
            f"{doc.name}: a marker without its number"
        )
    assert seen >= 7  # the README's and node-exits.md's, at least


def test_where_releases_are_published_is_said_once_and_everywhere_the_same() -> None:
    """#53: the chart's default images are where releases are published (values.yaml says
    it); every page that names the place names those images, or the chart beside them."""
    values = yaml.safe_load((ROOT / "charts" / "deathwatch" / "values.yaml").read_text())
    images = {published(values[part]["image"]) for part in ("controller", "firewall")}
    [home] = {i.rsplit("/", 1)[0] for i in images}  # one place for both
    # the chart, and its repository as Argo CD names an OCI one (docs/gitops.md)
    known = {*images, f"{home}/charts/deathwatch", f"{home}/charts", home}
    pages = [README, ROOT / "charts" / "deathwatch" / "README.md", *(ROOT / "docs").rglob("*.md")]
    named = {m.group(0).rstrip(".:/")  # `ghcr.io/deathwatch-dev/{controller,firewall}`: home
             for page in pages
             for m in re.finditer(rf"{re.escape(home.split('/')[0])}/[\w./-]+", page.read_text())}  # fmt: skip
    assert named, "no page says where releases are published"
    stray = {n for n in named if n not in known and not any(n.startswith(k + ":") for k in known)}
    assert not stray, stray


def test_the_runbooks_image_edit_names_the_image_the_uninstall_manifest_holds() -> None:
    """#59: `kustomize edit set image NAME=...` changes only an image named NAME; the runbook
    once named deathwatch/firewall, which the manifest does not hold, so the edit did nothing."""
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    names = re.findall(r"kustomize edit set\s+image\s+([^=\s]+)=", runbook)
    assert names
    manifest = yaml.safe_load(
        (ROOT / "manifests" / "uninstall" / "cleanup-daemonset.yaml").read_text()
    )
    images = {c["image"].rsplit(":", 1)[0]
              for c in [*manifest["spec"]["template"]["spec"].get("initContainers", []),
                        *manifest["spec"]["template"]["spec"]["containers"]]}  # fmt: skip
    assert set(names) <= images, (names, images)
