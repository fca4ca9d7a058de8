// bucketing_scatter.cu: the bucket table of a batch of up to 65536 ids, in five short kernels and no sort of
// the positions.
//
// Produces exactly the table of gpt2enc_edu/buckets.py, bucketing.cu and bucketing_small.cu (same order, same
// bits). The cooperative kernel sorts all B*T positions by their token's rank (two radix passes) and pays
// about 20 grid-wide barriers for it; this route needs neither, because of two facts:
//
//  * Most tokens occur at most CHUNK_ITEMS (32) times. Give every such count its own CLASS (class c = the
//    tokens seen exactly c times). The bucket order is "count descending, then id", so the classes come in
//    the order 32, 31, ..., 1, and inside a class the tokens come by id. All tokens of a class have the same
//    count: a token's start in bt_list is its class's first slot + (its place in the class) * c. No scan over
//    tokens, only 32 totals per tile of 1024 tokens. The few BIG tokens (seen more than 32 times: at most
//    BT / 33 of them) come first; one block ranks them by comparing keys (count, then id). Where the classes
//    start needs only three numbers about the big tokens (how many, their items, their units), which kernel 2
//    adds up, so the big tokens' block and the small tokens' blocks run side by side in one launch.
//  * Inside a token bt_list must be ascending. Drop every position into its token's range in whatever order
//    the integer atomics give, then sort each range: a warp sorts a small token's <= 32 positions (each lane
//    counts the smaller ones); a block sorts a big token's by setting one bit per position in a bitmap of all
//    BT positions and reading the set bits out in order (a popcount scan gives each word's first slot).
//
// Launch, in this order on one stream (gpt2enc_edu/gpu_buckets.py does it), with counts[0..V) all zero; kernels
// 2-5 as programmatic dependents of the kernel before (common.cuh: each starts while the one before runs, and
// waits for it before it touches memory):
//   1. scatter_count_kernel       grid CEIL_DIV(BT, SCATTER_SMALL_BLOCK), block SCATTER_SMALL_BLOCK
//        (inp, BT, counts, counters)
//   2. scatter_classify_kernel    grid num_tiles = CEIL_DIV(V, SCATTER_THREADS), block SCATTER_THREADS
//        (counts, V, tile_totals, big_list, counters)
//   3. scatter_rows_kernel        grid 1 + num_tiles, block SCATTER_THREADS
//        (counts, V, tile_totals, big_list, num_c_groups, big_sorted, big_unit_starts, class_bases, bucket_info,
//         units, token_starts, counters, write_bucket_rows)
//        write_bucket_rows = 0 (the chunked method's table: its wte kernels read only the units and bt_list):
//        only the big tokens' bucket rows are written, which kernel 5 reads.
//   4. scatter_positions_kernel   grid CEIL_DIV(BT, SCATTER_SMALL_BLOCK), block SCATTER_SMALL_BLOCK
//        (inp, BT, counts, token_starts, bt_list)
//   5. scatter_sort_kernel        grid big_blocks + small_blocks, block SCATTER_THREADS
//        (bt_list, bucket_info, num_c_groups, big_unit_starts, class_bases, units, counters, BT, big_blocks)
//   big_blocks: the blocks of kernel 5 that sort big tokens (the package: min(BT / 33 + 1, 2 per SM));
//   small_blocks (any number >= 1): a pool whose warps take the small tokens in turn (the package: one block per
//   SM, fewer where CEIL_DIV(min(V, BT), SCATTER_WARPS) blocks give every token a warp).
//   Kernel 3's block 0 keeps all big keys in shared memory (32 KB).
// Workspace: counts[V], tile_totals[CEIL_DIV(V, 1024) * CHUNK_ITEMS], big_list and big_sorted and
// big_unit_starts[BT / (CHUNK_ITEMS + 1) + 1], class_bases[3 * CHUNK_ITEMS], token_starts[V].
// Requires 1 <= BT <= SCATTER_MAX_BT (the bitmap is static shared memory); any V. counters as in bucketing.cu,
// plus COUNTER_NUM_BIG, COUNTER_BIG_ITEMS and COUNTER_BIG_UNITS (kernel 1 zeroes them). Kernel 4 leaves counts at
// zero again (it counts every token back down), so the next table needs no memset; only a run stopped before
// kernel 4 leaves them to be cleared.
#include "common.cuh"

