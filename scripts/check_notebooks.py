"""Reviewability checks for notebooks/, run by scripts/test.sh (and so by CI).

* every numbered notebook has its jupytext percent-format twin, with the same cells (`jupytext --diff`);
* no notebook is over 1 MB;
* no stray metadata: cells carry none (no execution timings, no widget state, no collapsed/scrolled flags)
  and the notebook carries only jupytext, kernelspec and language_info.

    python scripts/check_notebooks.py          # exit 1 with the reasons if a check fails
    python scripts/check_notebooks.py --fix    # strip stray metadata in place first
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
MAX_BYTES = 1024 * 1024
ALLOWED_NOTEBOOK_METADATA = {"jupytext", "kernelspec", "language_info"}


def strip_metadata(path: Path) -> None:
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        cell["metadata"] = {}
    nb["metadata"] = {k: v for k, v in nb["metadata"].items() if k in ALLOWED_NOTEBOOK_METADATA}
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def problems(path: Path) -> list[str]:
    found = []
    if path.stat().st_size > MAX_BYTES:
        found.append(f"{path.name} is {path.stat().st_size} bytes (over 1 MB)")
    nb = json.loads(path.read_text())
    extra = set(nb["metadata"]) - ALLOWED_NOTEBOOK_METADATA
    if extra:
        found.append(f"{path.name}: notebook metadata {sorted(extra)}")
    for i, cell in enumerate(nb["cells"]):
        if cell.get("metadata"):
            found.append(f"{path.name}: cell {i} has metadata {sorted(cell['metadata'])}")
    twin = path.with_suffix(".py")
    if not twin.is_file():
        found.append(f"{path.name} has no jupytext twin {twin.name}")
    else:
        diff = subprocess.run([sys.executable, "-m", "jupytext", "--diff", str(twin), str(path)],
                              capture_output=True, text=True)
        if diff.stdout.strip() or diff.returncode:
            found.append(f"{twin.name} and {path.name} are out of sync (jupytext --sync {twin}):\n"
                         f"{diff.stdout}{diff.stderr}")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fix", action="store_true", help="strip stray metadata before checking")
    args = parser.parse_args(argv)
    paths = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    if not paths:
        print("no notebooks found", file=sys.stderr)
        return 1
    if args.fix:
        for path in paths:
            strip_metadata(path)
    found = [p for path in paths for p in problems(path)]
    for line in found:
        print(line)
    print(f"{len(paths)} notebooks checked: {'ok' if not found else f'{len(found)} problem(s)'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
