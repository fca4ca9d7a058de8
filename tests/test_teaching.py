"""docs/teaching.md's table of notebooks and times: one row per notebook, the same core minutes as the notebook's
intro says, and a core path that fits a three-hour session by its own estimate."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEACHING = ROOT / "docs" / "teaching.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
THREE_HOURS = 180


def _table(column: int = 3) -> tuple[dict[str, int | None], int]:
    """``{notebook stem: minutes}`` of a column (3: core, 4: optional) and the stated core path total, from the
    table of docs/teaching.md."""
    rows, total = {}, None
    for line in TEACHING.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and re.fullmatch(r"`\d\d_\w+`", cells[0]):
            rows[cells[0].strip("`")] = None if cells[column] == "-" else int(cells[column])
        elif cells and cells[0] == "**core path**":
            total = int(cells[3].strip("*"))
    assert total is not None, "docs/teaching.md has no **core path** row"
    return rows, total


def _intro_minutes(notebook: Path) -> int:
    """The core minutes a notebook's intro states: ``**Time:** about N minutes for the core sections``."""
    match = re.search(r"\*\*Time:\*\* about (\d+) minutes(?: for the core sections|, all of it core)",
                      notebook.read_text())
    assert match, f"{notebook.name}: its intro states no '**Time:** about N minutes for the core sections'"
    return int(match.group(1))


def _intro_optional_minutes(notebook: Path) -> int | None:
    """The minutes a notebook's intro gives its optional sections (two phrasings), ``None`` for "all of it core"."""
    text = " ".join(line.lstrip("# ") for line in notebook.read_text().splitlines()[:60])
    if re.search(r"\*\*Time:\*\* about \d+ minutes, all of it core", text):
        return None
    match = re.search(r"marked \*\(optional\)\* add about (\d+)|core sections, (\d+) more for", text)
    assert match, f"{notebook.name}: its intro states no time for its optional sections"
    return int(match.group(1) or match.group(2))


def test_every_notebook_has_a_row_and_no_row_lacks_a_notebook():
    rows, _ = _table()
    assert sorted(rows) == [nb.stem for nb in NOTEBOOKS]


def test_the_table_and_the_intros_give_the_same_core_minutes():
    rows, _ = _table()
    assert {nb.stem: _intro_minutes(nb) for nb in NOTEBOOKS} == {stem: rows[stem] for stem in sorted(rows)}


def test_the_core_path_is_the_sum_of_the_rows_and_fits_three_hours():
    rows, total = _table()
    assert total == sum(rows.values())
    assert total <= THREE_HOURS, f"the core path takes {total} minutes, more than three hours"


def test_the_table_and_the_intros_give_the_same_optional_minutes():
    rows, _ = _table(column=4)
    assert {nb.stem: _intro_optional_minutes(nb) for nb in NOTEBOOKS} == {stem: rows[stem] for stem in sorted(rows)}


def test_the_table_and_the_intros_give_the_same_cuda_build_it_minutes():
    rows = {}
    for line in TEACHING.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and re.fullmatch(r"`\d\d_\w+`", cells[0]):
            rows[cells[0].strip("`")] = None if cells[5] == "-" else int(cells[5])
    intros = {}
    for nb in NOTEBOOKS:
        text = " ".join(line.lstrip("# ") for line in nb.read_text().splitlines()[:60])
        match = re.search(r"\(with a GPU\) about (\d+)", text)
        intros[nb.stem] = int(match.group(1)) if match else None
    assert intros == rows