// SCATTER_THREADS, SCATTER_SMALL_BLOCK, SCATTER_MAX_BT, CHUNK_ITEMS and the counters[] slots: constants.cuh.
#define SCATTER_WARPS (SCATTER_THREADS / WARP_SIZE)
// The most big tokens SCATTER_MAX_BT ids can hold (each is seen at least CHUNK_ITEMS + 1 times).
#define SCATTER_MAX_BIG (SCATTER_MAX_BT / (CHUNK_ITEMS + 1) + 1)

// class_bases[] rows: where each class starts in the rank order, in bt_list and in the unit list
#define BASE_RANK 0
#define BASE_ITEM 1
#define BASE_UNIT 2

// The class of a token seen `count` times: the count itself if 1..CHUNK_ITEMS, else 0 (absent or big).
__device__ __forceinline__ int token_class(int count) { return count >= 1 && count <= CHUNK_ITEMS ? count : 0; }

// The sum of `value` over a warp's lanes (integers: the order does not matter).
__device__ __forceinline__ int warp_sum(int value) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) { value += __shfl_xor_sync(0xffffffffu, value, offset); }
    return value;
}

// 1. counts[ix] = occurrences of token ix. Lanes of a warp holding the same id add once for all (a frequent
//    token would otherwise queue thousands of atomics on one address).
extern "C" __global__ void __launch_bounds__(SCATTER_SMALL_BLOCK)
    scatter_count_kernel(const int* inp, int BT, int* counts, int* counters) {
    wait_for_previous_grid();  // a no-op here: kernel 1 is launched the plain way, after whatever came before
    allow_next_grid();
    int bt = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x % WARP_SIZE;
    if (bt == 0) {  // kernel 2 appends to the big-token list and adds up its items and units
        counters[COUNTER_NUM_BIG] = 0;
        counters[COUNTER_BIG_ITEMS] = 0;
        counters[COUNTER_BIG_UNITS] = 0;
    }
    int ix = bt < BT ? inp[bt] : -1;  // lanes past the end share the id -1 and add nothing
    unsigned int peers = __match_any_sync(0xffffffffu, ix);
    if (ix >= 0 && (peers & lanes_below(lane)) == 0) { atomicAdd(&counts[ix], __popc(peers)); }
}

// 2. Per tile of SCATTER_THREADS token ids (thread = token): how many tokens of each class the tile holds,
//    tile_totals[tile * CHUNK_ITEMS + c - 1]; big tokens appended to big_list (in any order: kernel 3 ranks them
//    by their keys alone), and their items and units added up (integer atomics: any order gives the same sums).
extern "C" __global__ void __launch_bounds__(SCATTER_THREADS)
    scatter_classify_kernel(const int* counts, int V, int* tile_totals, int* big_list, int* counters) {
    __shared__ int totals[CHUNK_ITEMS];
    wait_for_previous_grid();  // kernels 2-5 are programmatic dependents of the one before (common.cuh)
    allow_next_grid();
    int ix = blockIdx.x * SCATTER_THREADS + threadIdx.x;
    int lane = threadIdx.x % WARP_SIZE;
    if (threadIdx.x < CHUNK_ITEMS) { totals[threadIdx.x] = 0; }
    __syncthreads();
    int count = ix < V ? counts[ix] : 0;
    int cls = token_class(count);
    unsigned int peers = __match_any_sync(0xffffffffu, cls);
    if (cls > 0 && (peers & lanes_below(lane)) == 0) { atomicAdd(&totals[cls - 1], __popc(peers)); }
    bool big = count > CHUNK_ITEMS;
    if (big) { big_list[atomicAdd(&counters[COUNTER_NUM_BIG], 1)] = ix; }
    // The three numbers the class bases need about the big tokens: how many (above), their items, their units.
    int big_items = warp_sum(big ? count : 0);
    int big_units = warp_sum(big ? CEIL_DIV(count, CHUNK_ITEMS) : 0);
    if (lane == 0 && big_items > 0) {
        atomicAdd(&counters[COUNTER_BIG_ITEMS], big_items);
        atomicAdd(&counters[COUNTER_BIG_UNITS], big_units);
    }
    __syncthreads();
    if (threadIdx.x < CHUNK_ITEMS) { tile_totals[blockIdx.x * CHUNK_ITEMS + threadIdx.x] = totals[threadIdx.x]; }
}

