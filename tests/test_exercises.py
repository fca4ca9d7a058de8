"""Every exercise check accepts its worked solution, reports an open stub as not done, and rejects a wrong answer."""

from __future__ import annotations

import numpy as np
import pytest

import solutions.exercises as solutions
from gpt2enc_edu.course import exercises

# (exercise number, check, solution, a wrong answer, whether the check takes xp)
CASES = [
    pytest.param(1, exercises.check_element_to_thread, solutions.element_to_thread,
                 lambda b, t, c, T, C, dtype: ((b * T + t) * C + c, c % 8), True, id="ex1"),
    pytest.param(2, exercises.check_rows_that_can_differ, solutions.rows_that_can_differ,
                 lambda inp, V: solutions.rows_that_can_differ(inp, V) | True, True, id="ex2"),
    pytest.param(3, exercises.check_locate, solutions.locate,
                 lambda table, inp, b, t, c: (solutions.locate(table, inp, b, t, c)[0], 0), False, id="ex3"),
    pytest.param(4, exercises.check_away_from_zero_probability, solutions.away_from_zero_probability,
                 lambda x: solutions.away_from_zero_probability(x) * 0 + 0.5, True, id="ex4"),
    pytest.param(5, exercises.check_backward_bytes, solutions.backward_bytes,  # dwte rows counted once only
                 lambda inp, C, itemsize: solutions.backward_bytes(inp, C, itemsize)
                 - int(np.unique(np.asarray(inp.get() if hasattr(inp, "get") else inp)).size) * C * itemsize,
                 True, id="ex5"),
]


def _run(check, fn, takes_xp, xp):
    return check(fn, xp=xp) if takes_xp else check(fn)


@pytest.mark.parametrize("number, check, solution, wrong, takes_xp", CASES)
def test_solution_passes(xp, capsys, number, check, solution, wrong, takes_xp):
    assert _run(check, solution, takes_xp, xp) is True
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line.startswith(f"Exercise {number} (") and last_line.endswith("correct.")


@pytest.mark.parametrize("number, check, solution, wrong, takes_xp", CASES)
def test_open_stub_is_reported_not_done(xp, capsys, number, check, solution, wrong, takes_xp):
    def stub(*args):
        raise NotImplementedError(f"Exercise {number}: fill me in")

    assert _run(check, stub, takes_xp, xp) is False
    out = capsys.readouterr().out
    assert f"Exercise {number}" in out and "not done yet" in out
    assert exercises.EXERCISES[number].hint in out
    # The stub itself still fails loudly when called directly.
    with pytest.raises(NotImplementedError):
        stub()


@pytest.mark.parametrize("number, check, solution, wrong, takes_xp", CASES)
def test_wrong_answer_is_rejected(xp, number, check, solution, wrong, takes_xp):
    with pytest.raises(exercises.ExerciseError, match=f"Exercise {number}"):
        _run(check, wrong, takes_xp, xp)


@pytest.mark.parametrize("number, check, solution, wrong, takes_xp", CASES)
def test_a_learners_own_bug_is_not_hidden(xp, number, check, solution, wrong, takes_xp):
    def buggy(*args):
        raise ZeroDivisionError("a bug in the learner's code")

    with pytest.raises(ZeroDivisionError):
        _run(check, buggy, takes_xp, xp)


def test_not_done_helper_makes_a_stub_error(capsys):
    error = exercises.EXERCISES[3].not_done()
    assert isinstance(error, NotImplementedError) and "Exercise 3" in str(error)

    def stub(table, inp, b, t, c):
        raise exercises.EXERCISES[3].not_done()

    assert exercises.check_locate(stub) is False
    assert "not done yet" in capsys.readouterr().out


def test_wrong_shapes_are_explained():
    with pytest.raises(exercises.ExerciseError, match="tuple"):
        exercises.check_element_to_thread(lambda b, t, c, T, C, dtype: b, xp=np)
    with pytest.raises(exercises.ExerciseError, match="boolean"):
        exercises.check_rows_that_can_differ(lambda inp, V: np.zeros(V, dtype=np.int64), xp=np)
    with pytest.raises(exercises.ExerciseError, match="two integers"):
        exercises.check_locate(lambda table, inp, b, t, c: None)
    with pytest.raises(exercises.ExerciseError, match="shape"):
        exercises.check_away_from_zero_probability(lambda x: x[:2], xp=np)


def test_every_exercise_has_a_check_and_a_solution():
    assert sorted(exercises.EXERCISES) == [1, 2, 3, 4, 5]
    names = {1: "element_to_thread", 2: "rows_that_can_differ", 3: "locate", 4: "away_from_zero_probability",
             5: "backward_bytes"}
    for number, name in names.items():
        assert callable(getattr(solutions, name))
        assert callable(getattr(exercises, f"check_{name}"))
