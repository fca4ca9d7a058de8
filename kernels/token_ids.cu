// token_ids.cu: the token ids of a PyTorch call (int64, PyTorch's default, or int32, at any address) written as the
// contiguous int32 ids the encoder kernels read, and checked against [0, V) on the device, with no host sync.
//
//   token_ids_i64_kernel  out[i] = (int)ids[i] for int64 ids
//   token_ids_i32_kernel  out[i] = ids[i] for int32 ids (a copy to an aligned buffer)
//
// Launch (gpt2enc_edu.token_ids.token_ids): grid = CEIL_DIV(n, TOKEN_IDS_BLOCK), block = TOKEN_IDS_BLOCK;
//   kernel(out, ids, n, V, check). One id per thread; n = B*T < 2^31.
//
// check = 1: a thread whose id lies outside [0, V) prints it and stops the kernel with __trap(). The launch then fails
// and the CUDA context is lost (as after a device-side assert), so nothing queued after it on any stream runs: the
// encoder kernels that would read wte or write dwte at that id never start, and PyTorch raises the error at its next
// synchronising call. The id is checked in its own type, before any narrowing, so a huge int64 id cannot wrap into
// range. check = 0 narrows as `.to(torch.int32)` does (the low 32 bits), for ids checked before.
//
// No randomness and no order: out is a pure function of ids (gpt2enc_edu.token_ids.token_ids_twin is the NumPy twin).
#include "common.cuh"

#ifndef __CUDACC_RTC__
#include <cstdio>  // device printf; NVRTC declares it itself
#endif

#define TOKEN_IDS_BLOCK 256

template <class Id>
__device__ void token_ids(int* out, const Id* ids, int n, int V, int check) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    Id id = ids[i];
    if (check && (id < 0 || id >= (Id)V)) {
        printf("gpt2enc_edu: token id %lld at position %d lies outside [0, V) = [0, %d); no encoder kernel ran\n",
               (long long)id, i, V);
        __trap();
    }
    out[i] = (int)id;
}

extern "C" __global__ void __launch_bounds__(TOKEN_IDS_BLOCK)
    token_ids_i64_kernel(int* out, const long long* ids, int n, int V, int check) {
    token_ids(out, ids, n, V, check);
}

extern "C" __global__ void __launch_bounds__(TOKEN_IDS_BLOCK)
    token_ids_i32_kernel(int* out, const int* ids, int n, int V, int check) {
    token_ids(out, ids, n, V, check);
}
