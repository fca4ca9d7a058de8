"""Worked solutions to the warm-up build-its of notebook 00 (try them first!).

Hand one to its check::

    from gpt2enc_edu.course import warmups
    import solutions.warmups as solutions  # from the repository root
    warmups.check_add_bias(solutions.add_bias)
"""

from __future__ import annotations

from gpt2enc_edu.course.grid import fadd


def add_bias(cuda, out, x, bias, n, C):
    """Warm-up 1: thread i owns element i; the grid rounds up to whole blocks, so threads past n do nothing."""
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i >= n:
        return
    out[i] = fadd(x[i], bias[i % C])


def warp_sum(cuda, out, x, n):
    """Warm-up 2: lane l holds x[32 * warp + l]; five shuffles down halve the live values, lane 0 ends with the
    sum. A warp past the end leaves as a whole (no lane of it reaches a shuffle)."""
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    warp, lane = i // 32, i % 32
    if warp >= n // 32:
        return
    value = x[i]
    for offset in (16, 8, 4, 2, 1):
        value = fadd(value, (yield cuda.shfl_down_sync(value, offset)))
    if lane == 0:
        out[warp] = value


def block_sum(cuda, out, x, n):
    """Warm-up 3: each warp sums its 32 values as in warm-up 2; lane 0 of each warp hands its sum to thread 0
    through shared memory, and the barrier between the writes and the reads is what makes that safe."""
    sums = cuda.shared_array("sums", 4, "float32")
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    warp, lane = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
    value = x[i]
    for offset in (16, 8, 4, 2, 1):
        value = fadd(value, (yield cuda.shfl_down_sync(value, offset)))
    if lane == 0:
        sums[warp] = value
    yield cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        total = sums[0]
        for w in range(1, 4):
            total = fadd(total, sums[w])
        out[cuda.blockIdx.x] = total