// A big token's sort key: a larger key comes earlier in the bucket order (count descending, then id ascending).
__device__ __forceinline__ unsigned long long big_key(const int* counts, int ix) {
    return ((unsigned long long)counts[ix] << 32) | (unsigned int)(~ix);
}

// Warp w sums class w + 1 (SCATTER_WARPS == CHUNK_ITEMS) over all tiles into class_totals, and over the tiles
// before `tile` into tiles_before (a null tiles_before: not wanted).
__device__ __forceinline__ void sum_tile_totals(const int* tile_totals, int num_tiles, int tile, int* class_totals,
                                                int* tiles_before) {
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    int total = 0;
    int before = 0;
    for (int t = lane; t < num_tiles; t += WARP_SIZE) {
        int n = tile_totals[t * CHUNK_ITEMS + warp];
        total += n;
        before += t < tile ? n : 0;
    }
    total = warp_sum(total);
    before = warp_sum(before);
    if (lane == 0) {
        class_totals[warp] = total;
        if (tiles_before != nullptr) { tiles_before[warp] = before; }
    }
}

// Where each class starts, base[BASE_*][class - 1]: in rank order, in bt_list and in the unit list. The classes
// follow the big tokens in the order 32, 31, ..., 1, so a class starts after the big tokens and the classes above
// it: one warp, lane l holding class CHUNK_ITEMS - l, scans the class totals (tokens, and items: c per token; a
// small token is one unit). Called by warp 0; returns the mask of lanes whose class has tokens.
__device__ __forceinline__ unsigned int class_bases_warp(const int* class_totals, const int* counters,
                                                         int (*base)[CHUNK_ITEMS]) {
    int lane = threadIdx.x % WARP_SIZE;
    int c = CHUNK_ITEMS - lane;
    int n = class_totals[c - 1];
    int tokens_before = warp_inclusive_sum(n) - n;
    int items_before = warp_inclusive_sum(n * c) - n * c;
    base[BASE_RANK][c - 1] = counters[COUNTER_NUM_BIG] + tokens_before;
    base[BASE_ITEM][c - 1] = counters[COUNTER_BIG_ITEMS] + items_before;
    base[BASE_UNIT][c - 1] = counters[COUNTER_BIG_UNITS] + tokens_before;
    return __ballot_sync(0xffffffffu, n > 0);
}

