// bucketing_small.cu: the bucket table of a small batch (B*T <= 8192 ids, V <= 65536), built by ONE block.
//
// Produces exactly the table of gpt2enc_edu/buckets.py and of bucketing.cu (same order, same bits), with no
// grid-wide barrier: at B = 1 the cooperative kernel of bucketing.cu spends ~50 us in its ~20 grid barriers,
// this one ~18 us on an H200 (docs/performance.md has the per-phase costs).
//
// Phases (each ends with __syncthreads; `stop_after` = k > 0 ends the kernel after phase k, < 0 at once;
// gpt2enc_edu.gpu_buckets.phase_times_us times these truncated runs):
//   1. Sort the positions by token id, stably. Key = (id << SMALL_POS_BITS) | bt: an LSD radix sort on the
//      id bits only, SMALL_DIGIT_BITS per pass, keeps equal ids in ascending bt (the keys start in bt order).
//   2. Segments: one per distinct token, in id order; seg_start[s] = first sorted slot of token s.
//   3. Sort the segments by count descending, ties by id (again a stable radix sort, of the keys
//      ((max_count - count) << SMALL_POS_BITS) | s on the count bits): the bucket order.
//   4. For each token in bucket order: its start in bt_list (a scan of the counts), its buckets and units.
//   5. bt_list: every sorted position moves to its token's new start plus its place inside the segment.
//
// One radix pass (sort_pass): thread i holds the keys i, i + 1024, ... (tile j = keys j*1024 .. j*1024+1023).
// Inside a warp, ballots on the digit's bits rank the lanes with the same digit; the counts per
// (digit, tile, warp), scanned in that order, give every key its stable place.
//
// Launch: one block of SMALL_THREADS = 1024 threads, dynamic shared memory bucketing_small_smem_bytes(BT)
//   (= 4 * (6 * n_pad + 1 + SMALL_CNT + 64) bytes with n_pad = CEIL_DIV(BT, 1024) * 1024: 213 KB at
//   BT = 8192, so the package takes this kernel only where the device allows that much):
//   bucketing_small_kernel(inp, BT, V, num_c_groups, bucket_info, units, bt_list, counters, stop_after)
// Requires 1 <= BT <= SMALL_MAX_BT and V <= 65536 (checked by the package). counters as in bucketing.cu.
#include "common.cuh"

#define SMALL_THREADS 1024
#define SMALL_WARPS (SMALL_THREADS / WARP_SIZE)
#define SMALL_MAX_ITEMS 8
#define SMALL_MAX_BT (SMALL_MAX_ITEMS * SMALL_THREADS)
#define SMALL_POS_BITS 13
#define SMALL_DIGIT_BITS 4
#define SMALL_DIGITS (1 << SMALL_DIGIT_BITS)
#define SMALL_CNT (SMALL_DIGITS * SMALL_MAX_ITEMS * SMALL_WARPS)
#define SMALL_CHUNK_ITEMS 32
#define SMALL_NO_KEY 0xFFFFFFFFu

// counters[] slots, as in bucketing.cu
#define SMALL_COUNTER_NUM_DISTINCT 0
#define SMALL_COUNTER_MAX_COUNT 1
#define SMALL_COUNTER_NUM_CLASSES 2
#define SMALL_COUNTER_NUM_BUCKETS 3
#define SMALL_COUNTER_NUM_UNITS 4

// One stable pass over keys[0 .. items * SMALL_THREADS) by the digit (key >> shift) & (SMALL_DIGITS - 1).
__device__ void sort_pass(unsigned int* keys, int items, int shift, int* cnt, int* scratch) {
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    unsigned int key[SMALL_MAX_ITEMS];
    int digit[SMALL_MAX_ITEMS];
    int rank[SMALL_MAX_ITEMS];
#pragma unroll
    for (int i = 0; i < SMALL_MAX_ITEMS; i++) {
        if (i < items) { key[i] = keys[i * SMALL_THREADS + threadIdx.x]; }
    }
    for (int j = threadIdx.x; j < SMALL_CNT; j += SMALL_THREADS) { cnt[j] = 0; }
    __syncthreads();  // every key is in registers before any is overwritten, and cnt is clear
#pragma unroll
    for (int i = 0; i < SMALL_MAX_ITEMS; i++) {
        if (i < items) {  // uniform: the whole warp takes part in the match
            digit[i] = (int)((key[i] >> shift) & (SMALL_DIGITS - 1));
            // The lanes with the same digit: one ballot per digit bit (cheaper than __match_any_sync).
            unsigned int peers = 0xffffffffu;
#pragma unroll
            for (int bit = 0; bit < SMALL_DIGIT_BITS; bit++) {
                unsigned int vote = __ballot_sync(0xffffffffu, (digit[i] >> bit) & 1);
                peers &= ((digit[i] >> bit) & 1) ? vote : ~vote;
            }
            rank[i] = __popc(peers & ((1u << lane) - 1u));
            if (rank[i] == 0) { cnt[(digit[i] * SMALL_MAX_ITEMS + i) * SMALL_WARPS + warp] = __popc(peers); }
        }
    }
    __syncthreads();
    // Exclusive scan of cnt in (digit, tile, warp) order: each thread owns 4 consecutive counts.
    const int per = SMALL_CNT / SMALL_THREADS;
    int local[per];
    int sum = 0;
    for (int q = 0; q < per; q++) {
        local[q] = sum;
        sum += cnt[threadIdx.x * per + q];
    }
    int unused;
    int base = block_exclusive_sum(sum, &unused, scratch);
    for (int q = 0; q < per; q++) { cnt[threadIdx.x * per + q] = base + local[q]; }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < SMALL_MAX_ITEMS; i++) {
        if (i < items) { keys[cnt[(digit[i] * SMALL_MAX_ITEMS + i) * SMALL_WARPS + warp] + rank[i]] = key[i]; }
    }
    __syncthreads();
}

