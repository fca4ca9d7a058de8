// common.cuh: device-only helpers shared by every encoder kernel in this folder.
//
// What is here
//   constants.cuh          the numbers the kernels and the Python side share (included here, so every kernel has them)
//   SM_THREAD_SLOTS        the threads an SM holds at once on the architecture compiled for (launch bounds)
//   floatX                 the storage dtype: __nv_bfloat16 (default) or float (compile with -DENC_FP32)
//   Packed128<T>, x128     16 bytes of elements (8 bf16 or 4 fp32): one 128-bit load/store per thread
//   load128 / load128cs    plain and streaming ("evict first") 16-byte loads
//   prefetch_l2            ask L2 for a range of bytes without waiting for it
//   copy16_async / wait_async_copies   16 bytes from global to shared memory without a register (sm_80+)
//   copy16_to_shared                   the same, through a register below sm_80
//   commit_async_copies / wait_async_copies_but<N>   the same copies in groups, for stages kept in flight
//   store128               plain 16-byte store
//   wait_for_previous_grid / allow_next_grid   the two halves of a programmatic dependent launch (sm_90+)
//   squirrel_noise5        a cheap, good-quality integer hash (Squirrel Eiserloh's SquirrelNoise5)
//   noise_2d               SquirrelNoise5 over a 2-D position, for one random number per (element, tensor)
//   round_to_storage       fp32 -> floatX: stochastic rounding for bf16, a plain store for fp32
//   store_rounded_sum128   a pack's read-modify-write end: old + sum, rounded per element, one 16-byte store
//   lanes_below            the mask of the lanes below this one
//   warp_inclusive_sum     inclusive prefix sum of one int per lane over a warp
//   block_exclusive_sum    exclusive prefix sum of one int per thread over a block (the bucketing kernels)
//
// This header is device-only on purpose: CuPy compiles the kernels with NVRTC, which cannot include host
// headers such as <vector> or <assert.h>. Every .cu file here also compiles with `nvcc -arch=sm_90 -c`.
#pragma once

#include <cuda_bf16.h>

#include "constants.cuh"

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// The threads an SM holds at once: 2048 from sm_80 on (1536 on sm_86/87/89, 1024 on sm_75). A kernel whose launch
// bounds ask for SM_THREAD_SLOTS / (its block) blocks per SM gets registers for a full SM and no more.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 750
#define SM_THREAD_SLOTS 1024
#elif defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890)
#define SM_THREAD_SLOTS 1536
#else
#define SM_THREAD_SLOTS 2048
#endif

#ifdef ENC_FP32
typedef float floatX;
#else
typedef __nv_bfloat16 floatX;
#endif

// ----------------------------------------------------------------------------------------------------------
// 128-bit packs. A warp that loads 32 consecutive packs touches 512 contiguous bytes: four full 128-byte
// cache lines with one instruction per thread, which is what a memory-bound kernel wants.
template <class ElementType>
struct alignas(16) Packed128 {
    static constexpr int size = sizeof(int4) / sizeof(ElementType);
    ElementType payload[size];

    Packed128() = default;
    __device__ explicit Packed128(int4 bits) { memcpy(&payload, &bits, sizeof(bits)); }
    __device__ ElementType& operator[](int index) { return payload[index]; }
    __device__ const ElementType& operator[](int index) const { return payload[index]; }
    __device__ int4 get_bits() const {
        int4 bits;
        memcpy(&bits, &payload, sizeof(bits));
        return bits;
    }
};

typedef Packed128<floatX> x128;

template <class ElementType>
__device__ Packed128<ElementType> load128(const ElementType* address) {
    return Packed128<ElementType>{*reinterpret_cast<const int4*>(address)};
}

// Streaming load ("evict first"): for data read exactly once, such as dout, so that it does not push reusable
// lines out of L2. A wte row is NOT read once: in real text a frequent token's row is gathered hundreds of
// times per batch (in B=8, T=1024 batches of the shipped sample, the most frequent row is read 431 to 1594
// times, depending on the batch).
template <class ElementType>
__device__ Packed128<ElementType> load128cs(const ElementType* address) {
    return Packed128<ElementType>{__ldcs(reinterpret_cast<const int4*>(address))};
}

template <class ElementType>
__device__ void store128(ElementType* target, Packed128<ElementType> value) {
    *reinterpret_cast<int4*>(target) = value.get_bits();
}

