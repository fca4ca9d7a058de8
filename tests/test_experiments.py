"""The prepared experiments in scripts/experiments/ stay buildable: their kernels compile with nvcc (the sizes the probe
passes, both storage dtypes, the architectures they are for), their probes start (``--help``) and, without a GPU,
exit saying why, so that a machine with a GPU can run them as they are. What they measured on a GPU is in
docs/experiments.md."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_kernels_compile import NVCC  # tests/ is on sys.path (pytest prepends it)

from gpt2enc_edu.backend import gpu_status
from gpt2enc_edu.loader import kernel_dir

EXPERIMENTS = Path(__file__).resolve().parent.parent / "scripts" / "experiments"
PROBES = sorted(p for p in EXPERIMENTS.glob("probe_*.py") if p.name != "probe_common.py")  # the scripts
WPE_PROBE = EXPERIMENTS / "probe_wpe_bulk_copy.py"


def _wpe_probe():
    """The wpe probe's module, for its FORMS (importing it needs no GPU; it imports probe_common by name, as it does
    when it runs as a script from its folder)."""
    import importlib.util

    if str(EXPERIMENTS) not in sys.path:
        sys.path.insert(0, str(EXPERIMENTS))
    spec = importlib.util.spec_from_file_location("probe_wpe_bulk_copy", WPE_PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nvcc(tmp_path, source: Path, arch: str, dtype_flag: str, *defines: str):
    """nvcc -c of one experiment file with the package's kernel folder on the include path (as NVRTC gets it)."""
    if NVCC is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc not found, but CI must compile every kernel")
        pytest.skip("nvcc not found")
    cmd = [NVCC, f"-arch={arch}", "-std=c++17", "-Werror", "all-warnings", f"-I{kernel_dir()}", *defines, "-c",
           str(source), "-o", str(tmp_path / "k.o")]
    if dtype_flag:
        cmd.insert(1, dtype_flag)
    return subprocess.run(cmd, capture_output=True, text=True)


def test_call_forms_are_timed_forms():
    probe = _wpe_probe()
    assert set(probe.CALL_FORMS) <= set(probe.FORMS)
    assert len({probe.form_name(f) for f in probe.FORMS}) == len(probe.FORMS)  # the labels tell the forms apart


def _builds():
    """(form, arch) pairs: the bulk form is for sm_90 (its body is empty below), the cp.async form for sm_80 on."""
    probe = _wpe_probe()
    return [pytest.param(form, arch, id=f"{probe.form_name(form)}-{arch}") for form in probe.FORMS
            for arch in (("sm_90",) if form[0] == "bulk" else ("sm_80", "sm_90"))]


@pytest.mark.parametrize("dtype_flag", ["", "-DENC_FP32"], ids=["bf16", "fp32"])
@pytest.mark.parametrize("form, arch", _builds())
def test_wpe_form_compiles(tmp_path, form, arch, dtype_flag):
    kernel, threads, stages, evict_first = form
    prefix = "BULK" if kernel == "bulk" else "CPASYNC"
    result = _nvcc(tmp_path, EXPERIMENTS / "wpe_bulk_copy.cu", arch, dtype_flag, f"-D{prefix}_THREADS={threads}",
                   f"-D{prefix}_STAGES={stages}", f"-DBULK_EVICT_FIRST={evict_first}")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])  # wherever the package's chunk kernel compiles
@pytest.mark.parametrize("dtype_flag", ["", "-DENC_FP32"], ids=["bf16", "fp32"])
def test_chunk_groups_side_by_side_compiles(tmp_path, arch, dtype_flag):
    result = _nvcc(tmp_path, EXPERIMENTS / "chunk_groups_side_by_side.cu", arch, dtype_flag)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.stem)
def test_probe_starts(probe):
    result = subprocess.run([sys.executable, str(probe), "--help"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(EXPERIMENTS.parent.parent)})
    assert result.returncode == 0, result.stderr
    assert "--out" in result.stdout


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.stem)
def test_probe_without_gpu_says_so(probe, tmp_path):
    """Without a GPU a probe exits with status 2 and one line saying why, and writes nothing."""
    if gpu_status().name == "cuda":
        pytest.skip("a GPU is here: the probe would run")
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(probe), "--out", str(out)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(EXPERIMENTS.parent.parent)})
    assert result.returncode == 2, result.stderr
    assert "needs a CUDA GPU" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()
