// encoder_backward_atomic.cu: the encoder backward as a scatter-add with atomics (the nondeterministic
// baseline). dwte[inp[b,t],:] += dout[b,t,:] and dwpe[t,:] += dout[b,t,:] for every (b, t).
//
// Launch: 1-D grids, block = 256.
//   encoder_backward_atomic_fp32_kernel(dwte32, dwpe32, dout, inp, B, T, C)
//       the plainest form (the course's exercise): one thread per 128-bit pack of dout,
//       grid = CEIL_DIV(B*T*C / x128::size, block); every element of the pack is added into dwte32 and dwpe32.
//   encoder_backward_atomic_fp32_rows_kernel(dwte32, dwpe32, dout, inp, B, T, C)
//       what the package launches: ATOMIC_ROWS batch rows per thread, dwpe summed in registers first (below).
//   Both accumulate into fp32 buffers: for fp32 storage these are dwte/dwpe themselves; for bf16 storage the
//   package brackets the rows kernel with two kernels that touch only the rows the batch uses:
//   encoder_backward_atomic_widen_kernel(dwte32, dwpe32, dwte, dwpe, inp, stamps, call, B, T, C)  (before)
//       copies dwte[ix] into the fp32 scratch row dwte32[ix] for every distinct id ix of the batch, and dwpe's
//       first T rows into dwpe32 (T x C);
//   encoder_backward_atomic_narrow_kernel(dwte, dwpe, dwte32, dwpe32, inp, stamps, call, B, T, C)  (after)
//       rounds those rows back to bf16, to nearest, once. Rows of tokens the batch does not use are never
//       read or written. stamps: V ints, zero before the first call; call: 1, 2, ... (a new one per call).
//   encoder_backward_atomic_bf16_kernel(dwte, dwpe, dout, inp, B, T, C)   (bf16 storage only)
//       atomics straight on the bf16 gradients, one thread per pack: every single add is rounded to bf16.
//
// Why this is nondeterministic: many threads add into the same row (every occurrence of a token, every b
// for one t). The hardware serialises them in whatever order they arrive, and fp32 addition is not
// associative, so the low bits of the sum change from run to run.
#include "common.cuh"

// ATOMIC_ROWS (constants.cuh): batch rows per thread of the rows kernel; its dwpe atomics are this many times fewer.

// Four fp32 atomic adds; Hopper does them in one instruction (each one still its own fp32 add). The target
// is 16-byte aligned (c is a multiple of 4).
__device__ __forceinline__ void atomic_add_float4(float* target, float4 value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(target), value);
#else
    atomicAdd(target, value.x);
    atomicAdd(target + 1, value.y);
    atomicAdd(target + 2, value.z);
    atomicAdd(target + 3, value.w);
#endif
}

extern "C" __global__ void encoder_backward_atomic_fp32_kernel(float* dwte32, float* dwpe32, const floatX* dout,
                                                               const int* inp, int B, int T, int C) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= B * T * C) { return; }

    int bt = idx / C;
    int b = bt / T;
    int t = bt % T;
    int c = idx % C;

    int ix = inp[b * T + t];

    x128 packed_dout = load128cs(dout + b * T * C + t * C + c);  // read exactly once
    float* dwte_ix = dwte32 + ix * C + c;
    float* dwpe_tc = dwpe32 + t * C + c;
    for (int q = 0; q < x128::size / 4; q++) {
        float4 d = make_float4((float)packed_dout[4 * q], (float)packed_dout[4 * q + 1], (float)packed_dout[4 * q + 2],
                               (float)packed_dout[4 * q + 3]);
        atomic_add_float4(dwte_ix + 4 * q, d);
        atomic_add_float4(dwpe_tc + 4 * q, d);
    }
}