// Sort keys[0 .. items * SMALL_THREADS) by the bits from `low_bit` up to `low_bit + bits`, stably.
__device__ void sort_bits(unsigned int* keys, int items, int low_bit, int bits, int* cnt, int* scratch) {
    for (int shift = low_bit; shift < low_bit + bits; shift += SMALL_DIGIT_BITS) {
        sort_pass(keys, items, shift, cnt, scratch);
    }
}

// Number of bits needed to write values 0 .. max_value.
__device__ int bits_for(unsigned int max_value) { return max_value == 0u ? 0 : 32 - __clz(max_value); }

extern "C" __global__ void __launch_bounds__(SMALL_THREADS)
    bucketing_small_kernel(const int* inp, int BT, int V, int num_c_groups, int4* bucket_info, int4* units,
                           int* bt_list, int* counters, int stop_after) {
    extern __shared__ int smem[];
    if (stop_after < 0) { return; }  // an empty run: what the launch alone costs
    int items = CEIL_DIV(BT, SMALL_THREADS);
    int n_pad = items * SMALL_THREADS;
    unsigned int* keys = reinterpret_cast<unsigned int*>(smem);  // [n_pad]   positions, sorted by id
    unsigned int* token_keys = keys + n_pad;  // [n_pad]   segments, sorted by count
    int* seg_start = smem + 2 * n_pad;  // [n_pad+1] first slot of each segment
    int* seg_new_start = seg_start + n_pad + 1;  // [n_pad]   its start in bt_list
    int* seg_of = seg_new_start + n_pad;  // [n_pad]   segment of each sorted slot
    int* rank_unit = seg_of + n_pad;  // [n_pad]   first unit of each rank
    int* cnt = rank_unit + n_pad;  // [SMALL_CNT]
    int* scratch = cnt + SMALL_CNT;  // [33] + shared scalars
    int* shared_max = scratch + WARP_SIZE + 1;
    int total;

    // Phase 1: positions sorted by token id (bt ascending inside a token). Padding keys sort last.
    for (int j = threadIdx.x; j < n_pad; j += SMALL_THREADS) {
        keys[j] = j < BT ? ((unsigned int)inp[j] << SMALL_POS_BITS) | (unsigned int)j : SMALL_NO_KEY;
    }
    if (threadIdx.x == 0) { *shared_max = 0; }
    __syncthreads();
    sort_bits(keys, items, SMALL_POS_BITS, bits_for((unsigned int)(V - 1)), cnt, scratch);
    if (stop_after == 1) { return; }

    // Phase 2: segments. Thread i owns the sorted slots i*items .. i*items + items - 1 (a scan needs them
    // consecutive); a slot starts a segment where its id differs from the slot before.
    int first = threadIdx.x * items;
    int heads = 0;
    for (int q = 0; q < items; q++) {
        int j = first + q;
        heads += j < BT && (j == 0 || (keys[j] >> SMALL_POS_BITS) != (keys[j - 1] >> SMALL_POS_BITS));
    }
    int seg = block_exclusive_sum(heads, &total, scratch);
    int num_distinct = total;
    for (int q = 0; q < items; q++) {
        int j = first + q;
        if (j < BT && (j == 0 || (keys[j] >> SMALL_POS_BITS) != (keys[j - 1] >> SMALL_POS_BITS))) {
            seg_start[seg++] = j;
        }
        if (j < BT) { seg_of[j] = seg - 1; }
    }
    if (threadIdx.x == 0) { seg_start[num_distinct] = BT; }
    __syncthreads();
    for (int s = threadIdx.x; s < num_distinct; s += SMALL_THREADS) {
        atomicMax(shared_max, seg_start[s + 1] - seg_start[s]);  // order-free: a maximum
    }
    __syncthreads();
    int max_count = *shared_max;
    if (stop_after == 2) { return; }

    // Phase 3: segments sorted by count descending; the keys start in id order, so ties keep it.
    int token_items = CEIL_DIV(num_distinct, SMALL_THREADS);
    for (int s = threadIdx.x; s < token_items * SMALL_THREADS; s += SMALL_THREADS) {
        token_keys[s] = s < num_distinct
                            ? ((unsigned int)(max_count - (seg_start[s + 1] - seg_start[s])) << SMALL_POS_BITS) | s
                            : SMALL_NO_KEY;
    }
    __syncthreads();
    sort_bits(token_keys, token_items, SMALL_POS_BITS, bits_for((unsigned int)(max_count - 1)), cnt, scratch);
    if (stop_after == 3) { return; }

    // Phase 4: ranks in bucket order. Thread i owns ranks i*token_items .. + token_items - 1 for the two
    // scans (each token's start in bt_list, its first unit; a new count value starts a class), which are
    // kept per segment and per rank; then the table rows are written rank by rank across the threads
    // (thread i writes rank i, i + 1024, ...), so that a warp's stores are neighbours.
    int first_rank = threadIdx.x * token_items;
    int count_sum = 0, unit_sum = 0, class_sum = 0;
    for (int q = 0; q < token_items; q++) {
        int r = first_rank + q;
        if (r < num_distinct) {
            int count = max_count - (int)(token_keys[r] >> SMALL_POS_BITS);
            count_sum += count;
            unit_sum += CEIL_DIV(count, SMALL_CHUNK_ITEMS);
            class_sum += r == 0 || token_keys[r] >> SMALL_POS_BITS != token_keys[r - 1] >> SMALL_POS_BITS;
        }
    }
    int num_units, num_classes;
    int start = block_exclusive_sum(count_sum, &total, scratch);
    int unit = block_exclusive_sum(unit_sum, &num_units, scratch);
    block_exclusive_sum(class_sum, &num_classes, scratch);
    for (int q = 0; q < token_items; q++) {
        int r = first_rank + q;
        if (r < num_distinct) {
            int count = max_count - (int)(token_keys[r] >> SMALL_POS_BITS);
            seg_new_start[token_keys[r] & ((1u << SMALL_POS_BITS) - 1u)] = start;
            rank_unit[r] = unit;
            start += count;
            unit += CEIL_DIV(count, SMALL_CHUNK_ITEMS);
        }
    }
    if (threadIdx.x == 0) {
        counters[SMALL_COUNTER_NUM_DISTINCT] = num_distinct;
        counters[SMALL_COUNTER_MAX_COUNT] = max_count;
        counters[SMALL_COUNTER_NUM_CLASSES] = num_classes;
        counters[SMALL_COUNTER_NUM_BUCKETS] = num_distinct * num_c_groups;
        counters[SMALL_COUNTER_NUM_UNITS] = num_units;
    }
    __syncthreads();
    // Bucket rows: thread i writes rows i, i + 1024, ... of bucket_info, so a warp stores 512 contiguous bytes.
    for (int row = threadIdx.x; row < num_distinct * num_c_groups; row += SMALL_THREADS) {
        int r = row / num_c_groups;
        int s = (int)(token_keys[r] & ((1u << SMALL_POS_BITS) - 1u));
        int ix = (int)(keys[seg_start[s]] >> SMALL_POS_BITS);
        bucket_info[row] = make_int4(seg_new_start[s], seg_start[s + 1] - seg_start[s], ix, row % num_c_groups);
    }
    // Units: thread i writes the units of ranks i, i + 1024, ... (one unit for most tokens: neighbours again).
    for (int r = threadIdx.x; r < num_distinct; r += SMALL_THREADS) {
        int s = (int)(token_keys[r] & ((1u << SMALL_POS_BITS) - 1u));
        int token_start = seg_new_start[s];
        int count = seg_start[s + 1] - seg_start[s];
        int ix = (int)(keys[seg_start[s]] >> SMALL_POS_BITS);
        for (int chunk = 0; chunk < CEIL_DIV(count, SMALL_CHUNK_ITEMS); chunk++) {
            units[rank_unit[r] + chunk] = make_int4(ix, chunk, token_start, count);
        }
    }
    if (stop_after == 4) { return; }

    // Phase 5: bt_list. Each sorted slot moves to its token's new start plus its place inside the segment.
    for (int j = threadIdx.x; j < BT; j += SMALL_THREADS) {
        int sj = seg_of[j];
        bt_list[seg_new_start[sj] + (j - seg_start[sj])] = (int)(keys[j] & ((1u << SMALL_POS_BITS) - 1u));
    }
}
