"""The per-thread emulator keeps the CUDA semantics the encoder kernels rely on, and reports their misuse."""

from __future__ import annotations

import numpy as np
import pytest

from gpt2enc_edu.course import grid


def test_blocks_and_threads_see_their_indices():
    seen = np.full(3 * 5, -1)

    def kernel(cuda, out):
        out[cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x] = cuda.gridDim.x * 100 + cuda.blockIdx.x

    grid.launch(kernel, 3, 5, (seen,))
    assert seen.tolist() == [300 + b for b in range(3) for _ in range(5)]


def test_a_two_dimensional_grid_and_the_unused_coordinates():
    seen = np.full((2, 3), -1)

    def kernel(cuda, out):
        assert (cuda.threadIdx.y, cuda.blockDim.y, cuda.blockIdx.z, cuda.gridDim.z) == (0, 1, 0, 1)
        if cuda.threadIdx.x == 0:
            out[cuda.blockIdx.y * cuda.gridDim.x + cuda.blockIdx.x] = cuda.blockIdx.y * 10 + cuda.gridDim.y

    grid.launch(kernel, (3, 2), 4, (seen.reshape(-1),))
    assert seen.tolist() == [[2, 2, 2], [12, 12, 12]]

    def one_dimensional(cuda, out):
        out[cuda.blockIdx.x] = cuda.blockIdx.y * 10 + cuda.gridDim.y  # y: index 0, size 1, as in CUDA

    flat = np.full(3, -1)
    grid.launch(one_dimensional, 3, 1, (flat,))
    assert flat.tolist() == [1, 1, 1]
    with pytest.raises(grid.KernelFault, match="invalid launch"):
        grid.launch(one_dimensional, (3, 0), 1, (flat,))


def test_shared_memory_is_per_block_and_the_barrier_orders_it():
    out = np.zeros(2 * 64, dtype=np.float32)

    def kernel(cuda, out):
        tile = cuda.shared_array("tile", 64, np.float32)
        tile[cuda.threadIdx.x] = cuda.blockIdx.x * 1000 + cuda.threadIdx.x
        yield cuda.syncthreads()
        out[cuda.blockIdx.x * 64 + cuda.threadIdx.x] = tile[63 - cuda.threadIdx.x]  # another thread's write

    for _ in range(3):
        grid.launch(kernel, 2, 64, (out,))
        assert out.tolist() == [b * 1000 + 63 - t for b in range(2) for t in range(64)]


def test_reading_another_threads_write_without_a_barrier_is_a_race_naming_both_threads():
    out = np.zeros(64, dtype=np.float32)

    def racy(cuda, out):
        tile = cuda.shared_array("tile", 64, np.float32)
        tile[cuda.threadIdx.x] = cuda.threadIdx.x
        out[cuda.threadIdx.x] = tile[63 - cuda.threadIdx.x]  # no barrier between the write and the read

    for _ in range(5):  # whichever thread runs first, the pair is reported
        with pytest.raises(grid.RaceHazard, match=r"race on shared memory tile\[\d+\]: thread \d+ of block 0 "
                           r"(wrote|read) it, and thread \d+ of the same block (read|wrote) it") as caught:
            grid.launch(racy, 1, 64, (out,))
        assert caught.value.picture["array"] == "tile" and len(caught.value.picture["roles"]) == 2


def test_the_last_warp_combining_without_a_barrier_is_a_race():
    """Every warp leaves its partial in shared memory; warp 7 adds them with no barrier before it reads."""
    def last_warp_combines(cuda, out):
        partial = cuda.shared_array("partial", 8, np.float32)
        warp, lane = divmod(cuda.threadIdx.x, 32)
        if lane == 0:
            partial[warp] = warp + 1.0
        if cuda.threadIdx.x == 255:
            out[0] = sum(partial[w] for w in range(8))

    for _ in range(5):
        with pytest.raises(grid.RaceHazard, match="partial"):
            grid.launch(last_warp_combines, 1, 256, (np.zeros(1, dtype=np.float32),))


def test_threads_and_blocks_run_in_an_order_that_changes():
    """Plain-function threads, too: the order of first writes into a log differs from launch to launch."""
    orders = set()
    for _ in range(6):
        seen = []

        def log(cuda, out):
            seen.append((cuda.blockIdx.x, cuda.threadIdx.x))

        grid.launch(log, 3, 8, (np.zeros(1),))
        orders.add(tuple(seen))
        assert sorted(seen) == [(b, t) for b in range(3) for t in range(8)]
    assert len(orders) > 1


def test_two_blocks_writing_one_element_race_whatever_the_barriers():
    def both_blocks(cuda, out):
        if cuda.threadIdx.x == 0:
            out[0] = cuda.blockIdx.x
        yield cuda.syncthreads()

    with pytest.raises(grid.RaceHazard, match=r"of block \d \(another block: no barrier orders them\)"):
        grid.launch(both_blocks, 2, 32, (np.zeros(1),))


