// encoder_backward_atomic.cu: the encoder backward as a scatter-add with atomics (the nondeterministic
// baseline). dwte[inp[b,t],:] += dout[b,t,:] and dwpe[t,:] += dout[b,t,:] for every (b, t).
//
// Launch: 1-D grids, one thread per 128-bit pack of dout (BT = B*T rows of C channels):
//   grid = CEIL_DIV(B*T*C / x128::size, block)
//   encoder_backward_atomic_fp32_kernel(dwte32, dwpe32, dout, inp, B, T, C)
//       accumulates into fp32 buffers: for fp32 storage these are dwte/dwpe themselves; for bf16 storage the
//       package brackets it with the two kernels below, so that only the rows the batch uses are touched:
//   encoder_backward_atomic_widen_kernel(dwte32, dwpe32, dwte, dwpe, inp, B, T, C)     (before, bf16 only)
//       copies dwte[ix] into the fp32 scratch row dwte32[ix] for every id ix of the batch, and dwpe's first
//       T rows into dwpe32 (T x C);
//   encoder_backward_atomic_narrow_kernel(dwte, dwpe, dwte32, dwpe32, inp, B, T, C)   (after, bf16 only)
//       rounds those rows back to bf16, to nearest, once.
//       A token that occurs n times has its row copied n times, with the same values: harmless, and cheaper
//       than finding the distinct ids first. Rows of tokens the batch does not use are never read or written.
//   encoder_backward_atomic_bf16_kernel(dwte, dwpe, dout, inp, B, T, C)   (bf16 storage only)
//       atomics straight on the bf16 gradients: every single add is rounded to bf16.
//
// Why this is nondeterministic: many threads add into the same row (every occurrence of a token, every b
// for one t). The hardware serialises them in whatever order they arrive, and fp32 addition is not
// associative, so the low bits of the sum change from run to run.
#include "common.cuh"

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
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Hopper adds four floats in one atomic instruction (each one still its own fp32 add): a quarter of the
    // atomic instructions. c is a multiple of 4, so the float4 targets are 16-byte aligned.
    for (int q = 0; q < x128::size / 4; q++) {
        float4 d = make_float4((float)packed_dout[4 * q], (float)packed_dout[4 * q + 1],
                               (float)packed_dout[4 * q + 2], (float)packed_dout[4 * q + 3]);
        atomicAdd(reinterpret_cast<float4*>(dwte_ix) + q, d);
        atomicAdd(reinterpret_cast<float4*>(dwpe_tc) + q, d);
    }
#else
    for (int k = 0; k < x128::size; k++) {
        float d = (float)packed_dout[k];
        atomicAdd(dwte_ix + k, d);
        atomicAdd(dwpe_tc + k, d);
    }
#endif
}

#ifndef ENC_FP32
// Before the fp32 atomics, for bf16 storage: the rows the batch touches, widened to fp32.
extern "C" __global__ void encoder_backward_atomic_widen_kernel(float* dwte32, float* dwpe32, const floatX* dwte,
                                                                const floatX* dwpe, const int* inp, int B, int T,
                                                                int C) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= B * T * C) { return; }
    int bt = idx / C;
    int c = idx % C;
    int ix = inp[bt];
    x128 packed = load128(dwte + ix * C + c);
    float4* target = reinterpret_cast<float4*>(dwte32 + ix * C + c);
    for (int q = 0; q < x128::size / 4; q++) {
        target[q] = make_float4((float)packed[4 * q], (float)packed[4 * q + 1], (float)packed[4 * q + 2],
                                (float)packed[4 * q + 3]);
    }
    if (bt < T) {  // the rows of b = 0 also carry dwpe's first T rows
        x128 packed_wpe = load128(dwpe + idx);
        float4* target_wpe = reinterpret_cast<float4*>(dwpe32 + idx);
        for (int q = 0; q < x128::size / 4; q++) {
            target_wpe[q] = make_float4((float)packed_wpe[4 * q], (float)packed_wpe[4 * q + 1],
                                        (float)packed_wpe[4 * q + 2], (float)packed_wpe[4 * q + 3]);
        }
    }
}

// After the fp32 atomics: round the touched rows back to bf16, to nearest (the same cast as CuPy's astype).
extern "C" __global__ void encoder_backward_atomic_narrow_kernel(floatX* dwte, floatX* dwpe, const float* dwte32,
                                                                 const float* dwpe32, const int* inp, int B, int T,
                                                                 int C) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= B * T * C) { return; }
    int bt = idx / C;
    int c = idx % C;
    int ix = inp[bt];
    const float* source = dwte32 + ix * C + c;
    x128 packed;
    for (int k = 0; k < x128::size; k++) { packed[k] = (floatX)source[k]; }
    store128(dwte + ix * C + c, packed);
    if (bt < T) {
        x128 packed_wpe;
        for (int k = 0; k < x128::size; k++) { packed_wpe[k] = (floatX)dwpe32[idx + k]; }
        store128(dwpe + idx, packed_wpe);
    }
}
#endif

#ifndef ENC_FP32
// bf16 atomics on pairs: one 32-bit atomic updates two neighbouring bf16 values. Only sm_90 and newer have a
// native instruction (CUDA's cuda_bf16.hpp emits atom.add.noftz.bf16x2 under NV_PROVIDES_SM_90); for sm_80
// the header's atomicAdd is itself a compare-and-swap loop, and below sm_80 (a T4 is sm_75) there is no
// bf16 atomicAdd at all, so the loop below does the same: just as correct, only slower.
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
        float2 sum = make_float2(__low2float(current) + __low2float(value),
                                 __high2float(current) + __high2float(value));
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
