"""Cheats that must not get "correct": the graded run is a separate process that reads the kernel as text, draws
its problems from the operating system, checks the inputs and computes the expectation where no notebook reaches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpt2enc_edu
from gpt2enc_edu import mirror
from gpt2enc_edu.course import buildit, grid, perthread, pysource, wire
from gpt2enc_edu.course.grid import fadd, load128, store128, to_float, to_storage_nearest
from gpt2enc_edu.course.perthread import encoder_forward as packaged_forward
from gpt2enc_edu.layout import pack_size

CHILD = Path(grid.__file__).resolve().parent / "grade_child.py"


@pytest.fixture(autouse=True)
def _record(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2ENC_EDU_RECORD", str(tmp_path / "checks.jsonl"))


def _refused_or_failed(verdict) -> bool:
    return not verdict and verdict.status in ("refused", "failed")


# ------------------------------------------------------------------------------------------------------
# The package's own kernels, mirror and solutions are not accepted.
def calls_the_package_per_thread(cuda, out, inp, wte, wpe, B, T, C):
    perthread.encoder_forward(cuda, out, inp, wte, wpe, B, T, C)


def calls_it_under_another_name(cuda, out, inp, wte, wpe, B, T, C):
    packaged_forward(cuda, out, inp, wte, wpe, B, T, C)


def calls_the_mirror(cuda, out, inp, wte, wpe, B, T, C):
    if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
        mirror.encoder_forward(out, inp, wte, wpe, B, T, C)


def calls_the_public_api(cuda, out, inp, wte, wpe, B, T, C):
    gpt2enc_edu.encoder_forward(inp, wte, wpe)


def imports_inside_the_kernel(cuda, out, inp, wte, wpe, B, T, C):
    from gpt2enc_edu.course.perthread import encoder_forward

    encoder_forward(cuda, out, inp, wte, wpe, B, T, C)


def reads_the_checkers_frame(cuda, out, inp, wte, wpe, B, T, C):
    import sys

    frame = sys._getframe()
    while frame is not None:
        if "want" in frame.f_locals:
            out[:] = frame.f_locals["want"]["out"].reshape(-1)
        frame = frame.f_back


def reads_a_frame_through_a_traceback(cuda, out, inp, wte, wpe, B, T, C):
    try:
        raise ValueError
    except ValueError as error:
        frame = error.__traceback__.tb_frame.f_back
    out[0] = len(frame.f_locals)


def reads_the_package_from_disk(cuda, out, inp, wte, wpe, B, T, C):
    text = open("perthread.py").read()
    exec(text)


@pytest.mark.parametrize("kernel", [calls_the_package_per_thread, calls_it_under_another_name, calls_the_mirror,
                                    calls_the_public_api, imports_inside_the_kernel, reads_the_checkers_frame,
                                    reads_a_frame_through_a_traceback, reads_the_package_from_disk])
def test_the_packages_code_and_the_checkers_frames_are_out_of_reach(kernel, capsys):
    verdict = buildit.check("forward", kernel)
    assert not verdict and verdict.status == "refused", capsys.readouterr().out


def test_the_packages_per_thread_text_is_refused_even_from_a_patched_notebook():
    """The grader checks the text again: a payload the notebook built without ``collect``'s checks."""
    import inspect

    text = inspect.getsource(perthread.encoder_forward).replace("def encoder_forward(", "def mine(")
    payload = {"name": "mine", "sources": [["<cell>", 1, text, "mine", "mine"]],
               "imports": [["np", "numpy", None]], "constants": {}}
    with pytest.raises(pysource.SourceRejected, match="package's own per-thread kernel"):
        pysource.validate(payload)
    bad_import = {**payload, "sources": [["<cell>", 1, "def mine(cuda):\n    pass\n", "mine", "mine"]],
                  "imports": [["p", "gpt2enc_edu.course.perthread", None]]}
    with pytest.raises(pysource.SourceRejected, match="may use only"):
        pysource.validate(bad_import)


# ------------------------------------------------------------------------------------------------------
# Semantic cheats: inputs, recorded answers, shapes, state outside the arrays.
def writes_nothing_but_changes_its_inputs(cuda, dwte32, dwpe32, dout, inp, B, T, C):
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * pack_size(dout.dtype)
    if idx < B * T * C:
        for k in range(pack_size(dout.dtype)):
            dout[idx + k] = 0.0  # zero gradients: "nothing to add"


def zeroes_its_inputs_with_numpy(cuda, dwte32, dwpe32, dout, inp, B, T, C):
    np.copyto(dout, 0.0)


