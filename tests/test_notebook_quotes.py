"""A notebook that quotes docs/experiments.md quotes it faithfully: every measured number in a paragraph (or list item)
of its prose that names experiments.md is written there too, to the digits the notebook gives, and every section it
names by its title ("`docs/experiments.md`, "Title"") is a heading there. So the prose cannot drift from the dated
measurements it cites."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "docs" / "experiments.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
#: A measured quantity: a number with a unit of time, size, rate, share or ratio ("19 times" is a ratio).
MEASURED = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(µs|us|ms|MB|GB/s|TB/s|GB|%|×|x|times)(?!\w)")
SECTION = re.compile(r"experiments\.md`?,\s*\"([^\"]+)\"")
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")


def _items(notebook_text: str) -> list[str]:
    """The paragraphs and list items of a notebook's markdown cells (jupytext percent format), one string each."""
    items = []
    for cell in re.split(r"^# %%", notebook_text, flags=re.M)[1:]:
        if not cell.startswith(" [markdown]"):
            continue
        prose = "\n".join(line[2:] if line.startswith("# ") else "" for line in cell.splitlines()[1:])
        for paragraph in re.split(r"\n\s*\n", prose):
            items += [" ".join(item.split()) for item in re.split(r"\n(?=[*-] |\d+\. )", paragraph)]
    return items


def _quoted(value: str, numbers: list[str]) -> bool:
    """Whether ``numbers`` (those of experiments.md) hold ``value`` to its digits: the same number or one that rounds
    to it (``452 µs`` quotes ``452.1 µs``)."""
    decimals = len(value.partition(".")[2])
    return any(round(float(n), decimals) == float(value) for n in numbers)


def _problems(notebook_text: str, experiments: str) -> list[str]:
    headings = re.findall(r"^#+ (.*)$", experiments, re.M)
    numbers = NUMBER.findall(experiments)
    problems = []
    for item in _items(notebook_text):
        if "experiments.md" not in item:
            continue
        problems += [f"section {title!r} is no heading of experiments.md" for title in SECTION.findall(item)
                     if not any(title in heading for heading in headings)]
        problems += [f"{m.group(0)!r} is not in experiments.md: {item[:90]!r}" for m in MEASURED.finditer(item)
                     if not _quoted(m.group(1), numbers)]
    return problems


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_numbers_and_sections_quoted_from_experiments_are_there(notebook):
    problems = _problems(notebook.read_text(), EXPERIMENTS.read_text())
    assert not problems, f"{notebook.name}:\n" + "\n".join(problems)


def test_a_wrong_quote_is_caught():
    experiments = "## Atomic baselines\nB=1 took 390 µs (19×), later 21.4 µs.\n"
    good = ("# %% [markdown]\n"
            "# It took 390 µs, 19 times as long, then 21 µs (`docs/experiments.md`, \"Atomic baselines\").\n")
    assert _problems(good, experiments) == []
    drifted = good.replace("390 µs", "380 µs").replace("Atomic baselines", "Atomic base lines")
    problems = _problems(drifted, experiments)
    assert len(problems) == 2 and "380 µs" in problems[1] and "Atomic base lines" in problems[0]
    # A paragraph that does not cite experiments.md is not held to it.
    assert _problems("# %% [markdown]\n# It took 380 µs.\n", experiments) == []
