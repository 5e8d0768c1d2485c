"""The tree holds code, and the docs cannot drift from it (fast tier: no processes).

- README.md is a short manual: ≤ 400 lines, no commit hashes, no load averages; its headline
  figures are quoted verbatim from the generated results pages they link to.
- The generated files (options tables, support matrix, results pages) equal what the code and the
  results files give, and each options table carries what ``polytrain strategies NAME`` prints.
- Every strategy's options table is included by a docs page; every results page the README links
  exists.
- No docs page but the generated ones (docs/results/, docs/snippets/) types a measured figure in
  the form median (min–max): the pages link or include the results pages instead.
- No tracked file holds an absolute path of a development machine; tracked benchmark results stay
  under 5 MB.
"""

from __future__ import annotations

import html
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from polytrain import docs_gen
from polytrain.errors import ConfigError
from polytrain.strategies import registry
from tests.conftest import ROOT

README = ROOT / "README.md"
# A commit-hash-like word: 7–40 hex characters with at least one digit and one letter.
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def tracked(*paths: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", *paths], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / p for p in out.stdout.decode().split("\0") if p]


@pytest.fixture(scope="module")
def in_git() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked tree cannot be listed")


def test_readme_is_a_short_manual() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 400
    assert not HASH.findall(text), HASH.findall(text)
    assert "load average" not in text.lower()


def test_hash_pattern_catches_a_hash_and_spares_numbers_and_ids() -> None:
    assert HASH.findall("merged at 916a7c0 and 09c2fb38c78bb9426e28f3b7f3a329d4be00dcc1")
    assert not HASH.findall("1f1b, 138,357,544 parameters, 2026-11-30, deadbeef, 1234567")


def test_readme_headline_figures_come_from_the_results_pages() -> None:
    section = README.read_text().split("\n## Strategies", 1)[1].split("\n## ", 1)[0]
    quoted = 0
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        headline = line.rstrip(" |").rsplit(" | ", 1)[1]
        pages = re.findall(r"\(docs/results/([\w.-]+\.md)\)", headline)
        figures = re.findall(r"`([^`]*\d[^`]*)`", headline)
        for page in pages:
            text = (ROOT / "docs" / "results" / page).read_text()
            for fig in figures:
                assert fig in text, f"README quotes {fig!r} but docs/results/{page} does not hold it"
                quoted += 1
    assert quoted >= 10


# A measured figure as the results pages print it: median (min–max), e.g. 1.017 (0.898–1.176).
MEDIAN_RANGE = re.compile(r"\d[\d.,]*\s*\(\s*-?\d[\d.,]*\s*[–-]\s*-?\d[\d.,]*\s*\)")
GENERATED_DOCS = ("results", "snippets")


def test_median_range_pattern_catches_figures_and_spares_formulas() -> None:
    for fig in ("1400 (911–2244)", "77.7 (52.4-85.9)", "-1.1 (-11.4–1.4)", "229,692 (1,000–2,000)"):
        assert MEDIAN_RANGE.search(fig), fig
    for text in ("median (min–max)", "(W−1)·Ψ'/W", "2(n−1) for a ring", "stages 1–2", "(0.8)"):
        assert not MEDIAN_RANGE.search(text), text


def test_docs_pages_quote_measured_figures_only_through_the_results_pages() -> None:
    docs = ROOT / "docs"
    found = []
    for page in sorted(docs.rglob("*.md")):
        if page.relative_to(docs).parts[0] in GENERATED_DOCS:
            continue
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for m in MEDIAN_RANGE.finditer(line):
                found.append(f"{page.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert not found, ("figures typed by hand; link or include the docs/results page instead:\n"
                       + "\n".join(found))


def test_generated_docs_are_current() -> None:
    assert docs_gen.stale() == []


def test_results_pages_are_current() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _cli_rows(name: str) -> list[list[str]]:
    """The option rows of ``polytrain strategies NAME`` as its table prints them."""
    from polytrain.cli import cmd_strategy

    buf = io.StringIO()
    cmd_strategy(name, Console(file=buf, width=400, color_system=None, legacy_windows=False))
    text = buf.getvalue().split("every strategy (--set KEY=VALUE)")[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 4 and cells[0] and cells[0] not in ("option", "(none)"):
            rows.append(cells)
    return rows


def _plain(cell: str) -> str:
    """A generated cell's text as the terminal shows it: code marks and entities removed."""
    if cell.startswith("`") and cell.endswith("`"):
        return cell[1:-1]
    if cell.startswith("<code>") and cell.endswith("</code>"):
        return html.unescape(cell[len("<code>"):-len("</code>")])
    return cell


@pytest.mark.parametrize("name", sorted(registry()))
def test_options_table_matches_what_the_cli_prints(name: str) -> None:
    table = (ROOT / docs_gen.SNIPPETS / "options" / f"{name}.md").read_text()
    doc_rows = []
    for line in table.splitlines()[2:]:
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        doc_rows.append([_plain(c) for c in cells])
    assert doc_rows == _cli_rows(name)


def test_every_strategy_has_its_options_table_on_a_docs_page() -> None:
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    missing = [n for n in registry() if f'"snippets/options/{n}.md"' not in pages]
    assert not missing, f"no docs page includes the options of {missing}"


def test_no_tracked_file_holds_a_development_machine_path(in_git: None) -> None:
    # Paths built from parts, so this file does not match itself.
    machine = re.compile("|".join(re.escape(p) for p in ("/" + "work/", "/" + "root/", "/" + "home/")))
    # /tmp is allowed only for names torch or a test itself chooses, never a machine's own folder.
    tmp = re.compile(r"/" + r"tmp/(?!torchelastic_|polytrain-pwned)")
    offenders = []
    for path in tracked():
        if path.suffix in {".png", ".pt"} or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if machine.search(text) or tmp.search(text):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"absolute machine paths in {offenders}"


def test_tracked_results_stay_small(in_git: None) -> None:
    files = tracked("benchmarks/results")
    assert sum(p.stat().st_size for p in files if p.exists()) < 5_000_000
    assert all(p.stat().st_size <= 200_000 for p in files if p.suffix == ".json")


def test_shipped_tsplib_instances_load_by_name_from_anywhere(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from polytrain.aco.tsp import SHIPPED, load_instance

    monkeypatch.chdir(tmp_path)
    assert sorted(p.name for p in SHIPPED.glob("*.tsp")) == ["berlin52.tsp", "eil51.tsp", "kroA100.tsp"]
    assert load_instance("berlin52.tsp").optimum == 7542
    (tmp_path / "berlin52.tsp").write_text("NAME: mine\n")  # a file of that name here comes first
    with pytest.raises(ConfigError):
        load_instance("berlin52.tsp")
