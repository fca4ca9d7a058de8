"""How the grader turns what the learner's kernel sent back into a verdict, and the verdict into text.

Used only inside the grader process (``grader``): ``from_reply`` judges one run of ``grade_child`` (inputs
unchanged, outputs present, two runs of a deterministic kernel equal, then the exercise's own comparison);
``text`` is what the notebook prints.
"""

from __future__ import annotations

import numpy as np

from . import cudasource
from .specs import SPECS, Case
from .verdict import Verdict


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _same_bits(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool((_bits(a) == _bits(b)).all())


def _inputs_and_runs(exercise, i: int, case: Case, out: dict) -> Verdict | None:
    """A failing verdict when an input came back changed, an output is missing, or two runs differ."""
    name, spec = exercise.name, SPECS[exercise.name]
    for input_name in spec.inputs:
        after, before = out.get(f"{i}/in/{input_name}"), case.arrays[input_name]
        if after is None or not _same_bits(after, before):
            changed = "" if after is None or after.shape != before.shape else \
                f" ({int((_bits(after) != _bits(before)).sum())} of {before.size} elements)"
            return Verdict(name, False, f"your kernel changed its input {input_name}{changed}: a kernel never "
                           "writes its inputs (they are const pointers in CUDA)")
    for output in spec.outputs:
        runs = [out.get(f"{i}/{r}/{output}") for r in range(case.runs)]
        start = case.arrays[output]
        if any(r is None or r.shape != start.shape or r.dtype != start.dtype for r in runs):
            return Verdict(name, False, f"the kernel's process sent no {output} of the right shape")
        if spec.deterministic and len(runs) > 1 and not _same_bits(runs[0], runs[1]):
            verdict = exercise.compare(case, {output: runs[1]}, against={output: runs[0]})
            verdict.message = (f"two runs of your kernel on the same problem gave different bits in {output} "
                               "(a race, or an order that changes from run to run): " + verdict.message)
            return verdict
    return None


def _share(exercise, i: int, case: Case, busiest: dict) -> Verdict | None:
    """A failing verdict when one thread wrote more elements than a thread of a right kernel owns."""
    block, thread, elements, block_size = busiest.get(str(i), (-1, -1, 0, 0))
    most = SPECS[exercise.name].most_writes(case.arrays)
    if elements <= most:
        return None
    role = f"wrote {elements} elements (a thread owns {most})"
    return Verdict(exercise.name, False, f"thread {thread} of block {block} wrote {elements} elements of the outputs, "
                   f"but a thread of this kernel owns at most {most}: a kernel is the code of one thread, so let each "
                   "thread write its own elements", fault={"block": block, "block_size": block_size,
                                                           "roles": {role: [thread]}, "array": None, "elements": []})


def _judge(exercise, cases: list[Case], out: dict, busiest: dict) -> Verdict | None:
    for i, case in enumerate(cases):
        verdict = _inputs_and_runs(exercise, i, case, out)
        if verdict is None:  # not `or`: a failing Verdict is falsy
            verdict = _share(exercise, i, case, busiest)
        for r in range(case.runs if verdict is None else 0):
            verdict = exercise.compare(case, {o: out[f"{i}/{r}/{o}"] for o in SPECS[exercise.name].outputs})
            if verdict is not None:
                break
        if verdict is not None:
            verdict.case, verdict.status, verdict.description = case.label, "failed", case.description
            return verdict
    return None


def from_reply(exercise, reply: dict, cases: list[Case], out: dict, source, prepared) -> Verdict:
    """The verdict on ``grade_child``'s reply (``source``/``prepared``: the learner's CUDA, for compile errors)."""
    name, status = exercise.name, reply.get("status")
    case = cases[reply["case"]] if isinstance(reply.get("case"), int) and reply["case"] < len(cases) else None
    label, description = (case.label, case.description) if case else ("", "")
    if status == "open":
        return Verdict(name, False, "not done yet", status="not done")
    if status == "no_gpu":
        return Verdict(name, False, "no GPU", status="no GPU", detail=str(reply.get("message", "")))
    if status == "compile":
        log = cudasource.map_log(str(reply.get("message", "")), prepared, source.count("\n") + 1)
        return Verdict(name, False, "your kernel does not compile", status="failed", detail=log)
    if status == "hazard":
        return Verdict(name, False, str(reply.get("message", "")), label, status="failed",
                       fault=reply.get("picture") or {}, description=description)
    if status == "error":
        return Verdict(name, False, "your kernel raised an error", label, status="failed",
                       detail=str(reply.get("message", "")), description=description)
    if status == "timeout":
        return Verdict(name, False, "your kernel ran longer than a graded run may (an endless loop?)",
                       status="failed")
    if status != "ran":
        return Verdict(name, False, "the process running your kernel failed", status="failed",
                       detail=str(reply.get("message", ""))[-3000:])
    verdict = _judge(exercise, cases, out, reply.get("busiest") or {})
    if verdict is not None:
        return verdict
    timings = {k: float(v) for k, v in (reply.get("timings") or {}).items()}
    return Verdict(name, True, "correct", status="correct", timings=timings,
                   detail=", ".join(c.label for c in cases))


def text(exercise, verdict: Verdict, cases: list[Case]) -> str:
    """What the notebook prints for ``verdict``."""
    title = f"Build it ({verdict.form}): {exercise.title}"
    lines = [f"Your kernel printed (last lines):\n{verdict.printed}"] if verdict.printed else []
    if verdict.status == "not done":
        lines.append(f"{title}: not done yet - hint: {exercise.hint}")
    elif verdict.status == "refused":
        lines.append(f"{title}: {verdict.message}")
    elif verdict.status == "no GPU":
        lines.append(f"The CUDA form of this exercise needs a GPU ({verdict.detail}); the per-thread Python form "
                     "runs here.")
    elif verdict.passed:
        lines.append(f"{title}: correct - {len(cases)} problems drawn just now ({verdict.detail}), {exercise.how}; "
                     f"graded in a separate process ({verdict.seconds:.1f} s).")
        if verdict.timings:
            lines.append(f"Time on 8x1024x768 bf16, Zipf ids (median of 20): your kernel "
                         f"{verdict.timings['yours']:.1f} us, the package's {verdict.timings['package']:.1f} us.")
    else:
        shapes = f" ({verdict.description})" if verdict.description and verdict.description != verdict.case else ""
        where = f" on case '{verdict.case}'{shapes}" if verdict.case else ""
        lines.append(f"{title}: FAILED{where}: {verdict.message}" + (f"\n{verdict.detail}" if verdict.detail else ""))
        if verdict.first_wrong is not None:
            lines.append(f"  {verdict.describe_first_wrong()}")
    return "\n".join(lines)
