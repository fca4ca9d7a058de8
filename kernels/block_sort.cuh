// block_sort.cuh: a bitonic sort of one block's keys in registers and shared memory (device-only header).
//
// Used by the kernels that sort the positions of one short sequence inside a block: bucketing_small.cu (the
// one-block bucket table) and encoder_backward_small.cu (the chunked backward in one launch, whose every
// block sorts the same keys). N = THREADS * KEYS elements; thread i holds elements KEYS*i .. KEYS*i + KEYS - 1.
//
// The network: rounds k = 2, 4, ..., N, and in each round steps j = k/2, ..., 1 that compare-exchange elements
// p and p ^ j (the lower index keeps the smaller key where (p & k) == 0, the larger elsewhere). For N = 1024 at
// 2 keys per thread, of the 55 steps the partner is in the same thread for the 10 with j = 1 (a register swap),
// in the same warp for the 35 with 2 <= j < 64 (a __shfl_xor_sync, no barrier), and in another warp only for
// the 10 with j >= 64 (shared memory, one __syncthreads each; two buffers alternate so that a step's writes never
// meet the reads of the step before). With unique keys the sorted order has one answer.
//
// block_sort_positions builds the keys (id << POS_BITS) | position and sorts them; segment_heads then marks where each
// id's run of sorted slots starts, which both kernels read as one segment per distinct token.
#pragma once

#include "common.cuh"

// Put the pair (a, b) in the order the direction asks: ascending leaves the smaller key in a.
__device__ __forceinline__ void compare_exchange(unsigned int& a, unsigned int& b, bool ascending) {
    unsigned int lo = min(a, b), hi = max(a, b);
    a = ascending ? lo : hi;
    b = ascending ? hi : lo;
}

// Sort the block's THREADS * KEYS elements ascending. Thread i passes the keys of its KEYS elements in key[] and
// gets the keys of those ranks back; pad unused elements with 0xFFFFFFFF so that they sort last. Every thread
// calls it. The network is the same for every call, so it is unrolled completely: every k, j and direction below
// is a constant for the compiler, and a step costs a few instructions. buf: 2 * THREADS * KEYS words of shared
// memory, free again when it returns.
template <int THREADS, int KEYS>
__device__ void block_bitonic_sort(unsigned int (&key)[KEYS], unsigned int* buf) {
    constexpr int N = THREADS * KEYS;
    constexpr int WARP_SPAN = WARP_SIZE * KEYS;  // steps with j below this stay inside a warp
    static_assert((N & (N - 1)) == 0 && (KEYS & (KEYS - 1)) == 0, "a bitonic network wants powers of two");
    int first = threadIdx.x * KEYS;  // this thread's first element
    int parity = 0;
#pragma unroll
    for (int k = 2; k <= N; k <<= 1) {  // round k: sorted runs of k/2 become sorted runs of k
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            if (j < KEYS) {  // both elements of every pair are this thread's: swap registers
#pragma unroll
                for (int q = 0; q < KEYS; q++) {
                    if ((q & j) == 0) { compare_exchange(key[q], key[q | j], ((first + q) & k) == 0); }
                }
                continue;
            }
            // j >= KEYS: element first + q pairs with element (first + q) ^ j, slot q of another thread
            unsigned int other[KEYS];
            if (j < WARP_SPAN) {
#pragma unroll
                for (int q = 0; q < KEYS; q++) { other[q] = __shfl_xor_sync(0xffffffffu, key[q], j / KEYS); }
            } else {
                unsigned int* step = buf + parity * N;
                parity ^= 1;
#pragma unroll
                for (int q = 0; q < KEYS; q++) { step[first + q] = key[q]; }
                __syncthreads();
#pragma unroll
                for (int q = 0; q < KEYS; q++) { other[q] = step[(first + q) ^ j]; }
            }
            bool keep_min = ((first & j) == 0) == ((first & k) == 0);  // the same for all of the thread's elements
#pragma unroll
            for (int q = 0; q < KEYS; q++) { key[q] = keep_min ? min(key[q], other[q]) : max(key[q], other[q]); }
        }
    }
    __syncthreads();  // every exchange is read: buf may be reused right after
}

// The positions 0 .. n-1 of one sequence of ids sorted by id, bt ascending inside an id: key = (id << POS_BITS) | p,
// padding (elements n and on) 0xFFFFFFFF, sorting last. Thread i gets the keys of elements KEYS*i .. in key[] and
// writes them to sorted[] too; the caller's next barrier publishes sorted[]. Requires n <= THREADS * KEYS =
// 1 << POS_BITS and ids below 1 << (32 - POS_BITS). buf as for block_bitonic_sort.
template <int THREADS, int KEYS, int POS_BITS>
__device__ __forceinline__ void block_sort_positions(const int* inp, int n, unsigned int (&key)[KEYS],
                                                     unsigned int* buf, unsigned int* sorted) {
    int first = threadIdx.x * KEYS;
#pragma unroll
    for (int q = 0; q < KEYS; q++) {
        int p = first + q;
        key[q] = p < n ? ((unsigned int)inp[p] << POS_BITS) | (unsigned int)p : 0xFFFFFFFFu;
    }
    block_bitonic_sort<THREADS, KEYS>(key, buf);
#pragma unroll
    for (int q = 0; q < KEYS; q++) { sorted[first + q] = key[q]; }
}

// The segments of the sorted keys, one per distinct id: head[q] = 1 where slot first + q (below n) starts one, its
// id differing from the slot before's; returns how many of this thread's slots do. Reads sorted[], which the caller
// has published with a barrier.
template <int KEYS, int POS_BITS>
__device__ __forceinline__ int segment_heads(const unsigned int (&key)[KEYS], const unsigned int* sorted, int n,
                                             int (&head)[KEYS]) {
    int first = threadIdx.x * KEYS;
    int heads = 0;
#pragma unroll
    for (int q = 0; q < KEYS; q++) {
        int p = first + q;
        head[q] = p < n && (p == 0 || (key[q] >> POS_BITS) != (sorted[p - 1] >> POS_BITS));
        heads += head[q];
    }
    return heads;
}
