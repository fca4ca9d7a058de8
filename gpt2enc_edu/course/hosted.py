"""Hosted notebooks (Google Colab, Kaggle): the notebooks' first cell, the repository they install from, and the
CuPy wheel that matches the runtime's CUDA.

Every notebook's first code cell makes ``import gpt2enc_edu`` work and then calls ``setup()`` here:

* installed package: nothing to do; a checkout (the notebooks run with ``notebooks/`` as working folder): the
  cell puts the parent folder first on ``sys.path``;
* Colab or Kaggle without the package: the cell pip-installs ``pip_spec(repository())`` from GitHub, the
  repository named by the environment variable ``GPT2ENC_EDU_REPO`` (``%env GPT2ENC_EDU_REPO=owner/name``);
  without it the cell stops with a message that says so;
* then ``setup()``, on Colab or Kaggle only, calls ``ensure_cupy()``, which installs the CuPy wheel for the
  runtime's CUDA major version when there is a GPU and no CuPy yet:

  - the CUDA version is read from the system toolkit (``nvcc --version``), else from the installed torch
    wheel's tag (``torch 2.5.1+cu121``, read from its metadata, torch is not imported), else from the driver
    (``nvidia-smi``: the newest CUDA it runs); a toolkit newer than the driver is capped at the driver's;
  - 12 gives ``cupy-cuda12x``, 13 ``cupy-cuda13x``; without a system toolkit the ``[ctk]`` extra brings the
    CUDA libraries (NVRTC, headers) from PyPI; anything else installs nothing and the notebooks run the NumPy
    mirror.

The repository's address is one setting: ``[project.urls] Repository`` in ``pyproject.toml``, which a fork sets
once (``https://github.com/<owner>/gpt2enc-edu``); ``repository()`` reads it (``GPT2ENC_EDU_REPO`` first), and
the links to Colab and Kaggle are made from it (``colab_url``, ``kaggle_url``). Unset, there is no address to
link to, and the functions that need one say so.

Everything that touches the machine (``environ``, ``modules``, ``run``, ``which``, ``find_spec``,
``distribution_version``, ``install``) can be passed in, so the logic is tested with the environment faked
(``tests/test_hosted.py``, which also runs the notebooks' first cell); it cannot be tried on Colab or Kaggle from
the project's machines.
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
from pathlib import Path

#: The environment variable that names the GitHub repository (``owner/name``) on a hosted runtime without the
#: package; the notebooks' first cell reads it before the package can be imported.
REPO_ENV = "GPT2ENC_EDU_REPO"
BRANCH = "main"
CUPY_WHEELS = {12: "cupy-cuda12x", 13: "cupy-cuda13x"}
DISTRIBUTION = "gpt2enc-edu"
_GITHUB = re.compile(r"https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?$")
_PYPROJECT_URL = re.compile(r'^\s*Repository\s*=\s*"([^"]*)"', re.M)


def _checkout_pyproject() -> str | None:
    """The ``pyproject.toml`` of the checkout this package is imported from, if it is one (else ``None``)."""
    path = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    return text if re.search(rf'^name\s*=\s*"{DISTRIBUTION}"', text, re.M) else None


def _installed_urls() -> list[str]:
    try:
        return importlib.metadata.distribution(DISTRIBUTION).metadata.get_all("Project-URL") or []
    except importlib.metadata.PackageNotFoundError:
        return []


def repository(environ=None, pyproject=None, project_urls=None) -> str | None:
    """``owner/name`` of the GitHub repository the notebooks install from, or ``None`` where none is set.

    Read from ``GPT2ENC_EDU_REPO`` if set, else from ``[project.urls] Repository`` of the checkout's
    ``pyproject.toml`` (``pyproject``: its text), else from the installed package's metadata (``project_urls``:
    its ``Project-URL`` lines, ``"Repository, https://github.com/owner/name"``).
    """
    environ = os.environ if environ is None else environ
    if environ.get(REPO_ENV):
        return environ[REPO_ENV].strip()
    pyproject = _checkout_pyproject() if pyproject is None else pyproject
    urls = _PYPROJECT_URL.findall(pyproject or "")
    urls += [line.split(",", 1)[1].strip() for line in (_installed_urls() if project_urls is None else project_urls)
             if line.split(",", 1)[0].strip().lower() == "repository"]
    for url in urls:
        found = _GITHUB.match(url)
        if found:
            return found.group(1)
    return None


def _require(repo: str | None) -> str:
    repo = repo or repository()
    if not repo:
        raise LookupError(f"no GitHub repository is set: set [project.urls] Repository = "
                          f'"https://github.com/<owner>/gpt2enc-edu" in pyproject.toml (a fork does it once), '
                          f"or the environment variable {REPO_ENV}=<owner>/gpt2enc-edu")
    return repo


def pip_spec(repo: str | None = None, extras: str = "notebooks") -> str:
    """The pip requirement that installs the package (with ``extras``) from GitHub (``repo``: ``repository()``)."""
    return f"gpt2enc-edu[{extras}] @ git+https://github.com/{_require(repo)}"


def colab_url(notebook: str, repo: str | None = None) -> str:
    """The address that opens ``notebooks/<notebook>`` of the repository in Colab."""
    return f"https://colab.research.google.com/github/{_require(repo)}/blob/{BRANCH}/notebooks/{notebook}"


def kaggle_url(notebook: str, repo: str | None = None) -> str:
    """The address that opens ``notebooks/<notebook>`` of the repository in Kaggle."""
    return (f"https://kaggle.com/kernels/welcome?src=https://github.com/{_require(repo)}/blob/{BRANCH}/"
            f"notebooks/{notebook}")


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


def setup(environ=None, modules=None, **machine):
    """What every notebook's first cell calls once ``import gpt2enc_edu`` works; returns the package.

    On Colab or Kaggle it prints what ``ensure_cupy`` did (``machine``: its arguments); elsewhere it prints
    nothing and installs nothing.
    """
    import gpt2enc_edu

    if platform(environ, modules) is not None:
        print(ensure_cupy(**machine))
    return gpt2enc_edu
