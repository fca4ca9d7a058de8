"""Kernel files with their bodies cut out: the starting point of the CUDA build-it exercises.

``skeleton(exercise)`` reads the real file from ``kernels/`` at run time (``loader.kernel_source``) and
replaces the body of the exercise's kernel with a marked gap (``GAP_MARK``); every other kernel of the file
gets an empty body, and so does every ``void`` device function of the file that the exercise's kernel does not
call (the body of another kernel may live in one), so the file still compiles and gives nothing away. The header
comment, the includes, the ``#define``s and the kernel's signature stay exactly as the package compiles them. No
kernel file needs markers: the body is found by matching the braces after the kernel's name.

``cudasource.fill(exercise, body)`` puts the learner's body into the gap and returns the whole source, ready
for ``loader.compile_source``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..loader import kernel_source

#: The line that marks the gap; a source that still holds it is an open exercise.
GAP_MARK = "// ===== YOUR CODE HERE ====="


@dataclass(frozen=True)
class KernelExercise:
    """Which kernel of which file the learner writes, and the notes printed inside the gap."""

    file: str
    kernel: str
    notes: tuple[str, ...]


KERNEL_EXERCISES = {
    "forward": KernelExercise("encoder_forward.cu", "encoder_forward_v2_kernel", (
        "one thread per 128-bit pack (x128::size elements) of out; threads past the end do nothing",
        "find (b, t, c) of the pack from the thread's flat index, then the token id ix = inp[b*T + t]",
        "load the wte and wpe packs (load128cs / load128), add in float, round into floatX, store128",
    )),
    "atomic": KernelExercise("encoder_backward_atomic.cu", "encoder_backward_atomic_fp32_kernel", (
        "one thread per 128-bit pack of dout, the same thread map as the forward",
        "add each of the pack's elements (as float) into dwte32[ix, c + k] and dwpe32[t, c + k]",
        "many threads add into one element: only atomicAdd makes that safe",
    )),
    "wpe": KernelExercise("encoder_backward_wpe.cu", "encoder_backward_wpe_kernel", (
        "one thread per 128-bit pack of the first T rows of dwpe (the check launches a thread for every pack; the",
        "package's kernel also walks more packs per thread, for smaller grids: not needed here)",
        "sum dout[b, t, c .. c+k] in float over b = 0, 1, ..., B-1, in that order",
        "add the old dwpe value last, then round_to_storage(value, &target, element, NOISE_STREAM_DWPE, seed)",
        "with element = the flat index of that element in dwpe",
    )),
    "wte_bucketed": KernelExercise("encoder_backward_wte_bucketed.cu", "encoder_backward_wte_bucketed_kernel", (
        "one block of WTE_BLOCK_SIZE threads per bucket; blocks at or past *num_buckets do nothing",
        "bucket_info[bucket] = {start, size, ix, c_group}",
        "lane l of every warp owns x128::size channels from c_group * WARP_SIZE * x128::size + l * x128::size",
        "warp w sums the items w, w + WTE_WARPS, ... of the bucket, in that order; lanes past C sum nothing",
        "warps 1.. hand their sums to warp 0 through __shared__ memory; every thread of the block reaches one",
        "__syncthreads (simpler than the named barrier the file's header describes, and as correct)",
        "warp 0 adds the busy warps 1, 2, ... in order, then the old dwte value, and rounds",
        "(round_to_storage with NOISE_STREAM_DWTE and element = the flat index in dwte)",
    )),
}


#: The start of a kernel's definition, and of a ``void`` device function's, up to the name.
_KERNEL_START = r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?"
_DEVICE_VOID_START = r"__device__\s+(?:__forceinline__\s+)?void\s+"


def _body_span(source: str, kernel: str, start: str = _KERNEL_START) -> tuple[int, int]:
    """Offsets of the ``{`` and the matching ``}`` of ``kernel``'s body in ``source`` (``start``: what comes before
    the name; a device function's for ``_DEVICE_VOID_START``)."""
    match = re.search(rf"{start}{re.escape(kernel)}\s*\(", source)
    if match is None:
        raise ValueError(f"kernel {kernel} not found")
    depth, i = 0, match.end() - 1
    while True:  # skip the parameter list
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        i += 1
        if depth == 0:
            break
    open_brace = source.index("{", i)
    depth, i = 0, open_brace
    while True:
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return open_brace, i
        i += 1


def _kernels_in(source: str) -> list[str]:
    return re.findall(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(', source)


def skeleton(exercise: str) -> str:
    """The exercise's kernel file with the kernel body replaced by the gap (and other kernels emptied, with the
    device functions only they call)."""
    spec = KERNEL_EXERCISES[exercise]
    source = kernel_source(spec.file)
    start, end = _body_span(source, spec.kernel)
    called = set(re.findall(r"\b(\w+)\s*(?:<[^<>()]*>)?\s*\(", source[start:end]))
    for name in re.findall(rf"{_DEVICE_VOID_START}(\w+)\s*\(", source):
        if name not in called:
            start, end = _body_span(source, name, _DEVICE_VOID_START)
            source = source[:start] + "{ /* not part of this exercise */ }" + source[end + 1 :]
    for name in _kernels_in(source):
        start, end = _body_span(source, name)
        if name == spec.kernel:
            notes = "".join(f"    // - {note}\n" for note in spec.notes)
            body = f"{{\n    {GAP_MARK}\n{notes}}}"
        else:
            body = "{ /* not part of this exercise */ }"
        source = source[:start] + body + source[end + 1 :]
    return source


def gap_offset(exercise: str, body: str) -> tuple[int, str]:
    """``(lines, source)``: ``body`` put verbatim in place of the gap's marker line and notes (its line 1 is
    line ``lines + 1`` of ``source``, so compiler messages can be mapped back to the learner's lines)."""
    gap = skeleton(exercise)
    start = gap.rindex("\n", 0, gap.index(GAP_MARK)) + 1  # the start of the marker's line
    end = gap.index("\n}", start) + 1  # the kernel's closing brace (the notes may hold braces too)
    return gap[:start].count("\n"), gap[:start] + body.rstrip() + "\n" + gap[end:]
