// encoder_backward_small.cu: the whole deterministic backward of one short batch (B*T <= 1024 ids) in ONE launch:
// dwte as the chunked method computes it and dwpe as the wpe kernel does, with no bucket table in memory.
//
// What it computes, bit for bit the same as the chunked method's kernels (encoder_backward_wte_chunked.cu on the
// bucket table, and encoder_backward_wpe.cu; the NumPy mirror: gpt2enc_edu/mirror.py). For every token and channel:
//   chunk partial  p = ((0 + d[item 0]) + d[item 1]) + ...      over CHUNK_ITEMS positions of the token, in bt order
//   token total    s = ((p_0 + p_1) + p_2) + ...                 over the token's chunks, in chunk order
//   dwte           = round_to_storage(s + dwte_old)               (for a single chunk, s = p_0)
// and dwpe[t] = round_to_storage((((0 + d[0,t]) + d[1,t]) + ...) + dwpe_old), over b = 0, 1, ..., B-1.
//
// Why one launch: for one sequence the chunked backward was four kernels (the wpe kernel on a side stream; the
// one-block bucket table, the chunk kernel and the combine kernel in a chain), and at B=1 each is a few
// microseconds of mostly fixed cost: a launch, a wait for the kernel before, one block's sort on one SM while the
// other SMs idle. Here every block sorts the batch's keys itself, in shared memory (block_sort.cuh, the one-block
// table's sort), and finds the tokens' segments. All blocks sort the same keys, so they agree on the segments
// without talking to each other: each takes its share of the work by index, and no table, no grid-wide step and
// no second kernel is needed. The sort is repeated on every SM, but at the same time.
//
// Phases of every block:
//   1. The positions sorted by token id: key = (id << 10) | bt (bt ascending inside a token).
//   2. Segments: one per distinct token (a scan of the "new id here" flags).
//   3. The list of "block tokens", seen more than WARP_TASK_MAX_ITEMS times, in segment order (a second scan).
//   4. dwte. A task is a token and a channel group g (WARP_SIZE * x128::size channels):
//      a block token's: one BLOCK per (token, g), one THREAD per 8 bytes of the group's channels and chunk. Thread
//        (slot, j) sums its channels over chunk slot, slot + BLOCK_CHUNK_SLOTS, ... (8 chunks at once in bf16), with
//        all of a chunk's 32 rows loading at once; after each pass the slot-0 thread adds the pass's partials to
//        the total in chunk order (the combine kernel's sum), and at the end the old value, and rounds.
//      any other token's (nearly all): one WARP per (token, g), a 16-byte pack of channels per lane, all of its
//        (at most WARP_TASK_MAX_ITEMS) rows loading at once, finished in registers as the chunk kernel finishes a
//        single-chunk token. Warps are numbered from the grid's last block down, so that the first blocks, which
//        take the block tokens' tasks, get fewer of these.
//      Either way no read waits for another. What bounds a small batch is chains of dependent reads, not bytes:
//      a chunk kernel's warp walks its chunk's rows one by one, each read a memory latency.
//   5. dwpe: one thread per 16-byte pack of the first T rows, over the whole grid (last, so that the dwte tasks,
//      which wait for the sort, start first; at B=1 it is one read per thread).
//
// Why a block token is read a thread per 8 bytes and chunk, 8 chunks at once: summed by one warp its 32 rows were a
// chain of reads; the other forms tried, and what the phases cost: docs/experiments.md, one launch for small
// batches ("one sequence, one launch").
//
// Launch: grid = any number of blocks (the package: as many as fit the GPU at once: one per SM, for the registers
//   of 64 rows in flight), block = SMALL_BACKWARD_THREADS, 25 KB of static shared memory:
//   encoder_backward_small_kernel(dwte, dwpe, inp, dout, B, T, C, seed)
// Requires 1 <= B*T <= SMALL_BACKWARD_MAX_BT, 0 <= ids < 2^22 (so that a key fits 32 bits), C % x128::size == 0
// and 16-byte aligned arrays (all checked in Python). Any grid gives the same bits.
#include "block_sort.cuh"
#include "chunk_sum.cuh"

