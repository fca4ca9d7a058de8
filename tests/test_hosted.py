"""Hosted notebooks (Colab, Kaggle) with the environment faked: ``course/hosted.py`` and the notebooks' first cell.

Nothing here reaches a network or a hosted service: ``subprocess``, ``shutil.which``, the environment and the
import system are replaced, and the test reads which ``pip install`` commands would have run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import gpt2enc_edu as enc
from gpt2enc_edu import course
from gpt2enc_edu.course import hosted

ROOT = Path(__file__).resolve().parents[1]
NVIDIA_SMI = "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: {} |"
NVCC = "Cuda compilation tools, release {0}, V{0}.140"
HOSTED_ENV = ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE")


def fake_machine(driver=None, toolkit=None, torch_version=None):
    """(run, which, distribution_version) of a machine with these CUDA versions (strings like "12.4")."""
    tools = {"nvidia-smi": NVIDIA_SMI.format(driver) if driver else None,
             "nvcc": NVCC.format(toolkit) if toolkit else None}

    def which(name):
        return f"/usr/bin/{name}" if tools.get(name) else None

    def run(command, **kwargs):
        return SimpleNamespace(returncode=0, stdout=tools[command[0]], stderr="")

    def distribution_version(name):
        if name != "torch" or torch_version is None:
            raise hosted.importlib.metadata.PackageNotFoundError(name)
        return torch_version

    return run, which, distribution_version


def test_platform():
    assert hosted.platform({}, {}) is None
    assert hosted.platform({"COLAB_RELEASE_TAG": "release-colab_20260101"}, {}) == "colab"
    assert hosted.platform({}, {"google.colab": object()}) == "colab"
    assert hosted.platform({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, {}) == "kaggle"
    assert hosted.platform({"KAGGLE_URL_BASE": "x", "COLAB_GPU": "1"}, {}) is None  # only the markers we know


@pytest.mark.parametrize("machine, versions", [
    (dict(driver="12.4", toolkit="12.5", torch_version="2.5.1+cu121"), (12, 12, 12)),
    (dict(driver="13.0"), (13, None, None)),
    (dict(torch_version="2.13.0+cpu"), (None, None, None)),
    (dict(driver="12.8", torch_version="2.11.0+cu130"), (12, None, 13)),
    (dict(), (None, None, None)),
])
def test_cuda_versions(machine, versions):
    assert hosted.cuda_versions(*fake_machine(**machine)) == versions


def test_cuda_versions_survive_failing_tools():
    def run(command, **kwargs):
        raise subprocess.TimeoutExpired(command, 60)

    assert hosted.cuda_versions(run, lambda name: "/usr/bin/" + name, lambda name: "1.0") == (None, None, None)


@pytest.mark.parametrize("versions, wheel", [
    ((12, 12, None), "cupy-cuda12x"),  # Colab today: driver and toolkit CUDA 12
    ((13, 13, 13), "cupy-cuda13x"),
    ((13, 12, 12), "cupy-cuda12x"),  # the toolkit decides: CuPy will use its libraries
    ((12, 13, None), "cupy-cuda12x"),  # a toolkit newer than the driver cannot run: capped
    ((13, None, 12), "cupy-cuda12x[ctk]"),  # no toolkit: torch's build, libraries from PyPI
    ((13, None, None), "cupy-cuda13x[ctk]"),
    ((11, 11, None), None),  # CUDA 11: no CuPy 14 wheel, the mirror runs
    ((None, 12, 12), None),  # no driver, no GPU
])
def test_cupy_requirement(versions, wheel):
    requirement, reason = hosted.cupy_requirement(*versions)
    assert requirement == wheel
    assert reason and (wheel is None or wheel in reason)


def test_ensure_cupy():
    installed = []
    machine = dict(zip(("run", "which", "distribution_version"), fake_machine(driver="12.4", toolkit="12.5")))
    said = hosted.ensure_cupy(find_spec=lambda name: None, install=installed.append, **machine)
    assert installed == ["cupy-cuda12x"] and said.startswith("installed CUDA 12")
    assert hosted.ensure_cupy(find_spec=lambda name: object(), install=installed.append, **machine) == \
        "CuPy is already installed"
    no_gpu = dict(zip(("run", "which", "distribution_version"), fake_machine()))
    assert "no GPU" in hosted.ensure_cupy(find_spec=lambda name: None, install=installed.append, **no_gpu)
    assert installed == ["cupy-cuda12x"]


GITHUB = "https://github.com/someone/gpt2enc-edu"
PYPROJECT = f'[project]\nname = "gpt2enc-edu"\n\n[project.urls]\nRepository = "{GITHUB}"\n'


@pytest.mark.parametrize("environ, pyproject, project_urls, repo", [
    ({}, PYPROJECT, [], "someone/gpt2enc-edu"),  # a checkout whose pyproject.toml names it
    ({}, "", [f"Repository, {GITHUB}.git"], "someone/gpt2enc-edu"),  # an installed package's metadata
    ({}, "", [f"Homepage, {GITHUB}"], None),  # only the Repository entry counts
    ({}, PYPROJECT.replace("Repository", "# Repository"), [], None),  # commented out: unset
    ({}, PYPROJECT.replace("github.com", "gitlab.com"), [], None),  # not GitHub: nothing to install from
    ({"GPT2ENC_EDU_REPO": "fork/gpt2enc-edu"}, PYPROJECT, [], "fork/gpt2enc-edu"),  # the variable wins
    ({}, "", [], None),
])
def test_repository(environ, pyproject, project_urls, repo):
    assert hosted.repository(environ, pyproject, project_urls) == repo


def test_urls():
    repo = "someone/gpt2enc-edu"
    assert hosted.pip_spec(repo) == f"gpt2enc-edu[notebooks] @ git+https://github.com/{repo}"
    url = hosted.colab_url("07_training_loop.ipynb", repo)
    assert url == f"https://colab.research.google.com/github/{repo}/blob/main/notebooks/07_training_loop.ipynb"
    kaggle = hosted.kaggle_url("01_forward.ipynb", repo)
    assert kaggle.endswith(f"src=https://github.com/{repo}/blob/main/notebooks/01_forward.ipynb")


def test_urls_without_a_repository_say_how_to_set_one(monkeypatch):
    monkeypatch.delenv(hosted.REPO_ENV, raising=False)
    monkeypatch.setattr(hosted, "repository", lambda: None)
    for make in (hosted.pip_spec, lambda: hosted.colab_url("01_forward.ipynb")):
        with pytest.raises(LookupError, match=r"\[project\.urls\] Repository.*GPT2ENC_EDU_REPO"):
            make()


# --- the first cell of the notebooks, executed with the environment faked ---------------------------------------

def first_cell(notebook: Path) -> str:
    """The first code cell of a jupytext percent-format notebook."""
    parts = re.split(r"^(# %%.*)$", notebook.read_text(), flags=re.M)
    return next(body for marker, body in zip(parts[1::2], parts[2::2]) if "[markdown]" not in marker).strip()


NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
REPO = "someone/gpt2enc-edu"


def test_every_notebook_starts_with_the_same_short_first_cell():
    cells = {notebook.name: first_cell(notebook) for notebook in NOTEBOOKS}
    assert len(cells) >= 7 and len(set(cells.values())) == 1, "the first cells differ"
    cell = cells[NOTEBOOKS[0].name]
    assert len(cell.splitlines()) <= 6
    assert f'"{hosted.REPO_ENV}"' in cell and "hosted\").setup()" in cell


class FakeHost:
    """Records ``pip install`` commands; a "pip install" of the package makes it importable again."""

    def __init__(self, monkeypatch, *, hosted_env: str | None, importable: bool, gpu: bool = True,
                 repo: str | None = None):
        self.commands = []
        for name in (*HOSTED_ENV, hosted.REPO_ENV):
            monkeypatch.delenv(name, raising=False)
        if hosted_env:
            monkeypatch.setenv(hosted_env, "1")
        if repo:
            monkeypatch.setenv(hosted.REPO_ENV, repo)
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
        self.installed = importable
        if not importable:  # `import gpt2enc_edu` fails until "installed" or the checkout leads sys.path
            monkeypatch.delitem(sys.modules, "gpt2enc_edu")
            monkeypatch.setattr(sys, "meta_path", [self, *sys.meta_path])
        run, which, version = fake_machine(driver="12.4" if gpu else None, toolkit="12.5" if gpu else None)
        monkeypatch.setattr(hosted.shutil, "which", which)
        monkeypatch.setattr(hosted.subprocess, "run", run)
        monkeypatch.setattr(hosted.importlib.metadata, "version", version)
        real_find_spec = hosted.importlib.util.find_spec

        def find_spec(name, *args):
            if name == "cupy" or (name == "gpt2enc_edu" and self.hidden()):
                return None
            return real_find_spec(name, *args)

        monkeypatch.setattr(hosted.importlib.util, "find_spec", find_spec)
        monkeypatch.setattr(subprocess, "check_call", self.check_call)

    def hidden(self) -> bool:
        return not self.installed and sys.path[0] != str(ROOT)

    def check_call(self, command, **kwargs):
        assert command[:4] == [sys.executable, "-m", "pip", "install"]
        self.commands.append(command[-1])
        if "gpt2enc" in command[-1]:
            self.installed = True
            sys.path.append(str(ROOT))  # where "site-packages" now holds the package
        return 0

    def find_spec(self, name, path=None, target=None):
        """The import-system hook that hides the package while it is "not installed"."""
        if name == "gpt2enc_edu" and self.hidden():
            raise ModuleNotFoundError("No module named 'gpt2enc_edu'", name=name)
        return None


def run_cell(cwd: Path, monkeypatch) -> dict:
    """Runs the notebooks' first cell (the same in every notebook) in ``cwd``; returns its namespace."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != ROOT])
    namespace = {"__name__": "__cell__"}
    exec(compile(first_cell(NOTEBOOKS[0]), str(NOTEBOOKS[0]), "exec"), namespace)
    return namespace