def test_a_barrier_in_each_branch_is_a_divergent_barrier():
    def divergent(cuda, out):
        if cuda.threadIdx.x < 32:
            out[cuda.threadIdx.x] = 1
            yield cuda.syncthreads()
        else:
            yield cuda.syncthreads()
            out[cuda.threadIdx.x] = 2

    with pytest.raises(grid.BarrierHazard, match=r"different __syncthreads\(\) \(threads 0-31 at line \d+ of "
                       r"divergent; threads 32-63 at line \d+ of divergent\)") as caught:
        grid.launch(divergent, 1, 64, (np.zeros(64),))
    assert sorted(len(t) for t in caught.value.picture["roles"].values()) == [32, 32]


def test_writing_an_input_names_the_thread_and_the_array():
    def writes_input(cuda, out, x):
        x[cuda.threadIdx.x] = 0.0
        out[cuda.threadIdx.x] = 1.0

    x = np.ones(4, dtype=np.float32)
    with pytest.raises(grid.KernelFault, match=r"thread \d of block 0: wrote into x, but it is an input"):
        grid.launch(writes_input, 1, 4, (np.zeros(4), x), writes={"out"})
    assert (x == 1).all()

    def numpy_write(cuda, out, x):
        np.copyto(x, 0.0)  # not through indexing: NumPy itself refuses the immutable copy

    with pytest.raises(grid.KernelFault, match="wrote into a kernel's array with a NumPy function"):
        grid.launch(numpy_write, 1, 1, (np.zeros(4), x), writes={"out"})

    def flag_flip(cuda, out, x):
        x.flags.writeable = True

    with pytest.raises(ValueError, match="WRITEABLE"):
        grid.launch(flag_flip, 1, 1, (np.zeros(4), x), writes={"out"})


def test_outputs_are_written_element_by_element_where_the_emulator_sees_it():
    """NumPy's in-place writers would hide who wrote what (one thread filling the whole output, say)."""
    def one_thread_fills(cuda, out, x):
        if cuda.threadIdx.x == 0:
            np.copyto(out, x)

    def through_a_ufunc(cuda, out, x):
        np.add(x, 1.0, out=out)

    out, x = np.zeros(4), np.ones(4)
    with pytest.raises(grid.KernelFault, match="with a NumPy function"):
        grid.launch(one_thread_fills, 1, 4, (out, x), writes={"out"})
    with pytest.raises(grid.KernelFault, match="NumPy functions that write in place are refused"):
        grid.launch(through_a_ufunc, 1, 4, (out, x), writes={"out"})
    assert (out == 0).all()


def test_atomics_only_arrays_refuse_plain_writes_even_after_a_flag_flip():
    def flips_then_adds(cuda, total):
        try:
            total.flags.writeable = True
        except ValueError:
            pass
        total[0] += 1.0

    with pytest.raises(grid.KernelFault, match="only cuda.atomic_add may change it"):
        grid.launch(flips_then_adds, 1, 4, (grid.read_only(np.zeros(1, dtype=np.float32)),))


def test_an_index_past_either_end_names_the_thread_the_array_and_the_index():
    def off_by_one(cuda, out, x):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        out[i] = x[i + 1]  # the last thread reads one past the end

    with pytest.raises(grid.KernelFault, match=r"thread 7 of block 1: read x\[16\], outside the array \(16 "
                       r"elements\)") as caught:
        grid.launch(off_by_one, 2, 8, (np.zeros(16), np.ones(16)), writes={"out"})
    assert caught.value.picture["roles"] == {"read x[16]": [7]} and caught.value.picture["elements"] == [16]

    def negative(cuda, out, x):
        out[cuda.threadIdx.x] = x[cuda.threadIdx.x - 1]  # thread 0 reads x[-1]: before the array on a GPU

    with pytest.raises(grid.KernelFault, match=r"thread 0 of block 0: read x\[-1\]"):
        grid.launch(negative, 1, 4, (np.zeros(4), np.ones(4)), writes={"out"})


def test_a_float_index_says_to_divide_with_two_slashes():
    def halves(cuda, out, x):
        out[cuda.threadIdx.x] = x[cuda.threadIdx.x / 2]

    with pytest.raises(grid.KernelFault, match=r"thread \d of block 0: read x\[\d\.\d\], an index that is not an "
                       "integer"):
        grid.launch(halves, 1, 4, (np.zeros(4), np.ones(4)), writes={"out"})


def test_a_misaligned_pack_names_the_array():
    def misaligned(cuda, out, x):
        out[cuda.threadIdx.x] = grid.load128(x, 2)[0]

    with pytest.raises(grid.KernelFault, match=r"thread \d of block 0: load128 of x at element 2, not a multiple "
                       r"of 4 \(misaligned"):
        grid.launch(misaligned, 1, 2, (np.zeros(2, dtype=np.float32), np.ones(8, dtype=np.float32)),
                    writes={"out"})


