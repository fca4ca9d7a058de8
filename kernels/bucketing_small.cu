// bucketing_small.cu: the bucket table of one sequence (B*T <= 1024 ids), built by ONE block in one launch.
//
// Produces exactly the table of gpt2enc_edu/buckets.py, bucketing.cu and bucketing_scatter.cu (same order,
// same bits). At B = 1 fixed costs are everything: the scatter route is seven dependent steps of 1-4 us each,
// so this kernel builds the whole table in one block, in registers and shared memory: one sort of the positions,
// then ranks of the tokens by count classes.
//
// Layout: SMALL_THREADS = 512 threads, SMALL_KEYS = 2 consecutive elements per thread (thread i holds
// elements 2i and 2i+1: slots, segments or ranks, depending on the phase; phase 3 holds segments i and i + 512).
// The kernel runs on one SM and is
// bound by how fast its warps can issue dependent steps, so the split is a trade: more keys per thread turn more
// sorting steps into register swaps and keep more steps inside a warp, fewer keys give the SM more warps to
// switch between while a shuffle or a barrier is pending. 512 x 2 was the fastest of 256 x 4, 512 x 2 and 1024 x 1
// (docs/experiments.md, bucket table: "one-block route: its block shape and the bitonic network").
//
// The sort is block_sort.cuh's bitonic network over all 1024 elements (padding keys sort last): of its 55 steps, 10
// are register swaps, 35 shuffles inside a warp and 10 go through shared memory. Every key is unique, so the sorted
// order has one answer. (encoder_backward_small.cu sorts the same keys the same way in every block.)
//
// Phases (`stop_after` = k > 0 ends the kernel after phase k, < 0 at once; gpt2enc_edu.gpu_buckets.phase_times_us
// times these truncated runs):
//   1. Sort the positions by token id: key = (id << SMALL_POS_BITS) | bt. Equal ids stay in ascending bt,
//      because bt is the key's low bits.
//   2. Segments: one per distinct token, in id order; seg_start[s] = first sorted slot of token s (a scan of the
//      "new id here" flags).
//   3. Rank the segments by count descending, ties by id, with count classes (as bucketing_scatter.cu does):
//      class c = the tokens seen c <= 32 times, which come in classes 32, 31, ..., 1 and by id inside a class,
//      after the few "big" tokens (seen more often), ranked by comparing them with each other. Element r then
//      holds the key ((SMALL_MAX_BT - count) << SMALL_POS_BITS) | s of the token of rank r. (A second bitonic
//      sort of these keys gives the same order, with eleven barriers instead of four.)
//   4. Rank r's start in bt_list and its first unit (one scan of two packed fields), its units and (where asked) its
//      bucket rows. The chunked wte kernels read only the units and bt_list, so the package asks for the bucket
//      rows only for the bucketed method: one SM writing 3 rows per token is a visible share of the kernel.
//   5. bt_list: every sorted position moves to its token's new start plus its place inside the segment.
//
// Launch: one block of SMALL_THREADS threads, 41 KB of static shared memory:
//   bucketing_small_kernel(inp, BT, num_c_groups, bucket_info, units, bt_list, counters, write_bucket_rows,
//                          stop_after)
//   write_bucket_rows = 0 leaves bucket_info as it was (counters still hold the number of buckets).
// Requires 1 <= BT <= SMALL_MAX_BT and ids < SMALL_MAX_V (checked by the package). counters as in bucketing.cu.
// The kernel calls allow_next_grid() after phase 2: the wte kernel launched after it (as a programmatic
// dependent) is set up while the last phases run, and waits for it inside (common.cuh).
#include "block_sort.cuh"

