"""Execute notebooks headless and write an HTML copy of each, figures included (the main job's rendering step).

    python scripts/render_notebooks.py --out _rendered notebooks/[0-9]*.ipynb

What ``jupyter nbconvert --to html --execute`` does, with two differences a reader of its output notices:

* every figure has alternative text: its caption, the ``*Figure: ...*`` paragraph that opens the first markdown
  cell after the figure's cell (``figure_captions``), else a sentence naming the notebook and the cell; the HTML
  template ``render_notebooks.html.j2`` writes it (nbconvert's own template writes none and warns);
* the kernel talks to this process over local IPC sockets instead of TCP (the kernel warns about unencrypted TCP):
  sockets in a private temporary folder, named by an absolute path, since the kernel runs in the notebook's folder
  and jupyter_client's default name is relative.

Each notebook runs in its own folder, as in JupyterLab. The notebooks themselves are not modified. Exit status 1
with the failing cell's error when a notebook fails.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "render_notebooks.html.j2"
CAPTION = re.compile(r"^\*Figure:\s*(.+?)\*(?:\s|$)", re.DOTALL)


def figure_captions(nb, name: str) -> dict[int, str]:
    """{index of a code cell with a figure: its alternative text}, from the caption in the next cell."""
    captions = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not any("image/png" in o.get("data", {}) for o in cell.get("outputs", [])):
            continue
        following = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
        found = CAPTION.match(following.source.strip()) if following and following.cell_type == "markdown" else None
        if found:
            captions[i] = " ".join(found.group(1).split())
        else:
            captions[i] = f"A figure of notebook {name}, drawn by its code cell {i + 1}."
    return captions


def set_alt_text(nb, name: str) -> int:
    """Put each figure's alternative text in its output's metadata; the number of figures."""
    count = 0
    for i, alt in figure_captions(nb, name).items():
        for output in nb.cells[i].outputs:
            if "image/png" in output.get("data", {}):
                output.setdefault("metadata", {}).setdefault("image/png", {})["alt"] = alt
                count += 1
    return count


def render(path: Path, out_dir: Path, timeout: int) -> Path:
    """Execute ``path`` in its folder and write ``out_dir/<name>.html``; the file written."""
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import ExecutePreprocessor
    from traitlets.config import Config

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nbk") as sockets:
        config = Config()
        config.KernelManager.transport = "ipc"
        config.KernelManager.ip = str(Path(sockets) / "kernel")
        ExecutePreprocessor(timeout=timeout, config=config).preprocess(nb, {"metadata": {"path": str(path.parent)}})
    figures = set_alt_text(nb, path.name)
    exporter = HTMLExporter(template_name="lab", extra_template_paths=[str(TEMPLATE.parent)],
                            template_file=TEMPLATE.name)
    html, _ = exporter.from_notebook_node(nb)
    target = out_dir / f"{path.stem}.html"
    target.write_text(html, encoding="utf-8")
    print(f"{path.name}: ran in {time.perf_counter() - start:.0f} s, {figures} figure(s) -> {target}", flush=True)
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("_rendered"), help="output folder (default _rendered)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds a cell may run (default 900)")
    args = parser.parse_args(argv)
    from nbclient.exceptions import CellExecutionError

    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.notebooks:
        try:
            render(path, args.out, args.timeout)
        except CellExecutionError as exc:
            print(f"{path}: a cell failed\n{exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