// Kernel 3, block 0: rank the big tokens, write their starts, buckets and first units; write the class bases
// (kernel 5 reads them) and the table's sizes.
__device__ __forceinline__ void big_token_rows(const int* counts, int num_tiles, const int* tile_totals,
                                               const int* big_list, int num_c_groups, int* big_sorted,
                                               int* big_unit_starts, int* class_bases, int4* bucket_info,
                                               int* token_starts, int* counters) {
    __shared__ unsigned long long keys[SCATTER_MAX_BIG];  // in big_list's order
    __shared__ unsigned long long ranked[SCATTER_MAX_BIG];  // in rank order
    __shared__ int class_totals[CHUNK_ITEMS];
    __shared__ int base[3][CHUNK_ITEMS];
    __shared__ int scan_scratch[WARP_SIZE + 1];
    int num_big = counters[COUNTER_NUM_BIG];
    sum_tile_totals(tile_totals, num_tiles, 0, class_totals, nullptr);

    // Rank of a big token = how many big tokens have a larger key. All keys sit in shared memory (one trip to
    // global memory for all of them); in the counting loop every thread reads the same word (a broadcast).
    for (int i = threadIdx.x; i < num_big; i += SCATTER_THREADS) { keys[i] = big_key(counts, big_list[i]); }
    __syncthreads();
    for (int i = threadIdx.x; i < num_big; i += SCATTER_THREADS) {
        unsigned long long mine = keys[i];
        int rank = 0;
        for (int k = 0; k < num_big; k++) { rank += keys[k] > mine; }
        ranked[rank] = mine;
    }
    __syncthreads();

    // Big tokens in rank order: starts and first units are running sums of counts and chunk counts.
    int item_carry = 0;
    int unit_carry = 0;
    for (int r0 = 0; r0 < num_big; r0 += SCATTER_THREADS) {
        int rank = r0 + threadIdx.x;
        unsigned long long key = rank < num_big ? ranked[rank] : 0ull;
        int ix = (int)~(unsigned int)key;  // the key's low word is ~ix, its high word the count
        int count = (int)(key >> 32);
        int items_total, units_total;
        int start = item_carry + block_exclusive_sum(count, &items_total, scan_scratch);
        int unit = unit_carry + block_exclusive_sum(CEIL_DIV(count, CHUNK_ITEMS), &units_total, scan_scratch);
        if (rank < num_big) {
            big_sorted[rank] = ix;
            token_starts[ix] = start;
            big_unit_starts[rank] = unit;
            for (int g = 0; g < num_c_groups; g++) {
                bucket_info[rank * num_c_groups + g] = make_int4(start, count, ix, g);
            }
        }
        item_carry += items_total;
        unit_carry += units_total;
    }

    // The classes, and the sizes: class 1 comes last, so its base plus its tokens is the end of the table.
    if (threadIdx.x < WARP_SIZE) {
        unsigned int has_tokens = class_bases_warp(class_totals, counters, base);
        __syncwarp();
        int lane = threadIdx.x;
        class_bases[BASE_RANK * CHUNK_ITEMS + lane] = base[BASE_RANK][lane];
        class_bases[BASE_ITEM * CHUNK_ITEMS + lane] = base[BASE_ITEM][lane];
        class_bases[BASE_UNIT * CHUNK_ITEMS + lane] = base[BASE_UNIT][lane];
        if (lane == 0) {
            int distinct = base[BASE_RANK][0] + class_totals[0];
            // the largest count: the first big token's, else the largest class with tokens (lane l: class 32 - l)
            int max_count =
                num_big > 0 ? (int)(ranked[0] >> 32) : (has_tokens != 0u ? CHUNK_ITEMS - (__ffs(has_tokens) - 1) : 0);
            counters[COUNTER_NUM_DISTINCT] = distinct;
            counters[COUNTER_MAX_COUNT] = max_count;
            counters[COUNTER_NUM_BUCKETS] = distinct * num_c_groups;
            counters[COUNTER_NUM_UNITS] = base[BASE_UNIT][0] + class_totals[0];
        }
    }
}

// Kernel 3, the blocks after block 0, one per tile of SCATTER_THREADS token ids: every small token's rank = its
// class's first rank + the class's tokens in earlier tiles + those before it in this tile (earlier warps, then
// earlier lanes: id order). Then its start (arithmetic: all tokens of the class have `c` items), its buckets and
// its one unit. The class bases come from the same scan block 0 does, so no block waits for another.
__device__ __forceinline__ void small_token_rows(const int* counts, int V, int tile, int num_tiles,
                                                 const int* tile_totals, int num_c_groups, int4* bucket_info,
                                                 int4* units, int* token_starts, const int* counters,
                                                 int write_bucket_rows) {
    __shared__ int warp_counts[SCATTER_WARPS][CHUNK_ITEMS + 1];  // [warp][class - 1]; +1 spreads the banks
    __shared__ int tiles_before[CHUNK_ITEMS];
    __shared__ int class_totals[CHUNK_ITEMS];
    __shared__ int base[3][CHUNK_ITEMS];
    int ix = tile * SCATTER_THREADS + threadIdx.x;
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    warp_counts[warp][lane] = 0;  // SCATTER_WARPS x CHUNK_ITEMS == one int per thread
    __syncthreads();
    int count = ix < V ? counts[ix] : 0;
    int cls = token_class(count);
    unsigned int peers = __match_any_sync(0xffffffffu, cls);
    int rank_in_warp = __popc(peers & lanes_below(lane));
    if (cls > 0 && rank_in_warp == 0) { warp_counts[warp][cls - 1] = __popc(peers); }
    sum_tile_totals(tile_totals, num_tiles, tile, class_totals, tiles_before);
    __syncthreads();
    {
        // Warp w scans class w + 1 over the block's warps (lane = warp).
        int value = warp_counts[lane][warp];
        warp_counts[lane][warp] = warp_inclusive_sum(value) - value;
    }
    if (warp == 0) { class_bases_warp(class_totals, counters, base); }
    __syncthreads();
    if (cls == 0) { return; }
    int place = tiles_before[cls - 1] + warp_counts[warp][cls - 1] + rank_in_warp;  // place inside the class
    int rank = base[BASE_RANK][cls - 1] + place;
    int start = base[BASE_ITEM][cls - 1] + place * cls;
    int unit = base[BASE_UNIT][cls - 1] + place;
    token_starts[ix] = start;
    if (write_bucket_rows) {
        for (int g = 0; g < num_c_groups; g++) { bucket_info[rank * num_c_groups + g] = make_int4(start, cls, ix, g); }
    }
    units[unit] = make_int4(ix, 0, start, cls);
}