// Ask L2 for the 128-byte lines of [begin, end) and go on at once: a prefetch holds no register and nothing
// waits for it. For a chain of reads whose order is fixed, it lets the lines arrive while the chain walks.
// From sm_80 on the lines are marked "evict last", so that other traffic does not push them out first.
__device__ __forceinline__ void prefetch_l2(const void* begin, const void* end) {
    for (size_t line = reinterpret_cast<size_t>(begin) & ~(size_t)127; line < reinterpret_cast<size_t>(end);
         line += 128) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(line));
#else
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
#endif
    }
}

// Copy 16 bytes from global to shared memory asynchronously (cp.async, sm_80 and newer): the data goes from L2 to
// shared memory without passing through a register, so a thread can have many copies in flight at no register
// cost. wait_async_copies() waits for all of this thread's copies; only then may it read what they wrote. The
// ".cg" form skips L1 (the data is read once). Below sm_80 there is no cp.async: callers keep a plain path.
__device__ __forceinline__ void copy16_async(void* shared_target, const void* global_source) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned int target = (unsigned int)__cvta_generic_to_shared(shared_target);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(target), "l"(global_source) : "memory");
#endif
}

// The same 16 bytes on any architecture: copy16_async from sm_80 on, below it a plain load and store through a
// register (done when it returns). For a pipelined kernel that must stay correct where there is no cp.async.
__device__ __forceinline__ void copy16_to_shared(void* shared_target, const void* global_source) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    copy16_async(shared_target, global_source);
#else
    *reinterpret_cast<int4*>(shared_target) = *reinterpret_cast<const int4*>(global_source);
#endif
}

__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Copies in groups, for a pipeline of stages: commit_async_copies() closes the group of this thread's copies issued
// since the last commit; wait_async_copies_but<N>() waits until at most N of its groups are still in flight (so
// every older group has landed). A stage issued, then the next one issued, then a wait with N = 1: the first has
// landed and the second is still on its way while the thread works on the first.
__device__ __forceinline__ void commit_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wait_async_copies_but() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// ----------------------------------------------------------------------------------------------------------
// Programmatic dependent launch (sm_90 and newer). Two kernels in a row on one stream normally leave a gap of
// about a microsecond: the second is set up only once the first has ended. A kernel launched as a programmatic
// dependent (gpt2enc_edu.loader.launch(..., after_kernel=True)) may be set up and start while the one before it
// still runs, as soon as every block of that one has called allow_next_grid() or exited. Its threads then wait in
// wait_for_previous_grid() until the kernel before has ended and its writes are visible. So:
//   - a dependent calls wait_for_previous_grid() before it reads (or writes) anything the kernel before touches;
//     the package's kernels call it first thing, so nothing moves before it and the bits stay as they were;
//   - a kernel calls allow_next_grid() only after its own wait_for_previous_grid(): the kernel after it then
//     starts only once the one before has ended, and the chain of dependencies stays whole.
// In a kernel launched the plain way, and below sm_90, both do nothing.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
#else
__device__ __forceinline__ void wait_for_previous_grid() {}
__device__ __forceinline__ void allow_next_grid() {}
#endif

// ----------------------------------------------------------------------------------------------------------
// Random numbers without state: a hash of (position, seed). All arithmetic is unsigned 32-bit and wraps, so
// the NumPy mirror (gpt2enc_edu/rounding.py) reproduces it exactly with np.uint32.
__device__ __forceinline__ unsigned int squirrel_noise5(unsigned int position, unsigned int seed) {
    const unsigned int SQ5_BIT_NOISE1 = 0xd2a80a3fu;
    const unsigned int SQ5_BIT_NOISE2 = 0xa884f197u;
    const unsigned int SQ5_BIT_NOISE3 = 0x6C736F4Bu;
    const unsigned int SQ5_BIT_NOISE4 = 0xB79F3ABBu;
    const unsigned int SQ5_BIT_NOISE5 = 0x1b56c4f5u;
    unsigned int mangled = position;
    mangled *= SQ5_BIT_NOISE1;
    mangled += seed;
    mangled ^= (mangled >> 9);
    mangled += SQ5_BIT_NOISE2;
    mangled ^= (mangled >> 11);
    mangled *= SQ5_BIT_NOISE3;
    mangled ^= (mangled >> 13);
    mangled += SQ5_BIT_NOISE4;
    mangled ^= (mangled >> 15);
    mangled *= SQ5_BIT_NOISE5;
    mangled ^= (mangled >> 17);
    return mangled;
}