@pytest.mark.parametrize("service", HOSTED_ENV)
def test_hosted_without_a_clone_installs_from_the_named_repository_and_the_matching_cupy(
        service, monkeypatch, tmp_path, capsys):
    host = FakeHost(monkeypatch, hosted_env=service, importable=False, repo=REPO)
    namespace = run_cell(tmp_path, monkeypatch)
    assert host.commands == [hosted.pip_spec(REPO), "cupy-cuda12x"]
    assert namespace["enc"].__name__ == "gpt2enc_edu"
    assert capsys.readouterr().out.startswith("installed CUDA 12")


@pytest.mark.parametrize("service", HOSTED_ENV)
def test_hosted_without_a_clone_or_a_repository_stops_and_says_how_to_name_one(service, monkeypatch, tmp_path):
    host = FakeHost(monkeypatch, hosted_env=service, importable=False)
    with pytest.raises(SystemExit, match=f"%env {hosted.REPO_ENV}=<owner>/gpt2enc-edu"):
        run_cell(tmp_path, monkeypatch)
    assert host.commands == []


@pytest.mark.parametrize("gpu, commands", [(False, []), (True, ["cupy-cuda12x"])])
def test_hosted_clone_uses_the_clone(gpu, commands, monkeypatch):
    host = FakeHost(monkeypatch, hosted_env="COLAB_RELEASE_TAG", importable=False, gpu=gpu, repo=REPO)
    namespace = run_cell(ROOT / "notebooks", monkeypatch)
    assert host.commands == commands  # the package from the clone, not from GitHub
    assert sys.path[0] == str(ROOT) and namespace["enc"].__name__ == "gpt2enc_edu"