// SMALL_THREADS, SMALL_KEYS, and the keys (constants.cuh): a position bt < SMALL_MAX_BT in the low SMALL_POS_BITS
// bits, an id < SMALL_MAX_V = 2^(32 - SMALL_POS_BITS) in the high bits. SMALL_NO_KEY (padding) sorts after every
// real key.
#define SMALL_NO_KEY 0xFFFFFFFFu
// Phase 4 scans count | chunks << SMALL_FIELD_BITS at once: both sums are <= 1024, so the fields never mix.
#define SMALL_FIELD_BITS 16
// Phase 3: SMALL_GROUPS groups of 32 consecutive segments, one per lane of a warp in the class scans.
#define SMALL_WARPS (SMALL_THREADS / WARP_SIZE)
#define SMALL_GROUPS (SMALL_KEYS * SMALL_WARPS)
static_assert(SMALL_GROUPS == WARP_SIZE, "phase 3 scans one group per lane");
#define SMALL_BIG_CLASS 0  // tokens seen more than CHUNK_ITEMS times
#define SMALL_NO_CLASS (-1)  // no token (segments past num_distinct)

extern "C" __global__ void __launch_bounds__(SMALL_THREADS)
    bucketing_small_kernel(const int* inp, int BT, int num_c_groups, int4* bucket_info, int4* units, int* bt_list,
                           int* counters, int write_bucket_rows, int stop_after) {
    __shared__ unsigned int buf[2 * SMALL_MAX_BT];  // the sort's exchange buffers; phase 3: token keys by rank
    __shared__ unsigned int sorted[SMALL_MAX_BT];  // phase 1's keys, slot by slot
    __shared__ int seg_start[SMALL_MAX_BT + 1];  // first slot of each segment (and BT after the last)
    __shared__ int seg_new_start[SMALL_MAX_BT];  // each segment's start in bt_list
    __shared__ int4 rank_row[SMALL_MAX_BT];  // rank r: (start, count, ix, first unit)
    __shared__ int scratch[WARP_SIZE + 1];
    __shared__ int num_classes;
    __shared__ int class_count[SMALL_GROUPS][CHUNK_ITEMS + 1];  // [group][class]; 33 columns: no bank conflicts
    __shared__ int class_total[CHUNK_ITEMS + 1];  // tokens per class
    __shared__ int class_base[CHUNK_ITEMS + 1];  // each class's first rank
    __shared__ int big_list[WARP_SIZE];  // the big tokens' segments (at most SMALL_MAX_BT / 33 = 31)
    wait_for_previous_grid();  // (a no-op: the package launches this kernel the plain way)
    if (stop_after < 0) { return; }  // an empty run: what the launch alone costs
    int first = threadIdx.x * SMALL_KEYS;  // elements first .. first + SMALL_KEYS - 1 are this thread's (but phase 3)
    for (int i = threadIdx.x; i < SMALL_GROUPS * (CHUNK_ITEMS + 1); i += SMALL_THREADS) {
        (&class_count[0][0])[i] = 0;  // for phase 3 (phase 1's barriers publish it)
    }

    // Phase 1: positions sorted by token id (bt ascending inside a token). Padding keys sort last.
    unsigned int key[SMALL_KEYS];
    block_sort_positions<SMALL_THREADS, SMALL_KEYS, SMALL_POS_BITS>(inp, BT, key, buf, sorted);
    if (threadIdx.x == 0) { num_classes = 0; }
    __syncthreads();
    if (stop_after == 1) { return; }

    // Phase 2: slot p starts a segment where its id differs from slot p - 1's.
    int head[SMALL_KEYS];
    int heads = segment_heads<SMALL_KEYS, SMALL_POS_BITS>(key, sorted, BT, head);
    int num_distinct;
    int seg = block_exclusive_sum(heads, &num_distinct, scratch) - 1;  // the segment before this thread's slots
    int seg_of[SMALL_KEYS];
#pragma unroll
    for (int q = 0; q < SMALL_KEYS; q++) {
        seg += head[q];
        seg_of[q] = seg;
        if (head[q]) { seg_start[seg] = first + q; }
    }
    if (threadIdx.x == 0) { seg_start[num_distinct] = BT; }
    __syncthreads();
    // The wte kernel after this one is launched as a programmatic dependent (common.cuh): let it be set up now, so
    // that its blocks wait on the other SMs for the last phases, instead of starting a microsecond after them.
    // Not earlier: its waiting blocks take SM slots, and the wpe kernel (on another stream, started about when
    // this one starts) should get its slots first. On an H200, with this call at the top, the bucketed wte
    // kernel's waiting blocks filled every SM and the wpe kernel started only when the table was done.
    allow_next_grid();
    if (stop_after == 2) { return; }

    // Phase 3: every segment's rank, by count classes instead of a second sort (the scatter route's idea,
    // bucketing_scatter.cu). Class c = 1..32: the tokens seen exactly c times; SMALL_BIG_CLASS: those seen more
    // often (at most 31 of 1024 ids). The bucket order is the big tokens (count descending, then id), then the
    // classes 32, 31, ..., 1, each in id order, which is segment order. So a small token's rank is its class's
    // first rank plus the tokens of its class in the segments before it; a big token's rank comes from comparing
    // it with the other big ones. Slot q of thread i holds segment q * SMALL_THREADS + i here (not first + q): the
    // 32 lanes of a warp then hold 32 consecutive segments, a GROUP, and the groups in segment order are slot 0 of
    // warps 0, 1, ..., then slot 1 of warps 0, 1, ...: SMALL_GROUPS = 32 of them, one per lane in the scans below.
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    int cls[SMALL_KEYS], below[SMALL_KEYS], token_count[SMALL_KEYS];
#pragma unroll
    for (int q = 0; q < SMALL_KEYS; q++) {
        int s = q * SMALL_THREADS + threadIdx.x;
        token_count[q] = s < num_distinct ? seg_start[s + 1] - seg_start[s] : 0;
        cls[q] =
            token_count[q] == 0 ? SMALL_NO_CLASS : (token_count[q] > CHUNK_ITEMS ? SMALL_BIG_CLASS : token_count[q]);
        // The lanes of this group in the same class; the lowest of them writes how many there are.
        unsigned int peers = __match_any_sync(0xffffffffu, cls[q]);
        below[q] = __popc(peers & lanes_below(lane));
        if (cls[q] != SMALL_NO_CLASS && below[q] == 0) { class_count[q * SMALL_WARPS + warp][cls[q]] = __popc(peers); }
    }
    __syncthreads();
    // Warp w scans classes w, w + SMALL_WARPS, ... over the groups (lane = group): each group's count becomes the
    // class's tokens in the groups before it.
    for (int c = warp; c <= CHUNK_ITEMS; c += SMALL_WARPS) {
        int in_group = class_count[lane][c];
        int inclusive = warp_inclusive_sum(in_group);
        class_count[lane][c] = inclusive - in_group;
        if (lane == WARP_SIZE - 1) { class_total[c] = inclusive; }
    }
    __syncthreads();
    if (warp == 0) {  // each class's first rank: after the big tokens and the classes above (lane l: class 32 - l)
        int c = CHUNK_ITEMS - lane;
        class_base[c] = class_total[SMALL_BIG_CLASS] + warp_inclusive_sum(class_total[c]) - class_total[c];
    }
#pragma unroll
    for (int q = 0; q < SMALL_KEYS; q++) {  // the big tokens' segments, in segment order
        if (cls[q] == SMALL_BIG_CLASS) {
            big_list[class_count[q * SMALL_WARPS + warp][SMALL_BIG_CLASS] + below[q]] = q * SMALL_THREADS + threadIdx.x;
        }
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < SMALL_KEYS; q++) {
        int s = q * SMALL_THREADS + threadIdx.x;
        if (cls[q] == SMALL_NO_CLASS) { continue; }
        int rank = 0;
        if (cls[q] != SMALL_BIG_CLASS) {
            rank = class_base[cls[q]] + class_count[q * SMALL_WARPS + warp][cls[q]] + below[q];
        } else {
            for (int b = 0; b < class_total[SMALL_BIG_CLASS]; b++) {  // the big tokens that come before it
                int other = big_list[b];
                int other_count = seg_start[other + 1] - seg_start[other];
                rank += other_count > token_count[q] || (other_count == token_count[q] && other < s);
            }
        }
        buf[rank] = ((unsigned int)(SMALL_MAX_BT - token_count[q]) << SMALL_POS_BITS) | (unsigned int)s;
    }
    __syncthreads();
    // Back to element r = first + q: the key (1024 - count, segment) of the token of rank r, as phase 4 reads it.
    unsigned int token_key[SMALL_KEYS];
#pragma unroll
    for (int q = 0; q < SMALL_KEYS; q++) { token_key[q] = first + q < num_distinct ? buf[first + q] : SMALL_NO_KEY; }
    if (stop_after == 3) { return; }

    // Phase 4: element r = first + q is rank r. Starts in bt_list and first units: one scan of count | chunks << 16.
    int count[SMALL_KEYS], chunks[SMALL_KEYS];
    int fields = 0;
#pragma unroll
    for (int q = 0; q < SMALL_KEYS; q++) {
        bool real = first + q < num_distinct;
        count[q] = real ? SMALL_MAX_BT - (int)(token_key[q] >> SMALL_POS_BITS) : 0;
        chunks[q] = CEIL_DIV(count[q], CHUNK_ITEMS);
        fields += count[q] | (chunks[q] << SMALL_FIELD_BITS);
        buf[first + q] = token_key[q];  // for the class test of rank r + 1
    }
    int fields_total;
    int packed = block_exclusive_sum(fields, &fields_total, scratch);  // its barriers publish buf too
    int class_heads = 0;
#pragma unroll
    for (int q = 0; q < SMALL_KEYS; q++) {
        int r = first + q;
        if (r < num_distinct) {
            // A class is the tokens of one count: a new one starts where the count differs from rank r - 1's.
            class_heads += r == 0 || (buf[r - 1] >> SMALL_POS_BITS) != (token_key[q] >> SMALL_POS_BITS);
            int s = (int)(token_key[q] & SMALL_POS_MASK);
            int start = packed & ((1 << SMALL_FIELD_BITS) - 1);
            int ix = (int)(sorted[seg_start[s]] >> SMALL_POS_BITS);
            int first_unit = packed >> SMALL_FIELD_BITS;
            seg_new_start[s] = start;
            rank_row[r] = make_int4(start, count[q], ix, first_unit);  // for the bucket rows below
            // Its units: one per chunk (one for every token seen at most 32 times).
            for (int chunk = 0; chunk < chunks[q]; chunk++) {
                units[first_unit + chunk] = make_int4(ix, chunk, start, count[q]);
            }
        }
        packed += count[q] | (chunks[q] << SMALL_FIELD_BITS);
    }
    if (class_heads > 0) { atomicAdd(&num_classes, class_heads); }  // a count: the order of the adds is free
    __syncthreads();  // seg_new_start, rank_row and num_classes are complete
    if (threadIdx.x == 0) {
        counters[COUNTER_NUM_DISTINCT] = num_distinct;
        counters[COUNTER_MAX_COUNT] = count[0];  // rank 0's
        counters[COUNTER_NUM_CLASSES] = num_classes;
        counters[COUNTER_NUM_BUCKETS] = num_distinct * num_c_groups;
        counters[COUNTER_NUM_UNITS] = fields_total >> SMALL_FIELD_BITS;
    }
    // Bucket rows: thread i writes rows i, i + SMALL_THREADS, ..., so a warp stores 512 contiguous bytes.
    if (write_bucket_rows) {
        for (int row = threadIdx.x; row < num_distinct * num_c_groups; row += SMALL_THREADS) {
            int4 ranked = rank_row[row / num_c_groups];
            bucket_info[row] = make_int4(ranked.x, ranked.y, ranked.z, row % num_c_groups);
        }
    }
    if (stop_after == 4) { return; }

    // Phase 5: bt_list. Sorted slot p moves to its token's new start plus its place inside the segment.
#pragma unroll
    for (int q = 0; q < SMALL_KEYS; q++) {
        int p = first + q;
        if (p < BT) { bt_list[seg_new_start[seg_of[q]] + (p - seg_start[seg_of[q]])] = (int)(key[q] & SMALL_POS_MASK); }
    }
}
