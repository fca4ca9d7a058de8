"""Hosted notebooks (Google Colab, Kaggle): which service this is, and the CuPy wheel that matches its CUDA.

A notebook's first cell installs the package from GitHub (``pip_spec()``) when ``import gpt2enc_edu`` fails on
a hosted runtime, then calls ``ensure_cupy()``, which installs the CuPy wheel for the runtime's CUDA major
version when there is a GPU and no CuPy yet:

* the CUDA version is read from the system toolkit (``nvcc --version``), else from the installed torch
  wheel's tag (``torch 2.5.1+cu121``, read from its metadata, torch is not imported), else from the driver
  (``nvidia-smi``: the newest CUDA it runs); a toolkit newer than the driver is capped at the driver's;
* 12 gives ``cupy-cuda12x``, 13 ``cupy-cuda13x``; without a system toolkit the ``[ctk]`` extra brings the
  CUDA libraries (NVRTC, headers) from PyPI; anything else installs nothing and the notebooks run the NumPy
  mirror.

Everything that touches the machine (``environ``, ``modules``, ``run``, ``which``, ``find_spec``,
``distribution_version``, ``install``) can be passed in, so the logic is tested with the environment faked
(``tests/test_hosted.py``); it cannot be tried on Colab or Kaggle from the project's machines.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys

#: The GitHub repository hosted runtimes install from (a placeholder until the project is published; the
#: notebooks' first cells and the README's badges spell the same string, and ``tests/test_hosted.py`` checks it).
REPO = "OWNER/gpt2enc-edu"
BRANCH = "main"
CUPY_WHEELS = {12: "cupy-cuda12x", 13: "cupy-cuda13x"}


def pip_spec(extras: str = "notebooks") -> str:
    """The pip requirement that installs the package (with ``extras``) from GitHub."""
    return f"gpt2enc-edu[{extras}] @ git+https://github.com/{REPO}"


def colab_url(notebook: str) -> str:
    """The address that opens ``notebooks/<notebook>`` of the repository in Colab."""
    return f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/notebooks/{notebook}"


def platform(environ=None, modules=None) -> str | None:
    """``"colab"``, ``"kaggle"`` or ``None`` (not a hosted notebook service we know)."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if "google.colab" in modules or "COLAB_RELEASE_TAG" in environ:
        return "colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in environ:
        return "kaggle"
    return None


def _output(run, command: list[str]) -> str:
    try:
        result = run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return result.stdout if result.returncode == 0 else ""


def _major(pattern: str, text: str) -> int | None:
    found = re.search(pattern, text)
    return int(found.group(1)) if found else None


def cuda_versions(run=None, which=None, distribution_version=None):
    """(driver, toolkit, torch) CUDA major versions, each ``None`` where it cannot be read."""
    run, which = run or subprocess.run, which or shutil.which
    distribution_version = distribution_version or importlib.metadata.version
    driver = toolkit = torch_cuda = None
    if which("nvidia-smi"):
        driver = _major(r"CUDA Version:\s*(\d+)\.", _output(run, ["nvidia-smi"]))
    if which("nvcc"):
        toolkit = _major(r"release (\d+)\.", _output(run, ["nvcc", "--version"]))
    try:
        torch_cuda = _major(r"\+cu(\d\d)\d", distribution_version("torch"))
    except importlib.metadata.PackageNotFoundError:
        pass
    return driver, toolkit, torch_cuda


def cupy_requirement(driver: int | None, toolkit: int | None, torch_cuda: int | None) -> tuple[str | None, str]:
    """(the pip requirement for CuPy or ``None``, the reason in words) for these CUDA major versions."""
    if driver is None:
        return None, "no NVIDIA driver answered (nvidia-smi): no GPU here, the notebooks run the NumPy mirror"
    major, source = (toolkit, "the CUDA toolkit (nvcc)") if toolkit else (torch_cuda, "torch's CUDA build")
    if major is None:
        major, source = driver, "the driver (nvidia-smi)"
    if major > driver:
        major, source = driver, f"the driver (nvidia-smi), older than {source}"
    if major not in CUPY_WHEELS:
        return None, f"CUDA {major} (from {source}) has no CuPy wheel here (12 and 13 do): the NumPy mirror runs"
    wheel = CUPY_WHEELS[major] if toolkit else f"{CUPY_WHEELS[major]}[ctk]"
    libraries = "the system's CUDA libraries" if toolkit else "CUDA libraries from PyPI ([ctk])"
    return wheel, f"CUDA {major} from {source}: {wheel} with {libraries}"


def _pip_install(requirement: str) -> None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", requirement])


def ensure_cupy(*, run=None, which=None, find_spec=None, distribution_version=None, install=None) -> str:
    """Install the CuPy that matches this runtime's CUDA if there is a GPU and no CuPy; says what it did.

    Each argument replaces what it names (``subprocess.run``, ``shutil.which``, ``importlib.util.find_spec``,
    ``importlib.metadata.version``, a ``pip install``), looked up when called.
    """
    find_spec, install = find_spec or importlib.util.find_spec, install or _pip_install
    if find_spec("cupy") is not None:
        return "CuPy is already installed"
    requirement, reason = cupy_requirement(*cuda_versions(run, which, distribution_version))
    if requirement is None:
        return reason
    install(requirement)
    importlib.invalidate_caches()
    return f"installed {reason}"