// The package's fp32 route: the same adds, with a thread map that needs fewer atomics. A thread owns one pack
// column c of one position t for ATOMIC_ROWS batch rows b: it adds each row into dwte[inp[b,t]] with atomics,
// but sums the rows for dwpe[t] in a register first and adds that with one atomic: dwpe, which every b hits,
// gets ATOMIC_ROWS times fewer atomics. Still fp32 adds in an order the hardware picks (nondeterministic).
//   grid = CEIL_DIV(CEIL_DIV(B, ATOMIC_ROWS) * T * C / x128::size, block), same arguments as above
extern "C" __global__ void encoder_backward_atomic_fp32_rows_kernel(float* dwte32, float* dwpe32, const floatX* dout,
                                                                    const int* inp, int B, int T, int C) {
    int packs_per_row = C / x128::size;
    int thread = blockIdx.x * blockDim.x + threadIdx.x;
    int column = thread % packs_per_row;
    int t = (thread / packs_per_row) % T;
    int b0 = thread / packs_per_row / T * ATOMIC_ROWS;
    if (b0 >= B) { return; }
    int rows = min(ATOMIC_ROWS, B - b0);
    int c = column * x128::size;

    int ix[ATOMIC_ROWS];
    x128 packed_dout[ATOMIC_ROWS];
#pragma unroll
    for (int r = 0; r < ATOMIC_ROWS; r++) {
        if (r < rows) {
            ix[r] = inp[(b0 + r) * T + t];
            packed_dout[r] = load128cs(dout + ((b0 + r) * T + t) * C + c);  // read exactly once
        }
    }
    float wpe_sum[x128::size];
    for (int k = 0; k < x128::size; k++) { wpe_sum[k] = 0.0f; }
#pragma unroll
    for (int r = 0; r < ATOMIC_ROWS; r++) {
        if (r < rows) {
            float* dwte_ix = dwte32 + ix[r] * C + c;
            for (int q = 0; q < x128::size / 4; q++) {
                float4 d = make_float4((float)packed_dout[r][4 * q], (float)packed_dout[r][4 * q + 1],
                                       (float)packed_dout[r][4 * q + 2], (float)packed_dout[r][4 * q + 3]);
                atomic_add_float4(dwte_ix + 4 * q, d);
            }
            for (int k = 0; k < x128::size; k++) { wpe_sum[k] += (float)packed_dout[r][k]; }
        }
    }
    for (int q = 0; q < x128::size / 4; q++) {
        atomic_add_float4(dwpe32 + t * C + c + 4 * q,
                          make_float4(wpe_sum[4 * q], wpe_sum[4 * q + 1], wpe_sum[4 * q + 2], wpe_sum[4 * q + 3]));
    }
}

#ifndef ENC_FP32
// Before the fp32 atomics, for bf16 storage: the rows the batch touches, widened to fp32, each row once.
// One warp per position bt: lane 0 claims the row of its token for this call (atomicExch of a per-token stamp
// that no earlier call wrote: 2 * call), and only the warp that claimed it copies it; the rows of b = 0 also
// copy dwpe's first T rows.  grid = CEIL_DIV(B*T, block / WARP_SIZE)
extern "C" __global__ void encoder_backward_atomic_widen_kernel(float* dwte32, float* dwpe32, const floatX* dwte,
                                                                const floatX* dwpe, const int* inp, int* stamps,
                                                                unsigned int call, int B, int T, int C) {
    int bt = (blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (bt >= B * T) { return; }  // the whole warp leaves together
    int ix = inp[bt];
    int first = 0;
    if (lane == 0) { first = atomicExch(&stamps[ix], (int)(2u * call)) != (int)(2u * call); }
    first = __shfl_sync(0xffffffffu, first, 0);
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        if (first) {
            x128 packed = load128(dwte + ix * C + c);
            for (int q = 0; q < x128::size / 4; q++) {
                reinterpret_cast<float4*>(dwte32 + ix * C + c)[q] = make_float4(
                    (float)packed[4 * q], (float)packed[4 * q + 1], (float)packed[4 * q + 2], (float)packed[4 * q + 3]);
            }
        }
        if (bt < T) {
            x128 packed_wpe = load128(dwpe + bt * C + c);
            for (int q = 0; q < x128::size / 4; q++) {
                reinterpret_cast<float4*>(dwpe32 + bt * C + c)[q] =
                    make_float4((float)packed_wpe[4 * q], (float)packed_wpe[4 * q + 1], (float)packed_wpe[4 * q + 2],
                                (float)packed_wpe[4 * q + 3]);
            }
        }
    }
}

