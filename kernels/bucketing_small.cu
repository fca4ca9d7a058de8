// bucketing_small.cu: the bucket table of one sequence (B*T <= 1024 ids), built by ONE block in one launch.
//
// Produces exactly the table of gpt2enc_edu/buckets.py, bucketing.cu and bucketing_scatter.cu (same order,
// same bits). At B = 1 the fixed costs are everything: the scatter route is seven dependent launches of
// 1-4 us each, so this kernel does the whole table in one block, in registers and shared memory, with two
// sorts of 1024 keys that are mostly warp shuffles.
//
// Thread i holds one key; the block sorts its 1024 keys with a bitonic network (block_bitonic_sort): a
// compare-exchange of keys i and i ^ j for j = k/2, k/4, ..., 1 in rounds k = 2, 4, ..., n. While j < 32 the
// partner is in the same warp (a __shfl_xor_sync, no barrier); only the 15 steps with j >= 32 go through
// shared memory, one __syncthreads each (two buffers alternate, so a step's writes never meet the reads of the
// step before). Every key is unique, so "sorted" has one answer and the NumPy twin can follow step by step.
//
// Phases (`stop_after` = k > 0 ends the kernel after phase k, < 0 at once; gpt2enc_edu.gpu_buckets.phase_times_us
// times these truncated runs):
//   1. Sort the positions by token id: key = (id << SMALL_POS_BITS) | bt. Equal ids stay in ascending bt,
//      because bt is the key's low bits.
//   2. Segments: one per distinct token, in id order; seg_start[s] = first sorted slot of token s (a scan of the
//      "new id here" flags).
//   3. Sort the segments by count descending, ties by id: key = ((SMALL_THREADS - count) << SMALL_POS_BITS) | s
//      (segments are in id order, so s breaks the ties). Thread r now holds the token of rank r.
//   4. Rank r's start in bt_list and its first unit (one scan of two packed 16-bit fields), its buckets and units.
//   5. bt_list: every sorted position moves to its token's new start plus its place inside the segment.
//
// Launch: one block of SMALL_THREADS = 1024 threads, 36 KB of static shared memory:
//   bucketing_small_kernel(inp, BT, num_c_groups, bucket_info, units, bt_list, counters, stop_after)
// Requires 1 <= BT <= SMALL_MAX_BT and ids < SMALL_MAX_V (checked by the package). counters as in bucketing.cu.
#include "common.cuh"

#define SMALL_THREADS 1024
// One key per thread: a position bt < SMALL_MAX_BT is its low SMALL_POS_BITS bits, an id < SMALL_MAX_V =
// 2^(32 - SMALL_POS_BITS) the high bits. SMALL_NO_KEY sorts after every real key.
#define SMALL_MAX_BT 1024
#define SMALL_POS_BITS 10
#define SMALL_MAX_V 4194304
#define SMALL_POS_MASK ((1u << SMALL_POS_BITS) - 1u)
#define SMALL_NO_KEY 0xFFFFFFFFu
#define SMALL_CHUNK_ITEMS 32
// Phase 4 scans count | chunks << SMALL_FIELD_BITS at once: both sums are <= 1024, so the fields never mix.
#define SMALL_FIELD_BITS 16

// counters[] slots, as in bucketing.cu
#define SMALL_COUNTER_NUM_DISTINCT 0
#define SMALL_COUNTER_MAX_COUNT 1
#define SMALL_COUNTER_NUM_CLASSES 2
#define SMALL_COUNTER_NUM_BUCKETS 3
#define SMALL_COUNTER_NUM_UNITS 4

// The smallest power of two >= n (n >= 1): the size of the sorting network that n keys need.
__device__ int network_size(int n) { return n <= 1 ? 1 : 1 << (32 - __clz(n - 1)); }

// Sort the block's keys ascending (thread i gives `key`, gets the key of rank i back), over the first n
// threads (n a power of two; the keys of threads >= n must be SMALL_NO_KEY, and stay so). Every thread calls it.
// buf: 2 * SMALL_THREADS words of shared memory, free again when it returns.
__device__ unsigned int block_bitonic_sort(unsigned int key, int n, unsigned int* buf) {
    int i = threadIdx.x;
    int parity = 0;
    for (int k = 2; k <= n; k <<= 1) {  // round k: sorted runs of k/2 become sorted runs of k
        bool ascending = (i & k) == 0;  // runs alternate direction, so two of them form a bitonic sequence
        for (int j = k >> 1; j > 0; j >>= 1) {
            unsigned int other;
            if (j >= WARP_SIZE) {  // the partner is in another warp
                unsigned int* step = buf + parity * SMALL_THREADS;
                parity ^= 1;
                step[i] = key;
                __syncthreads();
                other = step[i ^ j];
            } else {
                other = __shfl_xor_sync(0xffffffffu, key, j);
            }
            bool lower = (i & j) == 0;  // the lower of the pair keeps the smaller key in an ascending run
            key = lower == ascending ? min(key, other) : max(key, other);
        }
    }
    __syncthreads();  // every exchange is read: buf may be reused right after
    return key;
}

