// encoder_backward_wpe.cu: the deterministic position-embedding backward, dwpe[t,:] += sum_b dout[b,t,:].
//
// Two forms with the same arguments, the same owners and sums, so the same bits:
//   encoder_backward_wpe_kernel            each thread loads its rows into registers, WPE_UNROLL at a time
//   encoder_backward_wpe_pipelined_kernel  each thread streams its rows through its own shared-memory slots with
//                                          cp.async, WPE_PIPELINE_STAGES copies in flight from one pack into the next
//
// Launch: 1-D grid, one thread per 128-bit pack of dwpe's first T rows:
//   grid = CEIL_DIV(T*C / x128::size, block), kernel(dwpe, dout, B, T, C, seed)
// or any smaller grid: thread i then takes packs i, i + (the grid's threads), ... in turn. Any block size (a
// multiple of WARP_SIZE for the pipelined form, which takes WPE_PIPELINE_STAGES * block * 16 bytes of dynamic shared
// memory). The package launches the full grid, except beside the scatter route's bucket table built in the same
// call: there the kernel gets 3/8 of the SMs, a block each, so that the table's kernels (blocks of 1024 threads,
// which do not fit on an SM beside one of this kernel's) find SMs at once (gpt2enc_edu/layout.py,
// WPE_SM_SHARE_BESIDE_TABLE), and for small batches it takes the pipelined form there (gpt2enc_edu/cuda.py, wpe_form).
// Requires C % x128::size == 0, B*T*C < 2^31 and 16-byte aligned arrays (checked in Python).
//
// Why it is deterministic: each dwpe element has exactly one owner thread (whatever the grid), which adds the B
// gradients in the fixed order b = 0, 1, ..., B-1 in fp32, then adds the old value and rounds once (read-modify-write,
// so gradient accumulation over several calls keeps working). No atomics, no order that depends on timing.
#include "common.cuh"

#define WPE_UNROLL 8

extern "C" __global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C,
                                                       unsigned int seed) {
    // Thread i owns pack i, then pack i + the grid's thread count, ...: a grid with fewer threads than packs walks
    // the rest in turn (the package launches such a grid beside the bucket table, see the header). Counted in
    // packs, so that no index passes 2^31.
    int packs = T * C / x128::size;
    for (int pack = blockIdx.x * blockDim.x + threadIdx.x; pack < packs; pack += gridDim.x * blockDim.x) {
        int idx = pack * x128::size;
        int t = idx / C;
        int c = idx % C;

        float accum[x128::size];
        for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }

        // Batches in order 0, 1, ..., B-1. WPE_UNROLL loads are issued before they are added (in the same order),
        // so several 128-bit loads are in flight per thread instead of one.
        int b = 0;
        for (; b + WPE_UNROLL <= B; b += WPE_UNROLL) {
            x128 packed_dout[WPE_UNROLL];
#pragma unroll
            for (int u = 0; u < WPE_UNROLL; u++) {
                // Consecutive threads read consecutive packs of one (b, t) row: coalesced, and never read again.
                packed_dout[u] = load128cs(dout + (b + u) * T * C + t * C + c);
            }
#pragma unroll
            for (int u = 0; u < WPE_UNROLL; u++) {
                for (int k = 0; k < x128::size; k++) { accum[k] += (float)packed_dout[u][k]; }
            }
        }
        for (; b < B; b++) {
            x128 packed_dout = load128cs(dout + b * T * C + t * C + c);
            for (int k = 0; k < x128::size; k++) { accum[k] += (float)packed_dout[k]; }
        }

        floatX* dwpe_tc = dwpe + t * C + c;
        // The noise position is the element's flat index in dwpe (t*C + c + k): one random number per element.
        store_rounded_sum128(dwpe_tc, load128(dwpe_tc), accum, (unsigned int)idx, NOISE_STREAM_DWPE, seed);
    }
}

// The pipelined form. On the narrow grid beside the table each thread walks several packs, and the form above
// waits for a pack's last rows, then rounds and stores, before it asks for the next pack's first rows. Here a
// thread's walk is one list of jobs (job j: its pack j / B, row b = j % B), and WPE_PIPELINE_STAGES of them are in
// flight at any time, across the end of one pack and the start of the next. The copies go to shared memory, so
// they hold no registers (below sm_80, where the package does not take this form, they go through a register,
// copy16_to_shared). A thread reads only the slots it filled itself: no block barrier.
extern "C" __global__ void encoder_backward_wpe_pipelined_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C,
                                                                 unsigned int seed) {
    extern __shared__ __align__(16) unsigned char wpe_stages[];
    x128* slots = reinterpret_cast<x128*>(wpe_stages) + threadIdx.x;  // slot s of this thread: slots[s * blockDim.x]
    int packs = T * C / x128::size;
    int stride = gridDim.x * blockDim.x;
    int first = blockIdx.x * blockDim.x + threadIdx.x;
    // Every lane of a warp walks as many jobs as its lane 0 (the most), so that all of them reach every __syncwarp
    // below; a lane whose pack is past the end only counts along.
    int warp_first = first - threadIdx.x % WARP_SIZE;
    int jobs = warp_first < packs ? CEIL_DIV(packs - warp_first, stride) * B : 0;
    // Ask for job j's row, and close a group of copies even where there is none (past the end, or no job), so that
    // "all but WPE_PIPELINE_STAGES - 1 groups have landed" always means "job j has landed".
    auto ask = [&](int j) {
        int pack = first + (j / B) * stride;
        if (j < jobs && pack < packs) {
            copy16_to_shared(slots + (j % WPE_PIPELINE_STAGES) * blockDim.x,
                             dout + (j % B) * T * C + pack * x128::size);
        }
        commit_async_copies();
    };
    for (int j = 0; j < WPE_PIPELINE_STAGES; j++) { ask(j); }

    float accum[x128::size];
    for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }
    for (int j = 0; j < jobs; j++) {
        int pack = first + (j / B) * stride;
        wait_async_copies_but<WPE_PIPELINE_STAGES - 1>();  // job j has landed
        if (pack < packs) {
            x128 packed_dout = slots[(j % WPE_PIPELINE_STAGES) * blockDim.x];
            for (int k = 0; k < x128::size; k++) { accum[k] += (float)packed_dout[k]; }  // b in order 0, 1, ...
        }
        // A copy is not ordered with this thread's own shared-memory reads: the read above must be complete before
        // the copy asked for next overwrites its slot.
        __syncwarp();
        ask(j + WPE_PIPELINE_STAGES);
        if (j % B == B - 1) {  // the pack's last row: the old value, one rounding, as in the form above
            if (pack < packs) {
                int idx = pack * x128::size;
                store_rounded_sum128(dwpe + idx, load128(dwpe + idx), accum, (unsigned int)idx, NOISE_STREAM_DWPE,
                                     seed);
            }
            for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }
        }
    }
}
