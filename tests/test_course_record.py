"""``course.report()`` lists which checks passed, from the record the grader writes."""

from __future__ import annotations

import json

import solutions.exercises as worked
import solutions.warmups as solutions
from gpt2enc_edu import course
from gpt2enc_edu.course import exercises, record, warmups


def test_report_lists_the_graded_checks_and_the_exercises(tmp_path, monkeypatch, capsys):
    file = tmp_path / "checks.jsonl"
    monkeypatch.setenv("GPT2ENC_EDU_RECORD", str(file))
    assert course.report() == [] and "No checks recorded yet" in capsys.readouterr().out

    def wrong(cuda, out, x, bias, n, C):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < n:
            out[i] = x[i]

    assert not warmups.check("add_bias", wrong)
    assert warmups.check("add_bias", solutions.add_bias)
    assert not warmups.check("warp_sum", wrong)  # wrong signature for this one: it fails too
    exercises.check_element_to_thread(worked.element_to_thread)
    capsys.readouterr()
    rows = course.report(save=tmp_path / "mine.json")
    out = capsys.readouterr().out
    by_check = {(r["check"], r["form"]): r for r in rows}
    assert by_check[("add_bias", "per-thread Python")]["passed"] and by_check[("add_bias", "per-thread Python")][
        "attempts"] == 2
    assert not by_check[("warp_sum", "per-thread Python")]["passed"]
    assert by_check[("exercise 1", "in-process")]["passed"]
    assert "2 of 3 passed" in out and "add_bias" in out and "not passed (last: failed)" in out
    saved = json.loads((tmp_path / "mine.json").read_text())
    assert saved["checks"] == rows and saved["record"] == str(file)
    lines = record.read()
    assert [line["status"] for line in lines] == ["failed", "correct", "failed", "correct"]
    assert all(line["time"].endswith("+00:00") for line in lines)


def test_a_broken_record_line_is_skipped(tmp_path):
    file = tmp_path / "checks.jsonl"
    file.write_text('{"check": "forward", "form": "CUDA", "status": "correct", "time": "t"}\nnot json\n')
    assert [r["check"] for r in record.summary(record.read(file))] == ["forward"]


def test_every_exercise_and_build_it_names_its_notebook():
    """The report's notebook column: no check of the course is listed under "--"."""
    from gpt2enc_edu.course.skeletons import KERNEL_EXERCISES

    names = {f"exercise {n}" for n in exercises.EXERCISES} | set(KERNEL_EXERCISES) | set(warmups.TITLES)
    assert names <= set(record.NOTEBOOK), names - set(record.NOTEBOOK)
    assert record.NOTEBOOK["exercise 6"] == "06"
