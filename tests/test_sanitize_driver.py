"""The sanitizer driver's case list (``scripts/sanitize_kernels.py``), checked on the CPU.

Every kernel defined in ``kernels/*.cu`` must be declared by some case, or ``--dry-run`` fails (and with it
``bash scripts/sanitize.sh``, before any tool runs); the declaration parser must find kernels whose
``__launch_bounds__`` put the name on the next line.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def driver():
    spec = importlib.util.spec_from_file_location("sanitize_kernels", ROOT / "scripts" / "sanitize_kernels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_dry_run_covers_every_kernel(driver, capsys):
    assert driver.main(["--dry-run"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    total = len(driver.kernel_names())
    assert total >= 1 and last.endswith(f"{total} of {total} kernels covered"), last


def test_declaration_parser_finds_launch_bounds_kernels(driver, tmp_path):
    (tmp_path / "a.cu").write_text(
        'extern "C" __global__ void plain_kernel(float* x) {}\n'
        'extern "C" __global__ void __launch_bounds__(WARP_SIZE * 4, 2)\nbounded_kernel(const int* y,\n int n) {}\n'
        '__device__ void helper() {}\n'
    )
    assert driver.kernel_names(tmp_path) == {"plain_kernel": "a.cu", "bounded_kernel": "a.cu"}


def test_dry_run_fails_on_an_uncovered_kernel(driver, monkeypatch, capsys):
    known = driver.kernel_names()
    monkeypatch.setattr(driver, "kernel_names", lambda folder=None: {**known, "brand_new_kernel": "new.cu"})
    assert driver.main(["--dry-run"]) == 1
    assert "UNCOVERED kernel brand_new_kernel (kernels/new.cu)" in capsys.readouterr().out


def test_subset_is_not_judged_for_coverage(driver):
    assert driver.main(["--dry-run", "--only", "B1-T1-C8"]) == 0
