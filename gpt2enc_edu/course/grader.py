"""The grader: a process of its own that draws the problems, runs the learner's kernel in a third process,
computes the expectation, compares, records the verdict and sends it back to the notebook.

``grading`` (in the notebook) starts it as ``python -I <this file> <site folders>`` (the folders the notebook's
Python found NumPy, ml_dtypes and CuPy in, which ``-I`` would drop) and sends it one request: the exercise's
name, the form, and the kernel as text (``pysource.collect``'s payload, or CUDA source). Here, in order:

1. the text is checked again (``pysource.validate``, ``cudasource.prepare``): the notebook's process could
   have been patched to skip its own checks, this one cannot;
2. the problems are drawn from a generator seeded by ``os.urandom``, with shapes no one can know before;
   outputs are poisoned, gradients hold random old values;
3. ``grade_child`` runs the kernel in a separate, isolated process (started ahead of the request; a
   deterministic kernel runs twice per problem on the GPU, and on the first two problems on the CPU) and
   sends back every output and every input as it held them after the runs;
4. after that process has ended: every input must come back bit for bit unchanged, the two runs of a
   deterministic kernel must agree bit for bit, and the outputs are compared with the expectation, computed
   only now and only here (the mirror's bits; the documented error bound for the atomic kernel);
5. the verdict is added to the record (``record``) and sent back: its fields, its arrays and the text the
   notebook prints.

The notebook's process never computes a verdict, so patching NumPy or the checker there, reading stack frames
or recording answers for a seed changes nothing this process decides or records. docs/teaching.md ("How the
graded checks work") says what no check on the learner's own machine can defend against.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

_CHILD = Path(__file__).resolve().parent / "grade_child.py"
_VERDICT_ARRAYS = ("expected", "actual", "wrong", "block", "thread")
_VERDICT_FIELDS = ("exercise", "passed", "message", "case", "tensor", "row_names", "timings", "status", "detail",
                   "fault", "description", "form", "seconds", "printed")


def _start_child(mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-I", str(_CHILD), mode, *sys.argv[1:]], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(_CHILD.parent),
                            env={**os.environ, "GPT2ENC_EDU_GRADING": "1"})


def _run_child(child, form: str, header: dict, arrays: dict):
    """(reply header, reply arrays, what the kernel printed) of the process running the learner's kernel."""
    from gpt2enc_edu.course import wire

    try:
        stdout, stderr = child.communicate(wire.pack(header, arrays), timeout=wire.TIMEOUT_S[form])
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return {"status": "timeout"}, {}, ""
    printed = stderr.decode(errors="replace")
    if child.returncode != 0 or not stdout:
        return {"status": "crashed", "message": printed[-3000:]}, {}, ""
    try:
        reply, out = wire.unpack(stdout)
    except ValueError as exc:
        return {"status": "crashed", "message": str(exc)}, {}, ""
    return reply, out, printed


def _child_request(name: str, payload, cases: list, time_it: bool) -> tuple[dict, dict]:
    from gpt2enc_edu.course.specs import SPECS

    spec = SPECS[name]
    header = {"exercise": name, "time_it": time_it, "cases": [],
              "kernel": payload if isinstance(payload, dict) else {"sources": []}}
    if not isinstance(payload, dict):
        header["source"] = payload
    arrays = {}
    for i, case in enumerate(cases):
        header["cases"].append({"label": case.label, "arrays": sorted(case.arrays), "scalars": case.scalars,
                                "runs": case.runs, "inputs": list(spec.inputs), "outputs": list(spec.outputs)})
        arrays.update({f"{i}/{n}": a for n, a in case.arrays.items()})
    return header, arrays


def _exercise(name: str):
    from gpt2enc_edu.course import buildit, warmups

    if name in warmups.TITLES:
        return warmups.Warmup(name)
    if name in buildit.TITLES:
        return buildit.BuildIt(name)
    raise ValueError(f"no exercise {name!r}")


def judge(request: dict, child) -> tuple:
    """The verdict on one request (see the module docstring) and the cases it drew."""
    from gpt2enc_edu.course import cudasource, pysource
    from gpt2enc_edu.course.judging import from_reply
    from gpt2enc_edu.course.specs import fresh_rng
    from gpt2enc_edu.course.verdict import Verdict

    exercise, form = _exercise(request["exercise"]), request["form"]
    cuda = form == "CUDA"
    try:
        if cuda and not exercise.has_cuda:
            raise pysource.SourceRejected(f"{exercise.title} has no CUDA form: write it in per-thread Python")
        prepared = cudasource.prepare(exercise.name, request["payload"]) if cuda else \
            pysource.validate(request["payload"])
    except pysource.SourceRejected as exc:
        return Verdict(exercise.name, False, f"refused: {exc}", status="refused"), exercise, []
    start = time.perf_counter()
    cases = exercise.cases(fresh_rng(), gpu=cuda)
    if cuda:
        child.kill()
        child = _start_child("cuda")
    header, arrays = _child_request(exercise.name, prepared.source if cuda else prepared, cases,
                                    bool(request.get("time_it")) and cuda)
    reply, out, printed = _run_child(child, form, header, arrays)
    verdict = from_reply(exercise, reply, cases, out, request["payload"], prepared if cuda else None)
    verdict.seconds = time.perf_counter() - start
    if printed.strip():
        verdict.printed = printed[-1500:]
    return verdict, exercise, cases


def _reply(verdict, text: str) -> tuple[dict, dict]:
    fields = {name: getattr(verdict, name) for name in _VERDICT_FIELDS}
    arrays = {name: getattr(verdict, name) for name in _VERDICT_ARRAYS if getattr(verdict, name) is not None}
    return {"verdict": fields, "text": text}, arrays


def main() -> None:
    result = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.path.extend(folder for folder in sys.argv[1:] if folder not in sys.path)  # grading.site_dirs()
    child = _start_child("python")  # ready for a per-thread Python kernel by the time the request comes
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gpt2enc_edu.course import buildit, judging, record, warmups, wire  # noqa: F401 (imported ahead)

    request = sys.stdin.buffer.read()
    if not request:  # started ahead, and the notebook ended before it was needed
        child.kill()
        return
    header, _ = wire.unpack(request)
    verdict, exercise, cases = judge(header, child)
    verdict.form = header["form"]
    text = judging.text(exercise, verdict, cases)
    record.add(exercise.name, verdict.form, verdict, file=header.get("record"))
    result.write(wire.pack(*_reply(verdict, text)))
    result.flush()


if __name__ == "__main__":
    main()
