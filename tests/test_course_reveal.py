"""``course.reveal``: a build-it's answer stays closed until the learner's check passed or the learner asks."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpt2enc_edu.course import perthread, reveal, skeletons
from gpt2enc_edu.course.verdict import Verdict
from gpt2enc_edu.loader import kernel_source


@pytest.fixture
def shown(monkeypatch):
    """What ``reveal`` displays, as (language, text) pairs."""
    seen = []
    monkeypatch.setattr(reveal, "_show", lambda text, language: seen.append((language, text)))
    return seen


def failed_verdict(exercise: str) -> Verdict:
    return Verdict(exercise=exercise, passed=False, message="not done yet")


@pytest.mark.parametrize("name", sorted(reveal.PER_THREAD))
def test_closed_until_unlocked(name, shown, capsys):
    reveal.perthread(name, unlocked=failed_verdict(name))
    reveal.kernel(name, unlocked=False)
    said = capsys.readouterr().out
    assert shown == [] and "def " not in said and "__global__" not in said
    assert f"reveal.perthread({name!r}, unlocked=True)" in said and f"reveal.kernel({name!r}, unlocked=True)" in said


@pytest.mark.parametrize("name", sorted(reveal.PER_THREAD))
def test_open_once_unlocked(name, shown):
    reveal.perthread(name, unlocked=True)
    reveal.kernel(name, unlocked=True)
    (language, text), (cuda, source) = shown
    assert language == "python" and text.startswith(f"def {reveal.PER_THREAD[name].__name__}(cuda")
    assert getattr(perthread, reveal.PER_THREAD[name].__name__) is reveal.PER_THREAD[name]
    assert cuda == "cuda" and source == kernel_source(skeletons.KERNEL_EXERCISES[name].file)
    assert skeletons.KERNEL_EXERCISES[name].kernel in source


def test_every_kernel_build_it_has_a_per_thread_form():
    assert set(reveal.PER_THREAD) == set(skeletons.KERNEL_EXERCISES)


def test_unknown_name_is_refused(shown):
    with pytest.raises(ValueError, match="'forward'"):
        reveal.perthread("forwards", unlocked=True)
    with pytest.raises(ValueError, match="'wpe'"):
        reveal.kernel("wpee", unlocked=True)
    assert shown == []


# --- the notebooks open the answers only through reveal --------------------------------------------------------

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.py"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_show_build_it_answers_only_through_reveal(notebook):
    """No cell prints a build-it's per-thread form or kernel file beside the exercise (the stored outputs would)."""
    text = notebook.read_text()
    for name, function in reveal.PER_THREAD.items():
        assert f"getsource(perthread.{function.__name__})" not in text, (name, "per-thread form shown")
        assert f"kernel_source('{skeletons.KERNEL_EXERCISES[name].file}')" not in text, (name, "kernel file shown")
        assert f'kernel_source("{skeletons.KERNEL_EXERCISES[name].file}")' not in text, (name, "kernel file shown")
