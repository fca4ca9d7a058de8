"""docs/teaching.md's table of notebooks and times: one row per notebook, the same core minutes as the notebook's
intro says, a core path that fits a three-hour session by its own estimate, and core minutes that leave room for
reading the core prose at the rate docs/teaching.md states."""

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


def _reading_rate() -> int:
    """The reading rate docs/teaching.md bases its minutes on: ``at N words a minute``."""
    match = re.search(r"at (\d+) words a minute", TEACHING.read_text())
    assert match, "docs/teaching.md states no reading rate ('at N words a minute')"
    return int(match.group(1))


def _core_words(notebook: Path) -> int:
    """Words of a notebook's markdown in its core sections: a ``##`` section marked *(optional)* is left out, and so
    is a deeper heading marked *(optional)* up to the next heading of its level or above."""
    words, skip_below = 0, None  # skip_below: the level of the optional heading being skipped
    for cell in re.split(r"^# %%", notebook.read_text(), flags=re.M)[1:]:
        if not cell.startswith(" [markdown]"):
            continue
        for line in cell.splitlines()[1:]:
            heading = re.match(r"^# (#+) (.*)", line)
            if heading:
                level = len(heading.group(1))
                if skip_below is not None and level <= skip_below:
                    skip_below = None
                if skip_below is None and "(optional)" in heading.group(2):
                    skip_below = level
            if skip_below is None and line.startswith("# "):
                words += len(line[2:].split())
    return words


def test_core_minutes_leave_room_to_read_the_core_prose():
    rate = _reading_rate()
    short = {nb.stem: (_intro_minutes(nb), round(_core_words(nb) / rate, 1)) for nb in NOTEBOOKS
             if _intro_minutes(nb) * rate < _core_words(nb)}
    assert not short, f"core minutes below the reading time of the core prose at {rate} words a minute: {short}"


def test_core_words_leave_out_optional_sections(tmp_path):
    notebook = tmp_path / "99_x.py"
    notebook.write_text("# %% [markdown]\n# ## 1. A (core)\n# one two three\n# ### (optional) B\n# four five\n"
                        "# %%\nx = 1\n# %% [markdown]\n# ### C (core)\n# six\n# ## 2. (optional) D\n# seven\n")
    assert _core_words(notebook) == len("## 1. A (core) one two three ### C (core) six".split())
