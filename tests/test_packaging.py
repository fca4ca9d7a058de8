"""The wheel carries the kernels and the token sample, and an installed copy finds them (no checkout needed)."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (built,) = out.glob("gpt2enc_edu-*.whl")
    return built


def test_wheel_contains_kernels_and_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for kernel in sorted(p.name for p in (ROOT / "kernels").iterdir()):
        assert f"gpt2enc_edu/kernels/{kernel}" in names
    assert "gpt2enc_edu/data/gpt2_sample_ids.npy" in names


def _run_installed(wheel, tmp_path, probe: str) -> tuple[Path, list[str]]:
    """Run ``probe`` from an empty folder with only the extracted wheel on the path, so the checkout cannot be
    found; returns the site folder and the lines it printed."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                            env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return site, result.stdout.splitlines()


def test_installed_copy_finds_its_own_kernels_and_sample(wheel, tmp_path):
    site, (kernel_dir, sample_size, has_source) = _run_installed(wheel, tmp_path, (
        "import gpt2enc_edu, gpt2enc_edu.loader as c, gpt2enc_edu.tokens as t;"
        "print(c.kernel_dir()); print(t.gpt2_sample_ids().size);"
        "print(len(c.kernel_source('encoder_forward.cu')) > 0)"
    ))
    assert Path(kernel_dir) == site / "gpt2enc_edu" / "kernels"
    assert int(sample_size) > 10_000
    assert has_source == "True"


def _committed_in_wheel() -> dict[str, str]:
    """pyproject's force-include entries from docs/: {checkout path: path in the wheel} (read with a pattern:
    tomllib is Python 3.11+, and the package supports 3.10)."""
    section = (ROOT / "pyproject.toml").read_text().split("[tool.hatch.build.targets.wheel.force-include]")[1]
    section = section.split("\n[")[0]
    return dict(re.findall(r'^"(docs/[^"]+)" = "([^"]+)"$', section, flags=re.MULTILINE))


def test_wheel_carries_the_committed_results_unchanged(wheel):
    """The results notebooks 01, 05 and 06 read travel in the wheel, byte for byte as committed in docs/."""
    from gpt2enc_edu.course import measured

    shipped = _committed_in_wheel()
    assert {"docs/bench/results.csv", "docs/bench/meta.json", "docs/walkthrough/forward_versions.json",
            "docs/walkthrough/bucketing_phases.json"} <= set(shipped)
    archive = zipfile.ZipFile(wheel)
    packaged = measured.PACKAGED.relative_to(ROOT).as_posix()
    for src, dst in shipped.items():
        assert dst == f"{packaged}/{Path(src).relative_to('docs').as_posix()}", (src, dst)
        assert archive.read(dst) == (ROOT / src).read_bytes(), src


def test_installed_copy_finds_the_committed_results(wheel, tmp_path):
    site, (bench_dir, n_rows, source) = _run_installed(wheel, tmp_path, (
        "from gpt2enc_edu.course import measured; from gpt2enc_edu import bench;"
        "print(measured.bench_dir()); print(len(bench.load_results(measured.bench_dir())[0]));"
        "print(measured.forward_versions(__import__('numpy'))['source'])"
    ))
    assert Path(bench_dir) == site / "gpt2enc_edu" / "committed" / "bench"
    assert int(n_rows) > 0 and source.startswith("committed numbers from")