def test_a_thread_that_returns_before_the_barrier_is_a_hazard():
    def early_exit(cuda, out):
        if cuda.threadIdx.x >= 40:
            return  # the bug the bucketed kernel avoids: these threads never reach the barrier
        yield cuda.syncthreads()
        out[cuda.threadIdx.x] = 1

    with pytest.raises(grid.BarrierHazard, match=r"threads 0-39 wait at __syncthreads, but threads 40-63 returned"):
        grid.launch(early_exit, 1, 64, (np.zeros(64),))


def test_a_whole_block_may_leave_together():
    def uniform_exit(cuda, out):
        if cuda.blockIdx.x == 1:
            return
        yield cuda.syncthreads()
        out[cuda.threadIdx.x] += 1

    out = np.zeros(32)
    grid.launch(uniform_exit, 2, 32, (out,))
    assert out.tolist() == [1] * 32


def test_syncthreads_without_yield_is_reported():
    def forgot_yield(cuda, out):
        cuda.syncthreads()
        out[cuda.threadIdx.x] = 1

    with pytest.raises(grid.KernelFault, match="yield"):
        grid.launch(forgot_yield, 1, 4, (np.zeros(4),))


def test_shuffles_exchange_within_each_warp():
    out = np.zeros(64, dtype=np.int64)

    def rotate(cuda, out):
        lane = cuda.threadIdx.x % 32
        value = yield cuda.shfl_sync(cuda.threadIdx.x * 10, lane + 1)
        out[cuda.threadIdx.x] = value

    grid.launch(rotate, 1, 64, (out,))
    assert out.tolist() == [10 * (w * 32 + (lane + 1) % 32) for w in range(2) for lane in range(32)]


def test_a_lane_missing_from_a_shuffle_is_a_hazard():
    def partial(cuda, out):
        if cuda.threadIdx.x % 32 == 5:
            return
        out[cuda.threadIdx.x] = yield cuda.shfl_sync(1, 0)

    with pytest.raises(grid.BarrierHazard, match="__shfl_sync"):
        grid.launch(partial, 1, 32, (np.zeros(32),))


def test_a_ballot_gives_every_lane_of_its_warp_the_same_mask():
    out = np.zeros(64, dtype=np.int64)
    rng = np.random.default_rng(4)
    votes = rng.random(64) < 0.5

    def vote(cuda, out):
        out[cuda.threadIdx.x] = yield cuda.ballot_sync(votes[cuda.threadIdx.x])

    grid.launch(vote, 1, 64, (out,))
    for w in range(2):
        want = sum(1 << lane for lane in range(32) if votes[w * 32 + lane])
        assert out[w * 32 : (w + 1) * 32].tolist() == [want] * 32


def test_a_warp_split_between_a_ballot_and_a_shuffle_is_a_hazard():
    def split(cuda, out):
        if cuda.threadIdx.x % 32 == 7:
            out[cuda.threadIdx.x] = yield cuda.shfl_sync(1, 0)
        else:
            out[cuda.threadIdx.x] = yield cuda.ballot_sync(True)

    with pytest.raises(grid.BarrierHazard, match="another warp operation"):
        grid.launch(split, 1, 32, (np.zeros(32),))


def test_atomic_adds_land_in_an_order_that_changes_between_launches():
    values = np.float32([1.0, 2.0**-24, -1.0, 2.0**-24, 3.0, -3.0] * 20)

    def adder(cuda, total, values):
        cuda.atomic_add(total, 0, values[cuda.threadIdx.x])

    results = set()
    for _ in range(20):
        total = np.zeros(1, dtype=np.float32)
        grid.launch(adder, 1, values.size, (grid.read_only(total), values))
        results.add(float(total[0]))
    assert len(results) > 1  # fp32 addition is not associative, and the order moved


def test_plain_writes_into_an_atomics_only_array_are_reported():
    def not_atomic(cuda, total):
        total[0] += 1.0

    with pytest.raises(grid.KernelFault, match="atomic_add"):
        grid.launch(not_atomic, 1, 4, (grid.read_only(np.zeros(1, dtype=np.float32)),))


def test_shuffle_down_takes_the_lane_below_or_keeps_its_own():
    out = np.zeros(32, dtype=np.int64)

    def down(cuda, out):
        out[cuda.threadIdx.x] = yield cuda.shfl_down_sync(cuda.threadIdx.x, 4)

    grid.launch(down, 1, 32, (out,))
    assert out.tolist() == [lane + 4 if lane < 28 else lane for lane in range(32)]


def test_loads_and_stores_past_the_end_or_misaligned_are_faults():
    a = np.zeros(16, dtype=np.float32)
    with pytest.raises(grid.KernelFault, match="elements 16..19"):
        grid.load128(a, 16)
    with pytest.raises(grid.KernelFault, match="misaligned"):
        grid.store128(a, 2, np.zeros(4, dtype=np.float32))
    with pytest.raises(grid.KernelFault, match="misaligned"):  # misaligned and past the end: misaligned
        grid.load128(a, 14)
    with pytest.raises(grid.KernelFault):
        grid.launch(lambda cuda: None, 1, 2048, ())
