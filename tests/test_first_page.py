"""The first page a newcomer reads: README.md is short, says how to run the project and which notebook to open first
early on, names the installed commands, carries no measured number outside the table the bench writes, and its links
(and those of docs/install.md and docs/api.md, which hold what moved out of it) resolve."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = (README, ROOT / "docs" / "install.md", ROOT / "docs" / "api.md")
#: A measured quantity: a number with a unit of time, a rate, a share or a ratio.
MEASURED = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(µs|us|ms|%|GB/s|TB/s|x|×)(?!\w)")
TABLE = re.compile(r"<!-- bench-table:start -->.*?<!-- bench-table:end -->", re.S)


def _lines() -> list[str]:
    return README.read_text().splitlines()


def test_readme_is_a_first_page():
    lines = _lines()
    assert len(lines) <= 150
    head = "\n".join(lines[:50])
    assert "bash scripts/walkthrough.sh" in head and "bash scripts/test.sh" in head
    assert "notebooks/01_forward.ipynb" in "\n".join(lines[:80])


def test_readme_lists_every_notebook():
    text = README.read_text()
    for notebook in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert f"`{notebook.stem}`" in text, notebook.name


def test_readme_names_the_installed_commands():
    section = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    commands = re.findall(r"^([\w-]+)\s*=", section, flags=re.MULTILINE)
    assert commands and all(f"`{command}`" in README.read_text() for command in commands)


def test_no_measured_number_outside_the_bench_table():
    """Numbers drift: the README's measured numbers are the bench's table (tests/test_bench.py checks it against the
    committed run), and the API reference has none."""
    for page in (README, ROOT / "docs" / "api.md"):
        prose = TABLE.sub("", page.read_text())
        assert MEASURED.findall(prose) == [], page.name


def test_links_resolve():
    for page in PAGES:
        for link in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", link):
                continue
            target = (page.parent / link.split("#")[0]).resolve()
            assert target.exists(), f"{page.relative_to(ROOT)} links to {link}, which does not exist"