// SMALL_BACKWARD_THREADS, SMALL_BACKWARD_MAX_BT, the one-block sort's keys (SMALL_KEYS per thread; the position bt
// in the low SMALL_POS_BITS bits, the token id above) and the chunked method's CHUNK_ITEMS: constants.cuh.
#define SMALL_BACKWARD_WARPS (SMALL_BACKWARD_THREADS / WARP_SIZE)
// Tokens seen at most this many times are warp tasks (their rows in flight: 8 x 16 bytes per lane); the others
// block tasks.
#define WARP_TASK_MAX_ITEMS 8
#define MAX_BLOCK_TOKENS (SMALL_BACKWARD_MAX_BT / (WARP_TASK_MAX_ITEMS + 1))
// Chunks a block task sums at once: one thread per 8 bytes of the group's channels and chunk (Pack64 below).
#define GROUP_PACKS64 (WARP_SIZE * x128::size * (int)sizeof(floatX) / 8)
#define BLOCK_CHUNK_SLOTS (SMALL_BACKWARD_THREADS / GROUP_PACKS64)
static_assert(SMALL_BACKWARD_MAX_BT == SMALL_BACKWARD_THREADS * SMALL_KEYS, "two keys per thread");
static_assert(SMALL_BACKWARD_MAX_BT == (1 << SMALL_POS_BITS), "a key holds any position");
static_assert(WARP_TASK_MAX_ITEMS <= CHUNK_ITEMS, "a warp task is a single chunk");

// dwpe's pack at flat index idx = t * C + c: the wpe kernel's sum (encoder_backward_wpe.cu), the B rows in order,
// then the old value, rounded once.
__device__ __forceinline__ void dwpe_pack(floatX* dwpe, const floatX* dout, int B, int T, int C, unsigned int seed,
                                          int idx) {
    int t = idx / C;
    int c = idx % C;
    float accum[x128::size];
    for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }
    for (int b = 0; b < B; b++) {
        x128 packed_dout = load128cs(dout + b * T * C + t * C + c);
        for (int k = 0; k < x128::size; k++) { accum[k] += (float)packed_dout[k]; }
    }
    floatX* dwpe_tc = dwpe + t * C + c;
    store_rounded_sum128(dwpe_tc, load128(dwpe_tc), accum, (unsigned int)idx, NOISE_STREAM_DWPE, seed);
}

// 8 bytes of channels (4 bf16 or 2 fp32): a block task's thread sums these, so that a chunk's 32 rows in flight
// take 64 registers, and 64 threads cover a channel group (8 chunks at once in a block of 512). Held as raw bits
// (uint2): element k as a float is exactly what (float) of the stored element gives.
#define PACK64_SIZE ((int)(8 / sizeof(floatX)))
__device__ __forceinline__ float pack64_element(uint2 bits, int k) {
#ifdef ENC_FP32
    return __uint_as_float(k == 0 ? bits.x : bits.y);
#else
    unsigned int word = k < 2 ? bits.x : bits.y;  // elements 2i, 2i + 1: the low, high half of word i
    return __uint_as_float((k % 2 == 0) ? word << 16 : word & 0xFFFF0000u);
#endif
}

template <>
struct PackOf<uint2> {
    static constexpr int size = PACK64_SIZE;
    static __device__ __forceinline__ float element(uint2 pack, int k) { return pack64_element(pack, k); }
};

// Channels c .. c + PACK64_SIZE - 1 of one chunk (chunk_sum.cuh): sum = ((0 + d[item 0]) + d[item 1]) + ..., the
// n <= CHUNK_ITEMS items' keys at chunk_keys. Every row is asked for before the first add.
__device__ __forceinline__ void chunk_pack_sum(float* sum, const floatX* dout, const unsigned int* chunk_keys, int n,
                                               int C, int c) {
    chunk_sum<CHUNK_ITEMS, uint2>(sum, n, true, [&](int i, uint2& row) {
        row = *reinterpret_cast<const uint2*>(dout + (int)(chunk_keys[i] & SMALL_POS_MASK) * C + c);
    });
}