// 3. Block 0 ranks the big tokens (big_token_rows); blocks 1 .. num_tiles write the small tokens' rows, a tile of
//    token ids each (small_token_rows). The two need nothing from each other: both compute the class bases from
//    the tile totals and kernel 2's three big-token numbers. Block 0 has the longest work, and comes first.
extern "C" __global__ void __launch_bounds__(SCATTER_THREADS)
    scatter_rows_kernel(const int* counts, int V, const int* tile_totals, const int* big_list, int num_c_groups,
                        int* big_sorted, int* big_unit_starts, int* class_bases, int4* bucket_info, int4* units,
                        int* token_starts, int* counters, int write_bucket_rows) {
    wait_for_previous_grid();  // kernels 2-5 are programmatic dependents of the one before (common.cuh)
    allow_next_grid();
    int num_tiles = (int)gridDim.x - 1;
    if (blockIdx.x == 0) {
        big_token_rows(counts, num_tiles, tile_totals, big_list, num_c_groups, big_sorted, big_unit_starts, class_bases,
                       bucket_info, token_starts, counters);
    } else {
        small_token_rows(counts, V, (int)blockIdx.x - 1, num_tiles, tile_totals, num_c_groups, bucket_info, units,
                         token_starts, counters, write_bucket_rows);
    }
}

// 4. Every position into its token's range, at a slot the atomics hand out (any order: kernel 5 sorts).
//    Counting each token back down to zero leaves counts cleared for the next table.
extern "C" __global__ void __launch_bounds__(SCATTER_SMALL_BLOCK)
    scatter_positions_kernel(const int* inp, int BT, int* counts, const int* token_starts, int* bt_list) {
    wait_for_previous_grid();  // kernels 2-5 are programmatic dependents of the one before (common.cuh)
    allow_next_grid();
    int bt = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x % WARP_SIZE;
    int ix = bt < BT ? inp[bt] : -1;
    unsigned int peers = __match_any_sync(0xffffffffu, ix);
    int leader = __ffs(peers) - 1;
    int left = 0;  // the leader takes slots for all its peers at once
    if (ix >= 0 && lane == leader) { left = atomicSub(&counts[ix], __popc(peers)); }
    left = __shfl_sync(0xffffffffu, left, leader);
    if (ix >= 0) { bt_list[token_starts[ix] + left - 1 - __popc(peers & lanes_below(lane))] = bt; }
}