// After the fp32 atomics: round the touched rows back to bf16, to nearest (the same cast as CuPy's astype),
// each row once (claimed with the stamp 2 * call + 1).  grid as for the widen kernel
extern "C" __global__ void encoder_backward_atomic_narrow_kernel(floatX* dwte, floatX* dwpe, const float* dwte32,
                                                                 const float* dwpe32, const int* inp, int* stamps,
                                                                 unsigned int call, int B, int T, int C) {
    int bt = (blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (bt >= B * T) { return; }
    int ix = inp[bt];
    int first = 0;
    if (lane == 0) { first = atomicExch(&stamps[ix], (int)(2u * call + 1u)) != (int)(2u * call + 1u); }
    first = __shfl_sync(0xffffffffu, first, 0);
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        if (first) {
            x128 packed;
            for (int k = 0; k < x128::size; k++) { packed[k] = (floatX)dwte32[ix * C + c + k]; }
            store128(dwte + ix * C + c, packed);
        }
        if (bt < T) {
            x128 packed_wpe;
            for (int k = 0; k < x128::size; k++) { packed_wpe[k] = (floatX)dwpe32[bt * C + c + k]; }
            store128(dwpe + bt * C + c, packed_wpe);
        }
    }
}
#endif

#ifndef ENC_FP32
// bf16 atomics on pairs: one 32-bit atomic updates two neighbouring bf16 values. Only sm_90 and newer have a
// native instruction (cuda_bf16.hpp emits atom.add.noftz.bf16x2 under NV_PROVIDES_SM_90); below it the
// header's atomicAdd is a compare-and-swap loop on the 32-bit word. CUDA 12.2 and newer (13 included) declare
// that atomicAdd for every architecture; CUDA 12.0 and 12.1 only from sm_80. So below sm_80 (a T4 is sm_75)
// the kernel writes the same loop itself: equivalent, not required on a newer toolkit, and it keeps the
// older ones compiling. Either way every add is rounded to bf16, as the native instruction rounds.
__device__ __forceinline__ void atomic_add_bf16x2(__nv_bfloat162* target, __nv_bfloat162 value) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    atomicAdd(target, value);
#else
    unsigned int* word = reinterpret_cast<unsigned int*>(target);
    unsigned int old = *word;
    unsigned int assumed;
    do {
        assumed = old;
        __nv_bfloat162 current = *reinterpret_cast<__nv_bfloat162*>(&assumed);
        float2 sum =
            make_float2(__low2float(current) + __low2float(value), __high2float(current) + __high2float(value));
        __nv_bfloat162 updated = __floats2bfloat162_rn(sum.x, sum.y);
        old = atomicCAS(word, assumed, *reinterpret_cast<unsigned int*>(&updated));
    } while (assumed != old);
#endif
}

extern "C" __global__ void encoder_backward_atomic_bf16_kernel(floatX* dwte, floatX* dwpe, const floatX* dout,
                                                               const int* inp, int B, int T, int C) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= B * T * C) { return; }

    int bt = idx / C;
    int b = bt / T;
    int t = bt % T;
    int c = idx % C;

    int ix = inp[b * T + t];

    x128 packed_dout = load128cs(dout + b * T * C + t * C + c);
    // c is a multiple of 8, so the pairs below are 4-byte aligned.
    __nv_bfloat162* dwte_ix = reinterpret_cast<__nv_bfloat162*>(dwte + ix * C + c);
    __nv_bfloat162* dwpe_tc = reinterpret_cast<__nv_bfloat162*>(dwpe + t * C + c);
    for (int k = 0; k < x128::size / 2; k++) {
        __nv_bfloat162 pair = __halves2bfloat162(packed_dout[2 * k], packed_dout[2 * k + 1]);
        atomic_add_bf16x2(dwte_ix + k, pair);
        atomic_add_bf16x2(dwpe_tc + k, pair);
    }
}
#endif