extern "C" __global__ void __launch_bounds__(SMALL_THREADS)
    bucketing_small_kernel(const int* inp, int BT, int num_c_groups, int4* bucket_info, int4* units, int* bt_list,
                           int* counters, int stop_after) {
    __shared__ unsigned int buf[2 * SMALL_THREADS];  // the sorts' exchange buffers
    __shared__ unsigned int sorted[SMALL_THREADS];  // phase 1's keys, slot by slot
    __shared__ int seg_start[SMALL_THREADS + 1];  // first slot of each segment (and BT after the last)
    __shared__ int seg_new_start[SMALL_THREADS];  // each segment's start in bt_list
    __shared__ int4 rank_row[SMALL_THREADS];  // rank r: (start, count, ix, first unit)
    __shared__ int scratch[WARP_SIZE + 1];
    if (stop_after < 0) { return; }  // an empty run: what the launch alone costs
    int i = threadIdx.x;

    // Phase 1: positions sorted by token id (bt ascending inside a token). Padding keys sort last.
    unsigned int key = i < BT ? ((unsigned int)inp[i] << SMALL_POS_BITS) | (unsigned int)i : SMALL_NO_KEY;
    key = block_bitonic_sort(key, network_size(BT), buf);
    sorted[i] = key;
    __syncthreads();
    if (stop_after == 1) { return; }

    // Phase 2: slot i starts a segment where its id differs from slot i - 1's.
    int head = i < BT && (i == 0 || (key >> SMALL_POS_BITS) != (sorted[i - 1] >> SMALL_POS_BITS));
    int num_distinct;
    int heads_before = block_exclusive_sum(head, &num_distinct, scratch);
    int seg = heads_before + head - 1;  // the segment of slot i (a head starts segment heads_before)
    if (head) { seg_start[heads_before] = i; }
    if (i == 0) { seg_start[num_distinct] = BT; }
    __syncthreads();
    if (stop_after == 2) { return; }

    // Phase 3: segments sorted by count descending, ties by segment (= id) ascending.
    unsigned int token_key = SMALL_NO_KEY;
    if (i < num_distinct) {
        int count = seg_start[i + 1] - seg_start[i];
        token_key = ((unsigned int)(SMALL_THREADS - count) << SMALL_POS_BITS) | (unsigned int)i;
    }
    token_key = block_bitonic_sort(token_key, network_size(num_distinct), buf);
    if (stop_after == 3) { return; }

    // Phase 4: thread r holds rank r. Its start in bt_list and first unit: one scan of count | chunks << 16.
    int r = i;
    bool real = r < num_distinct;
    int s = (int)(token_key & SMALL_POS_MASK);
    int count = real ? SMALL_THREADS - (int)(token_key >> SMALL_POS_BITS) : 0;
    int chunks = CEIL_DIV(count, SMALL_CHUNK_ITEMS);
    buf[r] = token_key;  // for rank r + 1's class test below
    int packed_total;
    int packed = block_exclusive_sum(count | (chunks << SMALL_FIELD_BITS), &packed_total, scratch);  // syncs
    int start = packed & ((1 << SMALL_FIELD_BITS) - 1);
    int unit = packed >> SMALL_FIELD_BITS;
    // A class is the tokens of one count: a new one starts where the count differs from rank r - 1's.
    int class_head = real && (r == 0 || (buf[r - 1] >> SMALL_POS_BITS) != (token_key >> SMALL_POS_BITS));
    int ix = real ? (int)(sorted[seg_start[s]] >> SMALL_POS_BITS) : 0;
    if (real) {
        seg_new_start[s] = start;
        rank_row[r] = make_int4(start, count, ix, unit);
    }
    int num_classes = __syncthreads_count(class_head);  // also: seg_new_start and rank_row are complete
    if (i == 0) {
        counters[SMALL_COUNTER_NUM_DISTINCT] = num_distinct;
        counters[SMALL_COUNTER_MAX_COUNT] = SMALL_THREADS - (int)(token_key >> SMALL_POS_BITS);  // rank 0's
        counters[SMALL_COUNTER_NUM_CLASSES] = num_classes;
        counters[SMALL_COUNTER_NUM_BUCKETS] = num_distinct * num_c_groups;
        counters[SMALL_COUNTER_NUM_UNITS] = packed_total >> SMALL_FIELD_BITS;
    }
    // Bucket rows: thread i writes rows i, i + 1024, ..., so a warp stores 512 contiguous bytes.
    for (int row = i; row < num_distinct * num_c_groups; row += SMALL_THREADS) {
        int4 ranked = rank_row[row / num_c_groups];
        bucket_info[row] = make_int4(ranked.x, ranked.y, ranked.z, row % num_c_groups);
    }
    // Units: rank r's chunks (one for all but the tokens seen more than 32 times).
    for (int chunk = 0; chunk < chunks; chunk++) { units[unit + chunk] = make_int4(ix, chunk, start, count); }
    if (stop_after == 4) { return; }

    // Phase 5: bt_list. Sorted slot i moves to its token's new start plus its place inside the segment.
    if (i < BT) { bt_list[seg_new_start[seg] + (i - seg_start[seg])] = (int)(key & SMALL_POS_MASK); }
}