// A 2-D position folded into one word with a large prime, as in SquirrelNoise's Get2dNoiseUint.
__device__ __forceinline__ unsigned int noise_2d(unsigned int x, unsigned int y, unsigned int seed) {
    const unsigned int PRIME_NUMBER = 198491317u;
    return squirrel_noise5(x + (PRIME_NUMBER * y), seed);
}

// Which tensor an element belongs to is the second coordinate of noise_2d (NOISE_STREAM_DWTE / NOISE_STREAM_DWPE,
// constants.cuh). Two tensors updated with the same seed must not draw the same random number for the same flat index.

// ----------------------------------------------------------------------------------------------------------
// fp32 -> storage dtype.
//
// bf16 keeps the top 16 bits of a float. Round-to-nearest would lose every update smaller than half a bf16
// step for good; stochastic rounding rounds up with probability (dropped bits) / 65536, so the expected
// stored value equals the fp32 value. The random 16-bit threshold comes from a hash of the element's own
// flat index (not of the thread that happens to write it), so the result does not depend on how the work
// was split into blocks: any bucket order, any launch shape, the CPU mirror, all give the same bits.
//
// The trick: if the 16 bits that bf16 drops exceed the threshold, set them all to 1 so round-to-nearest
// rounds up; otherwise clear them so it truncates. Inf has its low bits at 0 and stays Inf; NaN stays NaN.
__device__ __forceinline__ void round_to_storage(float value, float* target, unsigned int element, unsigned int stream,
                                                 unsigned int seed) {
    *target = value;  // fp32 storage: nothing to round
}

__device__ __forceinline__ void round_to_storage(float value, __nv_bfloat16* target, unsigned int element,
                                                 unsigned int stream, unsigned int seed) {
    unsigned int threshold = noise_2d(element, stream, seed) & 0xFFFFu;
    unsigned int bits = __float_as_uint(value);
    unsigned int dropped = bits & 0xFFFFu;
    bits = (dropped > threshold) ? (bits | 0xFFFFu) : (bits & ~0xFFFFu);
    *target = __float2bfloat16_rn(__uint_as_float(bits));
}

// The end of a gradient pack's read-modify-write: element k becomes round_to_storage(sums[k] + old[k]), with the
// noise position first_element + k (the element's flat index in its tensor), and the pack is stored in one go.
__device__ __forceinline__ void store_rounded_sum128(floatX* target, x128 old, const float* sums,
                                                     unsigned int first_element, unsigned int stream,
                                                     unsigned int seed) {
    for (int k = 0; k < x128::size; k++) {
        round_to_storage(sums[k] + (float)old[k], &old[k], first_element + k, stream, seed);
    }
    store128(target, old);
}

// ----------------------------------------------------------------------------------------------------------
// Lanes below this one, as a mask (with __match_any_sync: how many lanes before this one share its value).
__device__ __forceinline__ unsigned int lanes_below(int lane) { return (1u << lane) - 1u; }

// Inclusive prefix sum of one int per lane over a full warp (lane order): shuffles, no shared memory.
__device__ __forceinline__ int warp_inclusive_sum(int value) {
    int lane = threadIdx.x % WARP_SIZE;
    for (int offset = 1; offset < WARP_SIZE; offset <<= 1) {
        int other = __shfl_up_sync(0xffffffffu, value, offset);
        if (lane >= offset) { value += other; }
    }
    return value;
}

// Exclusive prefix sum of one int per thread over the whole block (thread order), for blocks of whole warps
// (at most 32 of them); *total receives the sum of all. scratch: WARP_SIZE + 1 ints of shared memory.
// Every thread of the block must call it (it contains __syncthreads). Integers: the order of the adds does not
// change the result, so the warp-then-block split needs no care.
__device__ int block_exclusive_sum(int value, int* total, int* scratch) {
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    int num_warps = blockDim.x / WARP_SIZE;
    int inclusive = warp_inclusive_sum(value);  // first inside the warp
    if (lane == WARP_SIZE - 1) { scratch[warp] = inclusive; }
    __syncthreads();
    if (warp == 0) {  // then across the warps' totals, by the first warp
        int warp_total = lane < num_warps ? scratch[lane] : 0;
        int warp_inclusive = warp_inclusive_sum(warp_total);
        scratch[lane] = warp_inclusive - warp_total;  // exclusive offset of each warp
        if (lane == WARP_SIZE - 1) { scratch[WARP_SIZE] = warp_inclusive; }
    }
    __syncthreads();
    int result = scratch[warp] + inclusive - value;
    *total = scratch[WARP_SIZE];
    __syncthreads();  // scratch may be reused right after
    return result;
}
