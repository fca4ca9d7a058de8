"""scripts/render_notebooks.py, the main job's rendering step: figures get their captions as alternative text, and
neither nbconvert nor the kernel prints a warning a reader would take for a failure."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "render_notebooks.py"

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbconvert")


def _script():
    spec = importlib.util.spec_from_file_location("render_notebooks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _figure_output():
    return nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})


def test_captions_become_alternative_text():
    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[
        v4.new_code_cell("plot()", outputs=[_figure_output(), _figure_output()]),
        v4.new_markdown_cell("*Figure: two lines,\nthe second above the first.*\n\nWhy it matters."),
        v4.new_code_cell("plot()", outputs=[_figure_output()]),
        v4.new_markdown_cell("No caption here."),
        v4.new_code_cell("print(1)", outputs=[nbformat.v4.new_output("stream", text="1\n")]),
    ])
    render = _script()
    assert render.figure_captions(nb, "x.ipynb") == {
        0: "two lines, the second above the first.", 2: "A figure of notebook x.ipynb, drawn by its code cell 3."}
    assert render.set_alt_text(nb, "x.ipynb") == 3
    alts = [o.metadata["image/png"]["alt"] for o in nb.cells[0].outputs]
    assert alts == ["two lines, the second above the first."] * 2


def test_render_writes_alt_text_and_no_warnings(tmp_path):
    """A small notebook with a real figure, executed and exported as the main job does (from another folder than the
    notebook's): its caption is the image's alt text, and stderr holds neither nbconvert's missing-alt warning nor
    the kernel's TCP notice."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("ipykernel")
    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[
        v4.new_code_cell("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"),
        v4.new_markdown_cell("*Figure: a line that rises & falls.*"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    path = tmp_path / "notebooks" / "figure.ipynb"  # not the working folder: the kernel runs in the notebook's
    path.parent.mkdir()
    nbformat.write(nb, path)
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), str(path)],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Alternative text is missing" not in result.stderr and "without encryption" not in result.stderr
    assert "1 figure(s)" in result.stdout
    html = (tmp_path / "out" / "figure.html").read_text()
    assert html.count("<img ") == 1 and 'alt="a line that rises &amp; falls."' in html