extern "C" __global__ void __launch_bounds__(SMALL_BACKWARD_THREADS, 1)
    encoder_backward_small_kernel(floatX* dwte, floatX* dwpe, const int* inp, const floatX* dout, int B, int T, int C,
                                  unsigned int seed) {
    __shared__ unsigned int buf[2 * SMALL_BACKWARD_MAX_BT];  // the sort's exchange buffers
    __shared__ unsigned int sorted[SMALL_BACKWARD_MAX_BT];  // the keys, slot by slot
    __shared__ int seg_start[SMALL_BACKWARD_MAX_BT + 1];  // first slot of each segment (and BT after the last)
    __shared__ int block_tokens[MAX_BLOCK_TOKENS];  // the block tokens' segments, in segment order
    __shared__ int scratch[WARP_SIZE + 1];
    __shared__ float partial[BLOCK_CHUNK_SLOTS][WARP_SIZE * x128::size];  // a block task's pass: chunk sums
    wait_for_previous_grid();  // (a no-op: the package launches this kernel the plain way)
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    int first = threadIdx.x * SMALL_KEYS;  // elements first, first + 1 are this thread's
    int BT = B * T;
    int c_per_warp = WARP_SIZE * x128::size;
    int num_groups = CEIL_DIV(C, c_per_warp);

    // 1. The positions sorted by token id (bt ascending inside a token: bt is the key's low bits).
    unsigned int key[SMALL_KEYS];
    block_sort_positions<SMALL_BACKWARD_THREADS, SMALL_KEYS, SMALL_POS_BITS>(inp, BT, key, buf, sorted);
    __syncthreads();

    // 2. Segments: slot p starts one where its id differs from slot p - 1's; one segment per distinct token.
    int head[SMALL_KEYS];
    int heads = segment_heads<SMALL_KEYS, SMALL_POS_BITS>(key, sorted, BT, head);
    int num_distinct;
    int seg = block_exclusive_sum(heads, &num_distinct, scratch);  // this thread's first new segment
    int my_seg[SMALL_KEYS];
#pragma unroll
    for (int q = 0; q < SMALL_KEYS; q++) {
        my_seg[q] = head[q] ? seg : -1;
        if (head[q]) { seg_start[seg++] = first + q; }
    }
    if (threadIdx.x == 0) { seg_start[num_distinct] = BT; }
    __syncthreads();

    // 3. The block tokens, in segment order (a scan of one flag per segment head; heads come in segment order).
    bool is_block_token[SMALL_KEYS];
    int flags = 0;
#pragma unroll
    for (int q = 0; q < SMALL_KEYS; q++) {
        is_block_token[q] = my_seg[q] >= 0 && seg_start[my_seg[q] + 1] - seg_start[my_seg[q]] > WARP_TASK_MAX_ITEMS;
        flags += is_block_token[q];
    }
    int num_block_tokens;
    int slot_of_token = block_exclusive_sum(flags, &num_block_tokens, scratch);
#pragma unroll
    for (int q = 0; q < SMALL_KEYS; q++) {
        if (is_block_token[q]) { block_tokens[slot_of_token++] = my_seg[q]; }
    }
    __syncthreads();

    // 4a. Block tokens: task (b, g) = b * num_groups + g is block task % gridDim.x's. Every bound below is the same
    //     for the whole block, so every thread meets every barrier.
    int chunk_slot = threadIdx.x / GROUP_PACKS64;
    int j = (threadIdx.x % GROUP_PACKS64) * PACK64_SIZE;  // this thread's first channel in the group
    for (int task = blockIdx.x; task < num_block_tokens * num_groups; task += gridDim.x) {
        int s = block_tokens[task / num_groups];
        int c = (task % num_groups) * c_per_warp + j;
        int start = seg_start[s];
        int count = seg_start[s + 1] - start;
        int num_chunks = CEIL_DIV(count, CHUNK_ITEMS);
        int ix = (int)(sorted[start] >> SMALL_POS_BITS);
        bool finisher = chunk_slot == 0 && c < C;  // adds the partials, the old value, and rounds
        floatX* dwte_ix = dwte + ix * C + c;
        uint2 old;
        if (finisher) { old = *reinterpret_cast<const uint2*>(dwte_ix); }  // early: overlaps the sums below
        float total[PACK64_SIZE];
        for (int pass = 0; pass < num_chunks; pass += BLOCK_CHUNK_SLOTS) {
            int chunk = pass + chunk_slot;
            if (chunk < num_chunks && c < C) {
                int chunk_first = chunk * CHUNK_ITEMS;
                float sum[PACK64_SIZE];
                chunk_pack_sum(sum, dout, sorted + start + chunk_first, min(CHUNK_ITEMS, count - chunk_first), C, c);
                for (int k = 0; k < PACK64_SIZE; k++) { partial[chunk_slot][j + k] = sum[k]; }
            }
            __syncthreads();
            if (finisher) {  // this pass's partials, in chunk order: total = p_0, then total += p_1, ...
                for (int q = 0; q < BLOCK_CHUNK_SLOTS && pass + q < num_chunks; q++) {
                    for (int k = 0; k < PACK64_SIZE; k++) {
                        total[k] = pass + q == 0 ? partial[q][j + k] : total[k] + partial[q][j + k];
                    }
                }
            }
            __syncthreads();  // the partials are read before the next pass overwrites them
        }
        if (finisher) {
            floatX rounded[PACK64_SIZE];
            for (int k = 0; k < PACK64_SIZE; k++) {
                round_to_storage(total[k] + pack64_element(old, k), &rounded[k], (unsigned int)(ix * C + c + k),
                                 NOISE_STREAM_DWTE, seed);
            }
            for (int k = 0; k < PACK64_SIZE; k++) { dwte_ix[k] = rounded[k]; }
        }
    }

    // 4b. The other tokens: task (s, g) = s * num_groups + g is warp task % (all warps)'s, warps numbered from the
    //     grid's last block down. A block token's tasks were done above: skipped.
    int num_warps = gridDim.x * SMALL_BACKWARD_WARPS;
    int warp_id = (gridDim.x - 1 - blockIdx.x) * SMALL_BACKWARD_WARPS + warp;
    for (int task = warp_id; task < num_distinct * num_groups; task += num_warps) {
        int s = task / num_groups;
        int start = seg_start[s];
        int count = seg_start[s + 1] - start;
        if (count > WARP_TASK_MAX_ITEMS) { continue; }  // the whole warp: count is the same for every lane
        int ix = (int)(sorted[start] >> SMALL_POS_BITS);
        int c = (task % num_groups) * c_per_warp + lane * x128::size;
        if (c >= C) { continue; }  // lanes past C (in the last group of a C that is no multiple) have nothing to do
        floatX* dwte_ix = dwte + ix * C + c;
        x128 packed_dwte = load128(dwte_ix);
        // A single chunk, all of its rows in flight (chunk_sum.cuh): accum = ((0 + d[item 0]) + d[item 1]) + ...
        float accum[x128::size];
        chunk_sum<WARP_TASK_MAX_ITEMS, x128>(accum, count, true, [&](int i, x128& row) {
            row = load128cs(dout + (int)(sorted[start + i] & SMALL_POS_MASK) * C + c);
        });
        store_rounded_sum128(dwte_ix, packed_dwte, accum, (unsigned int)(ix * C + c), NOISE_STREAM_DWTE, seed);
    }

    // 5. dwpe: one thread per 16-byte pack of the first T rows, over the whole grid.
    int num_threads = gridDim.x * SMALL_BACKWARD_THREADS;
    for (int idx = (blockIdx.x * SMALL_BACKWARD_THREADS + threadIdx.x) * x128::size; idx < T * C;
         idx += num_threads * x128::size) {
        dwpe_pack(dwpe, dout, B, T, C, seed, idx);
    }
}