// 5. Sort every token's range of bt_list. Blocks below big_blocks take the big tokens (a bitmap of all
//    positions per token, read out in order) and write their units; the other blocks' warps take small tokens.
extern "C" __global__ void __launch_bounds__(SCATTER_THREADS)
    scatter_sort_kernel(int* bt_list, const int4* bucket_info, int num_c_groups, const int* big_unit_starts,
                        const int* class_bases, int4* units, const int* counters, int BT, int big_blocks) {
    __shared__ unsigned int bitmap[SCATTER_MAX_BT / WARP_SIZE];
    __shared__ int scan_scratch[WARP_SIZE + 1];
    wait_for_previous_grid();  // kernels 2-5 are programmatic dependents of the one before (common.cuh)
    allow_next_grid();
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    int num_big = counters[COUNTER_NUM_BIG];
    if ((int)blockIdx.x < big_blocks) {
        int words = CEIL_DIV(BT, WARP_SIZE);
        int per_thread = CEIL_DIV(words, SCATTER_THREADS);
        for (int rank = blockIdx.x; rank < num_big; rank += big_blocks) {  // the same trip count in every thread
            int4 row = bucket_info[rank * num_c_groups];
            int start = row.x;
            int count = row.y;
            int ix = row.z;
            for (int w = threadIdx.x; w < words; w += SCATTER_THREADS) { bitmap[w] = 0u; }
            __syncthreads();
            for (int k = threadIdx.x; k < count; k += SCATTER_THREADS) {
                int bt = bt_list[start + k];
                atomicOr(&bitmap[bt / WARP_SIZE], 1u << (bt % WARP_SIZE));
            }
            __syncthreads();  // every position is marked (and read: the range can be overwritten)
            // Thread i owns words [i * per_thread, (i + 1) * per_thread): its first slot is a scan of popcounts.
            int mine = 0;
            for (int q = 0; q < per_thread; q++) {
                int w = threadIdx.x * per_thread + q;
                if (w < words) { mine += __popc(bitmap[w]); }
            }
            int unused;
            int slot = start + block_exclusive_sum(mine, &unused, scan_scratch);
            for (int q = 0; q < per_thread; q++) {
                int w = threadIdx.x * per_thread + q;
                unsigned int bits = w < words ? bitmap[w] : 0u;
                while (bits != 0u) {
                    bt_list[slot++] = w * WARP_SIZE + __ffs(bits) - 1;
                    bits &= bits - 1u;  // clear the lowest set bit
                }
            }
            int first_unit = big_unit_starts[rank];
            for (int chunk = threadIdx.x; chunk < CEIL_DIV(count, CHUNK_ITEMS); chunk += SCATTER_THREADS) {
                units[first_unit + chunk] = make_int4(ix, chunk, start, count);
            }
            __syncthreads();  // the bitmap is cleared for the next token only after everyone has read it
        }
        return;
    }
    // The other blocks are a pool of warps that take the small tokens in turn: warp w of the pool takes ranks
    // num_big + w, num_big + w + pool, ... Class 1 comes last in rank order and a single position is sorted
    // already, so the walk ends at its first rank. The package launches a pool of one block per SM rather than a
    // warp for every token that may need one (about 1,600 blocks at B=64, most of whose warps would leave at once
    // while holding their SM; docs/experiments.md, bucket table: "kernel 6's small tokens taken by a pool").
    //
    // A small token's range needs no load: lane l holds class l + 1's first rank and first slot (class_bases), the
    // classes come in the order 32, 31, ..., 1, so the class of rank r is the smallest c whose first rank is <= r
    // (one ballot), and its range starts (r - first rank) * c slots after the class's first slot, c positions long.
    // The warp's only wait per token is then the load of its positions (a bucket row loaded first would be a
    // second dependent load), and kernel 3 need not write the small tokens' bucket rows for this kernel, so the
    // chunked method's table leaves them out.
    int end = class_bases[BASE_RANK * CHUNK_ITEMS + 0];
    int class_rank = class_bases[BASE_RANK * CHUNK_ITEMS + lane];  // lane l: class l + 1
    int class_item = class_bases[BASE_ITEM * CHUNK_ITEMS + lane];
    int pool = ((int)gridDim.x - big_blocks) * SCATTER_WARPS;
    for (int rank = num_big + ((int)blockIdx.x - big_blocks) * SCATTER_WARPS + warp; rank < end; rank += pool) {
        int count = __ffs(__ballot_sync(0xffffffffu, class_rank <= rank));  // its class: 2 .. CHUNK_ITEMS == WARP_SIZE
        int start = __shfl_sync(0xffffffffu, class_item, count - 1) +
                    (rank - __shfl_sync(0xffffffffu, class_rank, count - 1)) * count;
        int bt = lane < count ? bt_list[start + lane] : 0x7FFFFFFF;
        int place = 0;  // how many of the range's positions are smaller than mine
        for (int k = 0; k < count; k++) { place += __shfl_sync(0xffffffffu, bt, k) < bt; }
        if (lane < count) { bt_list[start + place] = bt; }
    }
}
