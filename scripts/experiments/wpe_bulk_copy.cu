// wpe_bulk_copy.cu: two experimental forms of the wpe kernel (kernels/encoder_backward_wpe.cu), for the probe
// scripts/experiments/probe_wpe_bulk_copy.py. Not part of the package: nothing in gpt2enc_edu launches them.
//
// The question (docs/experiments.md, wpe kernel: "bulk-copy and cp.async forms"): beside the bucket table the
// package's wpe kernel runs on 49 of the H200's 132 SMs, and alone on 48 blocks it read dout at about 2.5 TB/s (40.9
// us for 101 MB at B=64), about 50 GB/s per SM, although each SM asks for 1024 threads x 8 loads x 16 bytes = 128 KB
// at once.
// If what caps an SM is the number of loads its L1 keeps outstanding, a copy engine that is not the threads' load
// path may read faster per SM, and the wpe kernel would cost the call less while the table runs beside it.
//
// Both forms compute exactly what the package's kernel computes, element by element: one owner thread per 16-byte
// pack of dwpe, which adds dout[b, pack] for b = 0, 1, ..., B-1 in fp32 from 0, then the old value, and rounds once
// (store_rounded_sum128). Only the way dout reaches the thread differs, so the bits must be the package's.
//
//   wpe_bulk_kernel     a block owns tiles of BULK_THREADS packs (tiles blockIdx.x, + gridDim.x, ...); a job is
//                       (tile, b): one cp.async.bulk of the tile's bytes of plane b (contiguous in dout) into a
//                       shared-memory slot, done by the copy engine (sm_90). BULK_STAGES jobs are in flight. One
//                       extra warp is the producer: its lane 0 waits until a slot is free ("empty" mbarrier, one
//                       arrival per consumer warp) and issues the next copy, which completes on the slot's "full"
//                       mbarrier (transaction bytes). Consumer thread i adds pack i of every job in job order.
//                       block = BULK_THREADS + 32, dynamic shared memory = BULK_STAGES * BULK_THREADS * 16 bytes.
//   wpe_cpasync_kernel  the same sums with each thread's own pipeline: thread i takes packs i, i + (the grid's
//                       threads), ... and for each the B rows, CPASYNC_STAGES 16-byte cp.async copies in flight
//                       into its own slots (a thread reads only what it copied: no block barrier, one __syncwarp
//                       per job so that a slot's read ends before its next copy). This asks the same
//                       load path as the package's kernel, with no register held per copy: it tells whether the
//                       registers or the path set the per-SM rate.
//                       block = CPASYNC_THREADS, dynamic shared memory = CPASYNC_STAGES * CPASYNC_THREADS * 16 bytes.
// Both take any grid (a smaller grid walks the rest in turn). sm_90 and newer for the bulk form (the probe skips it
// elsewhere); sm_80 for the cp.async form. The probe passes the sizes with -D.
#include "common.cuh"

#ifndef BULK_THREADS
#define BULK_THREADS 256
#endif
#ifndef BULK_STAGES
#define BULK_STAGES 16
#endif
#ifndef BULK_EVICT_FIRST
#define BULK_EVICT_FIRST 1  // the package's kernel streams dout ("evict first", load128cs): the same hint here
#endif
#ifndef CPASYNC_THREADS
#define CPASYNC_THREADS 1024
#endif
#ifndef CPASYNC_STAGES
#define CPASYNC_STAGES 8
#endif

__device__ __forceinline__ unsigned int shared_address(const void* pointer) {
    return (unsigned int)__cvta_generic_to_shared(pointer);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void barrier_init(unsigned long long* barrier, unsigned int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(arrivals) : "memory");
}

__device__ __forceinline__ void barrier_arrive(unsigned long long* barrier) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier)) : "memory");
}

// Wait until the barrier's phase of this parity (0, 1, 0, ...: its uses in turn) has completed.
__device__ __forceinline__ void barrier_wait(unsigned long long* barrier, unsigned int parity) {
    unsigned int done = 0;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(shared_address(barrier)), "r"(parity)
                     : "memory");
    } while (!done);
}

// Job j of this block: tile blockIdx.x + (j / B) * gridDim.x, plane b = j % B, into slot j % BULK_STAGES.
__device__ __forceinline__ void issue_bulk_job(int j, int B, int T, int C, int packs, const floatX* dout, x128* stage,
                                               unsigned long long* full, unsigned long long policy) {
    int tile = (int)blockIdx.x + (j / B) * (int)gridDim.x;
    int b = j % B;
    int first = tile * BULK_THREADS;
    unsigned int bytes = (unsigned int)min(BULK_THREADS, packs - first) * 16u;  // a multiple of 16, as the copy needs
    int slot = j % BULK_STAGES;
    const floatX* source = dout + (size_t)b * T * C + (size_t)first * x128::size;
    unsigned int barrier = shared_address(&full[slot]);
    unsigned int target = shared_address(stage + slot * BULK_THREADS);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier), "r"(bytes) : "memory");
#if BULK_EVICT_FIRST
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
            "r"(target),
        "l"(source), "r"(bytes), "r"(barrier), "l"(policy)
        : "memory");
#else
    (void)policy;
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(target),
        "l"(source), "r"(bytes), "r"(barrier)
        : "memory");
#endif
}
#endif

