"""The repository speaks about what is, not about when it was made: no session numbers, no "part N" of a lab log, no
"the team", and no placeholder repository address (``OWNER/``) in any tracked file outside tests/ (notebooks: the
cells' sources; their stored outputs come from a GPU run). History lives in git; measured dead ends, dated, in
docs/experiments.md."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: From "fourth" on: a teaching guide may well speak of "a second session" of a class.
ORDINALS = ("fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth")
#: History in the project's voice (any case): "session 12", "12th session", "eleventh session", "part 3",
#: "parts 8 and 16", "the team".
HISTORY = re.compile(rf"\b(session [0-9]+|[0-9]+(st|nd|rd|th) session|({ORDINALS}) session|parts? [0-9]+|the team)\b",
                     re.IGNORECASE)
#: The placeholder of a repository address (upper case: ``owner/name`` as a description of the form is fine).
PLACEHOLDER = re.compile(r"\bOWNER/")


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.decode().split("\0") if name and not name.startswith("tests/")]


def _text(path: Path) -> str | None:
    """The text to check: a notebook's cell sources, any other file's text; None for binary or missing files."""
    try:
        raw = path.read_bytes()
    except OSError:  # deleted in the working tree, not yet in the index
        return None
    if b"\0" in raw[:8192]:
        return None
    text = raw.decode("utf-8", errors="replace")
    if path.suffix == ".ipynb":
        cells = json.loads(text).get("cells", [])
        return "\n".join("".join(c.get("source", "")) for c in cells)
    return text


def offenders(paths, root: Path = ROOT) -> list[str]:
    """``path:line: text`` of every line in ``paths`` that speaks in the project's history or names ``OWNER/``."""
    found = []
    for path in paths:
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if HISTORY.search(line) or PLACEHOLDER.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()[:120]}")
    return found


@pytest.mark.parametrize("line, caught", [
    ("measured in the eighteenth session", True),
    ("rerun in session 11", True),
    ("the 3rd session's bench", True),
    ("docs/performance.md, part 12", True),
    ("parts 8 and 16", True),
    ("Part 19 (2026-12-05)", True),
    ("the team's comparison harness", True),
    ("github.com/OWNER/gpt2enc-edu", True),
    ("part of the table", False),
    ("a session with the notebooks", False),
    ("for a second session, or for reading at home", False),
    ("``owner/name`` of the repository", False),
    ("bucket_part 3", False),
])
def test_the_patterns_catch_history_and_spare_ordinary_words(line, caught, tmp_path):
    path = tmp_path / "f.md"
    path.write_text(f"first line\n{line}\n")
    assert offenders([path], root=tmp_path) == ([f"f.md:2: {line}"] if caught else [])


def test_notebook_outputs_are_not_scanned(tmp_path):
    notebook = {"cells": [{"cell_type": "code", "source": ["x = 1\n"],
                           "outputs": [{"output_type": "stream", "text": ["part 7\n"]}]}]}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(notebook))
    assert _text(path) == "x = 1\n"
    assert offenders([path], root=tmp_path) == []


def test_no_history_in_the_tracked_tree():
    found = offenders(_tracked_files())
    assert not found, "history in the project's voice (say why, not when; dated results go in docs/experiments.md):\n" \
        + "\n".join(found)
