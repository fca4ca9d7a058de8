// encoder_forward.cu: the GPT-2 encoder forward, out[b,t,:] = wte[inp[b,t],:] + wpe[t,:].
//
// Launch: 1-D grid, any block size (the package uses 256), one thread per 128-bit pack of `out`:
//   grid = CEIL_DIV(B*T*C / x128::size, block), kernel(out, inp, wte, wpe, B, T, C)
// Requires C % x128::size == 0 (8 for bf16, 4 for fp32) and 16-byte aligned arrays; the Python side checks
// both before it launches, together with 0 <= inp < V and B*T*C < 2^31 (all index math here is 32-bit).
//
// The sum is done in fp32 and rounded to nearest-even into floatX. No randomness: the result is a pure
// function of the inputs, so the NumPy mirror reproduces it bit for bit.
#include "common.cuh"

extern "C" __global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte,
                                                  const floatX* wpe, int B, int T, int C) {
    // Thread -> element map: the flat index of this thread's first element in out (B, T, C).
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= B * T * C) { return; }

    // A pack never straddles two rows because C is a multiple of the pack width.
    int bt = idx / C;
    int b = bt / T;
    int t = bt % T;
    int c = idx % C;

    int ix = inp[b * T + t];

    // wte rows are gathered at random, wpe rows are reused by every b: stream the former, cache the latter.
    x128 wte128 = load128cs(wte + ix * C + c);
    x128 wpe128 = load128(wpe + t * C + c);
    x128 packed_out;
    for (int k = 0; k < x128::size; k++) {
        packed_out[k] = (floatX)((float)wte128[k] + (float)wpe128[k]);
    }
    store128(out + b * T * C + t * C + c, packed_out);
}
