// encoder_backward_wpe.cu: the deterministic position-embedding backward, dwpe[t,:] += sum_b dout[b,t,:].
//
// Launch: 1-D grid, one thread per 128-bit pack of dwpe's first T rows:
//   grid = CEIL_DIV(T*C / x128::size, block), kernel(dwpe, dout, B, T, C, seed)
// or any smaller grid: thread i then takes packs i, i + (the grid's threads), ... in turn. The package launches the
// full grid, except beside the scatter route's bucket table built in the same call: there the kernel gets 3/8 of the
// SMs, a block each, so that the table's kernels (blocks of 1024 threads, which do not fit on an SM beside one of
// this kernel's) find SMs at once (gpt2enc_edu/layout.py, WPE_SM_SHARE_BESIDE_TABLE).
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
