"""Peak memory on a CPU: the demo and every notebook must fit in 1 GB (the laptops the walkthrough promises).

Each one runs in a fresh wrapper process that starts it as a child and reads the child's peak resident set
with ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` (kilobytes on Linux). A notebook is run as its
jupytext ``.py`` twin, which holds the same cells, with the NumPy backend and a non-interactive matplotlib.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

resource = pytest.importorskip("resource")  # Unix only

ROOT = Path(__file__).resolve().parents[1]
LIMIT_KB = 1024 * 1024  # 1 GB
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))

WRAPPER = """
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[2:], cwd=sys.argv[1], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
print(json.dumps({"rc": proc.returncode, "peak_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                  "stderr": proc.stderr[-3000:]}))
"""


def peak_kb(cwd: Path, *command: str) -> int:
    """Run ``command`` in ``cwd`` as the only child of a fresh process; return its peak RSS in kB."""
    env = dict(os.environ, GPT2ENC_BACKEND="numpy", MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", WRAPPER, str(cwd), *command], env=env, capture_output=True,
                          text=True, timeout=600, check=True)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["rc"] == 0, f"{' '.join(command)} failed:\n{report['stderr']}"
    return report["peak_kb"]


def test_demo_fits_in_one_gigabyte():
    peak = peak_kb(ROOT, sys.executable, "-m", "gpt2enc_edu.demo")
    assert peak <= LIMIT_KB, f"python -m gpt2enc_edu.demo peaked at {peak / 1024:.0f} MB"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_fits_in_one_gigabyte(notebook):
    peak = peak_kb(notebook.parent, sys.executable, notebook.name)
    assert peak <= LIMIT_KB, f"{notebook.name} peaked at {peak / 1024:.0f} MB"
