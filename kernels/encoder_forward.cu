// encoder_forward.cu: the GPT-2 encoder forward, out[b,t,:] = wte[inp[b,t],:] + wpe[t,:].
//
// Three versions, each a small step from the one before, all bitwise identical (fp32 add, rounded to nearest):
//   version 1  encoder_forward_v1_kernel  one element per thread: the plainest mapping
//   version 2  encoder_forward_v2_kernel  one 128-bit pack per thread: 16-byte loads and stores
//   version 3  encoder_forward_kernel     one pack column of one position t per thread, for FORWARD_ROWS
//                                         batch rows: the wpe pack is loaded once and reused, FORWARD_ROWS
//                                         wte loads are in flight at once. The fastest; the package's
//                                         encoder_forward launches this one.
//
// Launch (block = BLOCK_SIZE = 256 for all three; gpt2enc_edu.cuda.encoder_forward_version launches any):
//   v1: grid = CEIL_DIV(B*T*C, block)                                  kernel(out, inp, wte, wpe, B, T, C)
//   v2: grid = CEIL_DIV(B*T*C / x128::size, block)                     same arguments
//   v3: grid = CEIL_DIV(CEIL_DIV(B, FORWARD_ROWS) * T * C / x128::size, block)   same arguments
// Requires C % x128::size == 0 (8 for bf16, 4 for fp32) and 16-byte aligned arrays; the Python side checks
// both before it launches, together with 0 <= inp < V and B*T*C < 2^31 (all index math here is 32-bit).
//
// The sum is done in fp32 and rounded to nearest-even into floatX. No randomness: the result is a pure
// function of the inputs, so the NumPy mirror reproduces it bit for bit, whatever the version.
#include "common.cuh"

// FORWARD_ROWS (constants.cuh): batch rows per thread of version 3, the loads a thread keeps in flight.

// version 1: one thread per element. Each thread loads 2 bytes (bf16) twice: correct, but every load and
// store is narrow, so a warp moves 64 bytes per instruction where it could move 512.
extern "C" __global__ void encoder_forward_v1_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                                     int B, int T, int C) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * T * C) { return; }
    int bt = idx / C;
    int t = bt % T;
    int c = idx % C;
    int ix = inp[bt];
    out[idx] = (floatX)((float)wte[ix * C + c] + (float)wpe[t * C + c]);
}

// version 2: one thread per 128-bit pack of out (this is llm.c's encoder_forward_kernel3).
extern "C" __global__ void encoder_forward_v2_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                                     int B, int T, int C) {
    // Thread -> element map: the flat index of this thread's first element in out (B, T, C).
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= B * T * C) { return; }

    // A pack never straddles two rows because C is a multiple of the pack width.
    int bt = idx / C;
    int b = bt / T;
    int t = bt % T;
    int c = idx % C;

    int ix = inp[b * T + t];

    // wpe rows are reused by every b: cache them. wte rows are streamed (llm.c streams both), though a frequent
    // token's row is read hundreds of times per batch: the hint is a hint, the bits are the same either way.
    x128 wte128 = load128cs(wte + ix * C + c);
    x128 wpe128 = load128(wpe + t * C + c);
    x128 packed_out;
    for (int k = 0; k < x128::size; k++) { packed_out[k] = (floatX)((float)wte128[k] + (float)wpe128[k]); }
    store128(out + b * T * C + t * C + c, packed_out);
}

// version 3: thread -> (row group, t, pack column). Consecutive threads take consecutive packs of one
// position t, so for each b a warp still writes 512 contiguous bytes; the thread then walks FORWARD_ROWS
// batch rows b with the same t, reusing its wpe pack from registers.
extern "C" __global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                                  int B, int T, int C) {
    int packs_per_row = C / x128::size;
    int thread = blockIdx.x * blockDim.x + threadIdx.x;
    int column = thread % packs_per_row;
    int t = (thread / packs_per_row) % T;
    int row_group = thread / packs_per_row / T;
    int b0 = row_group * FORWARD_ROWS;
    if (b0 >= B) { return; }
    int rows = min(FORWARD_ROWS, B - b0);
    int c = column * x128::size;

    x128 wpe128 = load128(wpe + t * C + c);
    // First every id, then every wte load, then the adds and stores: FORWARD_ROWS loads are in flight
    // before the first one is used. Ids of one t are read by the whole warp at once (a broadcast).
    int ix[FORWARD_ROWS];
#pragma unroll
    for (int r = 0; r < FORWARD_ROWS; r++) { ix[r] = r < rows ? inp[(b0 + r) * T + t] : 0; }
    x128 wte128[FORWARD_ROWS];
#pragma unroll
    for (int r = 0; r < FORWARD_ROWS; r++) {
        // Plain loads, not streaming ones: a frequent token's row is read again soon and should stay in L2.
        if (r < rows) { wte128[r] = load128(wte + ix[r] * C + c); }
    }
#pragma unroll
    for (int r = 0; r < FORWARD_ROWS; r++) {
        if (r < rows) {
            x128 packed_out;
            for (int k = 0; k < x128::size; k++) { packed_out[k] = (floatX)((float)wte128[r][k] + (float)wpe128[k]); }
            // A plain store: a streaming one ("evict first") measured the same, and the plain one is the simpler
            // (docs/experiments.md, forward: "streaming or plain stores"). A hint cannot change the bits.
            store128(out + ((b0 + r) * T + t) * C + c, packed_out);
        }
    }
}