extern "C" __global__ void __launch_bounds__(BULK_THREADS + WARP_SIZE)
    wpe_bulk_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C, unsigned int seed) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char dynamic_shared[];
    x128* stage = reinterpret_cast<x128*>(dynamic_shared);  // [BULK_STAGES][BULK_THREADS] packs
    __shared__ __align__(8) unsigned long long full[BULK_STAGES];  // the slot's copy has landed
    __shared__ __align__(8) unsigned long long empty[BULK_STAGES];  // every consumer warp has read the slot
    constexpr int consumer_warps = BULK_THREADS / WARP_SIZE;
    int packs = T * C / x128::size;
    int tiles = CEIL_DIV(packs, BULK_THREADS);
    int my_tiles = (int)blockIdx.x < tiles ? CEIL_DIV(tiles - (int)blockIdx.x, (int)gridDim.x) : 0;
    int jobs = my_tiles * B;  // the same in every thread of the block
    if (threadIdx.x == 0) {
        for (int slot = 0; slot < BULK_STAGES; slot++) {
            barrier_init(&full[slot], 1);  // the producer's arrive.expect_tx, then the bytes
            barrier_init(&empty[slot], consumer_warps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the copy engine
    }
    __syncthreads();
    if (threadIdx.x >= BULK_THREADS) {  // the producer warp
        if (threadIdx.x == BULK_THREADS) {
            unsigned long long policy = 0;
#if BULK_EVICT_FIRST
            asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
            for (int j = 0; j < jobs; j++) {
                if (j >= BULK_STAGES) {
                    barrier_wait(&empty[j % BULK_STAGES], (unsigned int)(j / BULK_STAGES - 1) & 1u);
                }
                issue_bulk_job(j, B, T, C, packs, dout, stage, full, policy);
            }
        }
        return;  // the copies complete on the full barriers, which the consumers wait for
    }
    int lane = threadIdx.x % WARP_SIZE;
    float accum[x128::size];
    for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }
    for (int j = 0; j < jobs; j++) {
        int slot = j % BULK_STAGES;
        barrier_wait(&full[slot], (unsigned int)(j / BULK_STAGES) & 1u);
        int pack = ((int)blockIdx.x + (j / B) * (int)gridDim.x) * BULK_THREADS + (int)threadIdx.x;
        if (pack < packs) {
            x128 packed_dout = stage[slot * BULK_THREADS + threadIdx.x];
            for (int k = 0; k < x128::size; k++) { accum[k] += (float)packed_dout[k]; }
        }
        __syncwarp();  // the warp's reads of the slot are done
        if (lane == 0) { barrier_arrive(&empty[slot]); }
        if (j % B == B - 1) {  // the last plane of this tile: the pack's sum is complete
            if (pack < packs) {
                int idx = pack * x128::size;  // = t * C + c
                store_rounded_sum128(dwpe + idx, load128(dwpe + idx), accum, (unsigned int)idx, NOISE_STREAM_DWPE,
                                     seed);
            }
            for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }
        }
    }
#endif
}

extern "C" __global__ void __launch_bounds__(CPASYNC_THREADS)
    wpe_cpasync_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C, unsigned int seed) {
    extern __shared__ __align__(128) unsigned char dynamic_shared[];
    x128* stage = reinterpret_cast<x128*>(dynamic_shared);  // [CPASYNC_STAGES][CPASYNC_THREADS] packs
    int packs = T * C / x128::size;
    int stride = (int)gridDim.x * CPASYNC_THREADS;
    int first = (int)blockIdx.x * CPASYNC_THREADS + (int)threadIdx.x;
    // Round r: pack first + r * stride. The lanes of a warp walk the same number of rounds (their lane 0's, the
    // most), so that all of them reach the __syncwarp below; a lane whose pack is past the end only counts along.
    int warp_first = first - (int)(threadIdx.x % WARP_SIZE);
    int rounds = warp_first < packs ? CEIL_DIV(packs - warp_first, stride) : 0;
    int jobs = rounds * B;  // job j: round j / B, plane j % B
    x128* mine = stage + threadIdx.x;
    for (int j = 0; j < CPASYNC_STAGES; j++) {
        int pack = first + (j / B) * stride;
        if (j < jobs && pack < packs) {
            copy16_async(mine + j * CPASYNC_THREADS, dout + (size_t)(j % B) * T * C + (size_t)pack * x128::size);
        }
        commit_async_copies();  // a group per job, empty ones too, so that "all but STAGES - 1" means job j
    }
    float accum[x128::size];
    for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }
    for (int j = 0; j < jobs; j++) {
        int pack = first + (j / B) * stride;
        wait_async_copies_but<CPASYNC_STAGES - 1>();  // job j's group has landed
        if (pack < packs) {
            x128 packed_dout = mine[(j % CPASYNC_STAGES) * CPASYNC_THREADS];
            for (int k = 0; k < x128::size; k++) { accum[k] += (float)packed_dout[k]; }
        }
        // cp.async is not ordered with this thread's other shared-memory accesses: the read above must be complete
        // before the copy below overwrites its slot (as in the chunk kernel's staged form).
        __syncwarp();
        int next = j + CPASYNC_STAGES;
        int next_pack = first + (next / B) * stride;
        if (next < jobs && next_pack < packs) {
            copy16_async(mine + (next % CPASYNC_STAGES) * CPASYNC_THREADS,
                         dout + (size_t)(next % B) * T * C + (size_t)next_pack * x128::size);
        }
        commit_async_copies();
        if (j % B == B - 1) {
            if (pack < packs) {
                int idx = pack * x128::size;
                store_rounded_sum128(dwpe + idx, load128(dwpe + idx), accum, (unsigned int)idx, NOISE_STREAM_DWPE,
                                     seed);
            }
            for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }
        }
    }
}