def test_local_checkout_installs_nothing_and_prints_nothing(monkeypatch, capsys):
    host = FakeHost(monkeypatch, hosted_env=None, importable=False)
    namespace = run_cell(ROOT / "notebooks", monkeypatch)
    assert host.commands == [] and sys.path[0] == str(ROOT) and namespace["enc"].__name__ == "gpt2enc_edu"
    assert capsys.readouterr().out == ""


def test_elsewhere_without_the_package_stops_with_where_to_look(monkeypatch, tmp_path):
    host = FakeHost(monkeypatch, hosted_env=None, importable=False)
    with pytest.raises(SystemExit, match="gpt2enc_edu is not installed"):
        run_cell(tmp_path, monkeypatch)
    assert host.commands == []


def test_installed_package_on_a_host_only_adds_cupy(monkeypatch, tmp_path):
    host = FakeHost(monkeypatch, hosted_env="KAGGLE_KERNEL_RUN_TYPE", importable=True, repo=REPO)
    run_cell(tmp_path, monkeypatch)
    assert host.commands == ["cupy-cuda12x"]


def test_installed_package_elsewhere_prints_nothing(monkeypatch, tmp_path, capsys):
    host = FakeHost(monkeypatch, hosted_env=None, importable=True)
    assert run_cell(tmp_path, monkeypatch)["enc"].__name__ == "gpt2enc_edu"
    assert host.commands == [] and capsys.readouterr().out == ""


def test_the_notebooks_array_module_is_the_packages_and_says_which_backend_runs(capsys, monkeypatch):
    monkeypatch.setenv("GPT2ENC_BACKEND", "numpy")
    assert course.arrays() is np
    assert capsys.readouterr().out.splitlines() == [
        "arrays: numpy -> the NumPy mirror", f"gpu_status(): {enc.gpu_status()}"]