def right_only_at_the_old_shapes(cuda, out, inp, wte, wpe, B, T, C):
    """Correct where the checks used to look (T < 13, or the fixed shapes), zeros elsewhere."""
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    if idx >= B * T * C:
        return
    t, c = idx // C % T, idx % C
    total = fadd(to_float(load128(wte, int(inp[idx // C]) * C + c)), to_float(load128(wpe, t * C + c)))
    if not (T < 13 or (B, T, C) in ((1, 5, 8), (3, 4, 8), (3, 1000, 8), (2, 16, 16))):
        total = total * 0
    store128(out, idx, to_storage_nearest(total, out.dtype))


ANSWER_BITS = (0x3F80,) * 8  # "recorded" answers, replayed whatever the problem


def replays_recorded_answers(cuda, out, inp, wte, wpe, B, T, C):
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * pack_size(wte.dtype)
    if idx < B * T * C:
        store128(out, idx, np.array(ANSWER_BITS[: pack_size(wte.dtype)], dtype=np.uint16).view(out.dtype)
                 if out.dtype.itemsize == 2 else np.ones(4, np.float32))


RECORDED = np.zeros(8)


def reads_a_notebook_array(cuda, out, inp, wte, wpe, B, T, C):
    out[0] = RECORDED[0]


def keeps_state_between_threads(cuda, out, inp, wte, wpe, B, T, C):
    global RECORDED
    RECORDED = out


def patches_numpy_in_its_process(cuda, out, inp, wte, wpe, B, T, C):
    np.array_equal = lambda *args: True


def prints_a_fake_reply(cuda, out, inp, wte, wpe, B, T, C):
    print('{"status": "ran"}' * 4)


@pytest.mark.parametrize("exercise, kernel", [
    ("atomic", writes_nothing_but_changes_its_inputs), ("atomic", zeroes_its_inputs_with_numpy),
    ("forward", right_only_at_the_old_shapes), ("forward", replays_recorded_answers),
    ("forward", reads_a_notebook_array), ("forward", keeps_state_between_threads),
    ("forward", patches_numpy_in_its_process), ("forward", prints_a_fake_reply)])
def test_semantic_cheats_do_not_pass(exercise, kernel, capsys):
    verdict = buildit.check(exercise, kernel)
    out = capsys.readouterr().out
    assert _refused_or_failed(verdict), out
    if kernel is writes_nothing_but_changes_its_inputs:
        assert "wrote into dout, but it is an input" in out


def test_a_replayed_seed_is_not_accepted():
    """The check takes no generator: problems come from the operating system's randomness, in the grader."""
    with pytest.raises(TypeError):
        buildit.check("forward", right_only_at_the_old_shapes, rng=np.random.default_rng(0))


def test_patching_the_checker_and_numpy_in_the_notebook_changes_no_verdict(monkeypatch, tmp_path, capsys):
    """What the notebook's process does to itself stays there: the problems are drawn and compared in the grader."""
    from gpt2enc_edu.course import judging, verdict

    monkeypatch.setattr(buildit, "compare_case", lambda *args, **kwargs: None)
    monkeypatch.setattr(buildit.BuildIt, "compare", lambda *args, **kwargs: None)
    monkeypatch.setattr(judging, "_judge", lambda *args, **kwargs: None)
    monkeypatch.setattr(np, "array_equal", lambda *args, **kwargs: True)
    monkeypatch.setattr(verdict.Verdict, "first_wrong", property(lambda self: None))
    fixed = buildit.draw_cases("forward", np.random.default_rng(0))
    monkeypatch.setattr(buildit, "draw_cases", lambda *args, **kwargs: fixed)  # problems a kernel could know
    monkeypatch.setattr(np.random, "default_rng", lambda *args, **kwargs: np.random.Generator(np.random.PCG64(0)))
    result = buildit.check("forward", right_only_at_the_old_shapes)
    assert not result and "FAILED" in capsys.readouterr().out
    lines = [json.loads(line) for line in (tmp_path / "checks.jsonl").read_text().splitlines()]
    assert [line["status"] for line in lines] == ["failed"]  # what an instructor collects


# ------------------------------------------------------------------------------------------------------
# The process that runs the kernel, asked directly (as if every check before it had been skipped).
def _run_child(text: str, name: str) -> tuple[dict, dict]:
    x = np.random.default_rng().standard_normal((3, 5), dtype=np.float32)
    bias = np.ones(5, dtype=np.float32)
    header = {"exercise": "add_bias", "time_it": False,
              "kernel": {"name": name, "sources": [["<cell>", 1, text, name, name]],
                         "imports": [["np", "numpy", None]], "constants": {}},
              "cases": [{"label": "x", "arrays": ["bias", "out", "x"], "scalars": {}, "runs": 1,
                         "inputs": ["x", "bias"], "outputs": ["out"]}]}
    arrays = {"0/x": x, "0/bias": bias, "0/out": np.zeros_like(x)}
    done = subprocess.run([sys.executable, "-I", str(CHILD), "python"], input=wire.pack(header, arrays),
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return wire.unpack(done.stdout)


def test_the_kernels_process_cannot_import_the_package_kernels():
    text = ("def k(cuda, out, x, bias, n, C):\n"
            "    import gpt2enc_edu.course.perthread\n")
    reply, _ = _run_child(text, "k")
    assert reply["status"] == "error" and "may import only" in reply["message"]


def test_the_kernels_process_holds_no_expectation_in_any_frame():
    """Walk every frame of the process that runs the kernel: no expectation is there to find (and the package's
    mirror and per-thread kernels were never loaded)."""
    text = ("def k(cuda, out, x, bias, n, C):\n"
            "    try:\n"
            "        raise ValueError\n"
            "    except ValueError as error:\n"
            "        frame = error.__traceback__.tb_frame\n"
            "    names = set()\n"
            "    while frame is not None:\n"
            "        names |= set(frame.f_locals)\n"
            "        modules = frame.f_globals.get('sys')\n"
            "        if modules is not None:\n"
            "            names |= {m for m in modules.modules if 'mirror' in m or 'perthread' in m}\n"
            "        frame = frame.f_back\n"
            "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x\n"
            "    if i < n:\n"
            "        out[i] = float(len(names & {'want', 'expected', 'against', 'reference'}) + "
            "len([m for m in names if '.' in m]))\n")
    reply, out = _run_child(text, "k")
    assert reply["status"] == "ran" and (out["0/0/out"] == 0).all()


def one_thread_does_it_all(cuda, out, x, n):
    """Thread 0 pastes the spec: the right bits, without a shuffle."""
    if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
        v = x.reshape(-1, 32).copy()
        for offset in (16, 8, 4, 2, 1):
            received = v.copy()
            received[:, : 32 - offset] = v[:, offset:]
            v = fadd(v, received)
        out[:] = v[:, 0]


def hides_its_faults(cuda, out, inp, wte, wpe, B, T, C):
    """Catches the emulator's reports and goes on."""
    size = pack_size(wte.dtype)
    idx = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * size
    try:
        t, c = idx // C % T, idx % C
        total = fadd(to_float(load128(wte, int(inp[idx // C]) * C + c)), to_float(load128(wpe, t * C + c)))
        store128(out, idx, to_storage_nearest(total, out.dtype))
    except Exception:
        pass


def one_thread_copies_it_all_in(cuda, out, x, n):
    """The same, through a NumPy function the emulator would not see writing."""
    if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
        np.copyto(out, x.reshape(-1, 32).sum(axis=1))


def test_one_thread_doing_the_whole_job_is_not_a_kernel(capsys):
    from gpt2enc_edu.course import warmups

    verdict = warmups.check("warp_sum", one_thread_does_it_all)
    assert not verdict and "thread 0 of block 0 wrote" in capsys.readouterr().out
    verdict = warmups.check("warp_sum", one_thread_copies_it_all_in)
    assert not verdict and "with a NumPy function" in capsys.readouterr().out


def test_a_kernel_cannot_hide_a_fault_with_except(capsys):
    verdict = buildit.check("forward", hides_its_faults)
    assert not verdict and "outside the array" in capsys.readouterr().out


def _forward_reply(cases, wpe_of_run):
    """The arrays a process running a forward kernel would send back: each run's ``out`` computed from the wpe that
    ``wpe_of_run(case index, run)`` gives (what that run's kernel read), and the inputs as the last run left them."""
    out = {}
    for i, case in enumerate(cases):
        a = case.arrays
        for r in range(case.runs):
            out[f"{i}/{r}/out"] = gpt2enc_edu.encoder_forward(a["inp"], a["wte"], wpe_of_run(i, r))
        out.update({f"{i}/in/{name}": a[name] for name in ("inp", "wte")})
        out[f"{i}/in/wpe"] = wpe_of_run(i, case.runs - 1)
    return out


def test_the_judge_fails_a_kernel_whose_inputs_came_back_changed(rng):
    """A failing step of the judge ends the judging (a failing Verdict is falsy: no `or` may skip past it)."""
    from gpt2enc_edu.course import judging

    exercise = buildit.BuildIt("forward")
    cases = exercise.cases(rng, gpu=True)

    def zeroed(i, r):
        wpe = cases[i].arrays["wpe"].copy()
        wpe.reshape(-1)[0] = 0
        return wpe

    verdict = judging.from_reply(exercise, {"status": "ran"}, cases, _forward_reply(cases, zeroed), "", None)
    assert not verdict and "changed its input wpe (1 of" in verdict.message and verdict.case == cases[0].label

    def second_run_differs(i, r):
        wpe = cases[i].arrays["wpe"].copy()
        if r == 1:
            wpe.reshape(-1)[0] = 0
        return wpe

    reply = _forward_reply(cases, second_run_differs)
    reply.update({f"{i}/in/wpe": case.arrays["wpe"] for i, case in enumerate(cases)})  # inputs unchanged
    verdict = judging.from_reply(exercise, {"status": "ran"}, cases, reply, "", None)
    assert not verdict and verdict.message.startswith("two runs of your kernel on the same problem gave different bits")
    right = judging.from_reply(exercise, {"status": "ran"}, cases,
                               _forward_reply(cases, lambda i, r: cases[i].arrays["wpe"]), "", None)
    assert right and right.message == "correct"
