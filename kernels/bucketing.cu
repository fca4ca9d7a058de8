// bucketing.cu: build the bucket table of the deterministic wte backward on the GPU, in one launch.
//
// Produces exactly the table that gpt2enc_edu/buckets.py builds with NumPy (same order, same bits):
//   bucket_info[bucket] = {start, size, ix, c_group}: buckets by size descending, then token id, then group;
//   bt_list: each token's positions bt, ascending, tokens in bucket order;
//   units[unit] = {ix, chunk, start, size}: every token's positions cut into CHUNK_ITEMS-item chunks;
//   counters[COUNTER_NUM_BUCKETS], counters[COUNTER_NUM_UNITS]: the table's sizes, left on the device so the
//   wte kernel can be launched with a host-side bound and no host/device synchronisation.
//
// How, without a hash map and without a general sort library: two stable radix sorts built from counting.
//   1. count[ix] = occurrences of each token (integer atomics: the result does not depend on their order).
//   2. Give each distinct count value a class: class 0 = the largest count present, class 1 = the next...
//      Stable-sort the tokens 0..V-1 by class: tokens end up by count descending, ties by token id ascending
//      (stability keeps the id order). That is the bucket order; a token's position in it is its rank.
//   3. Stable-sort the positions bt = 0..B*T-1 by the rank of their token: each token's positions end up
//      together, in bucket order, and in ascending bt inside (stability again). That is bt_list.
//   4. Prefix sums of the counts give every token's start in bt_list; write the bucket and unit lists.
// Each radix pass sorts by 8 bits: a per-block digit histogram, the (digit, block) offsets read off the
// whole histogram by every block, then a stable scatter (ranks inside a warp from __match_any_sync, across
// warps from shared counters).
// Passes run only while the keys still have non-zero higher digits (decided on the device).
//
// Launch: cooperatively (all blocks resident: grid.sync() separates the phases), block = 1024 threads,
//   grid <= number of SMs (one 1024-thread block fits on any SM), dynamic shared memory none:
//   bucketing_kernel(inp, BT, V, num_c_groups, workspace pointers..., bucket_info, units, bt_list, counters,
//                    stop_after)
// stop_after = k > 0 returns after phase k - 1 (1: cleared, 2: counted, ... 7: positions sorted), < 0 at once;
// 0 runs all.
// gpt2enc_edu.gpu_buckets.phase_times_us times these truncated runs and takes differences.
// The workspace needs no initialisation: phase 0 clears what must start at zero.
#include <cooperative_groups.h>

#include "common.cuh"

namespace cg = cooperative_groups;

// BUCKETING_THREADS, RADIX_BITS, CHUNK_ITEMS and the counters[] slots: constants.cuh.
#define BUCKETING_WARPS (BUCKETING_THREADS / WARP_SIZE)
#define RADIX_DIGITS (1 << RADIX_BITS)

struct BucketingScratch {
    int warp_counts[BUCKETING_WARPS][RADIX_DIGITS];  // per-warp digit counts, then their running offsets
    int running[RADIX_DIGITS];  // this block's next free slot per digit
    int digit_count[RADIX_DIGITS];  // this block's digit histogram
    int scan[WARP_SIZE + 1];  // scratch of block_exclusive_sum (common.cuh)
};

// In-place exclusive prefix sum of data[0..n) by the whole grid; returns the total (to every thread).
// Block b owns the contiguous stretch [b*per, (b+1)*per) and walks it in coalesced 1024-element tiles:
// pass 1 sums the stretch, every block then reads the sums of the blocks before it, pass 2 rewrites the
// stretch with running prefixes. `reversed` scans data[n-1], data[n-2], ... instead ("how many larger").
__device__ int grid_scan_inplace(int* data, int n, bool reversed, int* block_sums, BucketingScratch& s,
                                 cg::grid_group& grid) {
    int G = gridDim.x;
    int per = CEIL_DIV(n, G);
    int lo = min(n, (int)blockIdx.x * per);
    int hi = min(n, lo + per);
    int tile_total;
    int stretch_sum = 0;
    for (int base = lo; base < hi; base += BUCKETING_THREADS) {
        int i = base + threadIdx.x;
        int v = i < hi ? data[reversed ? n - 1 - i : i] : 0;
        block_exclusive_sum(v, &tile_total, s.scan);
        stretch_sum += tile_total;
    }
    if (threadIdx.x == 0) { block_sums[blockIdx.x] = stretch_sum; }
    grid.sync();
    int before = 0;
    int total = 0;
    for (int b = 0; b < G; b++) {  // G <= number of SMs: a short loop, the same in every thread
        int sum = block_sums[b];
        before += b < (int)blockIdx.x ? sum : 0;
        total += sum;
    }
    int carry = before;
    for (int base = lo; base < hi; base += BUCKETING_THREADS) {
        int i = base + threadIdx.x;
        int j = reversed ? n - 1 - i : i;
        int v = i < hi ? data[j] : 0;
        int prefix = block_exclusive_sum(v, &tile_total, s.scan);
        if (i < hi) { data[j] = carry + prefix; }
        carry += tile_total;
    }
    grid.sync();  // block_sums may be reused, and every element is final
    return total;
}

// One stable counting-sort pass by the digit (key >> shift) & 0xFF over n (key, value) pairs.
// Block b owns the contiguous range [b*per, (b+1)*per), so stability across blocks follows from the order of
// the (digit, block) scan, and within a block from processing its range front to back.
__device__ void radix_pass(const unsigned int* keys_in, const int* vals_in, unsigned int* keys_out, int* vals_out,
                           int n, int shift, int* hist, BucketingScratch& s, cg::grid_group& grid) {
    int G = gridDim.x;
    int per = CEIL_DIV(n, G);
    int lo = min(n, (int)blockIdx.x * per);
    int hi = min(n, lo + per);
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;

    // 1. This block's digit histogram, stored block-major: hist[block * RADIX_DIGITS + digit].
    for (int d = threadIdx.x; d < RADIX_DIGITS; d += BUCKETING_THREADS) { s.digit_count[d] = 0; }
    __syncthreads();
    for (int i = lo + threadIdx.x; i < hi; i += BUCKETING_THREADS) {
        atomicAdd(&s.digit_count[(keys_in[i] >> shift) & (RADIX_DIGITS - 1)], 1);
    }
    __syncthreads();
    for (int d = threadIdx.x; d < RADIX_DIGITS; d += BUCKETING_THREADS) {
        hist[blockIdx.x * RADIX_DIGITS + d] = s.digit_count[d];
    }
    grid.sync();

    // 2. Where this block's items of each digit go: after all smaller digits (of every block) and after the
    //    same digit in earlier blocks. Every block reads the whole (small) histogram itself: no scan phase.
    //    Thread (part, d) sums blocks part, part + 4, ... for digit d; the four parts are then combined.
    {
        int d = threadIdx.x % RADIX_DIGITS;
        int part = threadIdx.x / RADIX_DIGITS;  // 0..3
        int before = 0, total = 0;
        for (int b = part; b < G; b += BUCKETING_THREADS / RADIX_DIGITS) {
            int count = hist[b * RADIX_DIGITS + d];
            before += b < (int)blockIdx.x ? count : 0;
            total += count;
        }
        s.warp_counts[part][d] = before;
        s.warp_counts[part + 4][d] = total;
        __syncthreads();
        int digit_total = 0;
        int digit_before = 0;
        if (threadIdx.x < RADIX_DIGITS) {
            for (int p = 0; p < 4; p++) {
                digit_before += s.warp_counts[p][d];
                digit_total += s.warp_counts[p + 4][d];
            }
        }
        int unused;
        int digit_base = block_exclusive_sum(threadIdx.x < RADIX_DIGITS ? digit_total : 0, &unused, s.scan);
        if (threadIdx.x < RADIX_DIGITS) { s.running[d] = digit_base + digit_before; }
        __syncthreads();
    }

    // 3. Stable scatter, one 1024-item tile at a time.
    for (int base = lo; base < hi; base += BUCKETING_THREADS) {
        for (int j = threadIdx.x; j < BUCKETING_WARPS * RADIX_DIGITS; j += BUCKETING_THREADS) {
            (&s.warp_counts[0][0])[j] = 0;
        }
        __syncthreads();
        int i = base + threadIdx.x;
        bool valid = i < hi;
        unsigned int key = valid ? keys_in[i] : 0u;
        // Invalid lanes get a digit no valid lane has (and no other invalid lane), so they match nobody.
        int digit = valid ? (int)((key >> shift) & (RADIX_DIGITS - 1)) : RADIX_DIGITS + lane;
        unsigned int peers = __match_any_sync(0xffffffffu, digit);
        int rank_in_warp = __popc(peers & ((1u << lane) - 1u));
        if (valid && rank_in_warp == 0) { s.warp_counts[warp][digit] = __popc(peers); }
        __syncthreads();
        for (int d = threadIdx.x; d < RADIX_DIGITS; d += BUCKETING_THREADS) {
            int run = s.running[d];
            for (int w = 0; w < BUCKETING_WARPS; w++) {
                int count = s.warp_counts[w][d];
                s.warp_counts[w][d] = run;
                run += count;
            }
            s.running[d] = run;
        }
        __syncthreads();
        if (valid) {
            int position = s.warp_counts[warp][digit] + rank_in_warp;
            keys_out[position] = key;
            vals_out[position] = vals_in[i];
        }
        __syncthreads();
    }
    grid.sync();  // the output is complete, and hist may be rewritten by the next pass
}

// Radix-sort n pairs whose keys are all <= max_key, ping-ponging between buffers 0 and 1.
// Returns true if the sorted result ended in buffer 1.
__device__ bool radix_sort(unsigned int* keys0, int* vals0, unsigned int* keys1, int* vals1, int n,
                           unsigned int max_key, int* hist, BucketingScratch& s, cg::grid_group& grid) {
    bool in_one = false;
    for (int shift = 0; shift == 0 || (shift < 32 && (max_key >> shift) != 0u); shift += RADIX_BITS) {
        if (in_one) {
            radix_pass(keys1, vals1, keys0, vals0, n, shift, hist, s, grid);
        } else {
            radix_pass(keys0, vals0, keys1, vals1, n, shift, hist, s, grid);
        }
        in_one = !in_one;
    }
    return in_one;
}

extern "C" __global__ void __launch_bounds__(BUCKETING_THREADS)
    bucketing_kernel(const int* inp, int BT, int V, int num_c_groups,
                     int* counts,  // [V]      occurrences of each token
                     int* presence,  // [BT + 1] 1 where some token occurs exactly that many times
                     unsigned int* keys0, int* vals0, unsigned int* keys1, int* vals1,  // [max(V, BT)] each
                     int* hist,  // [RADIX_DIGITS * gridDim.x] (also the block sums of scans)
                     int* rank_of_ix,  // [V]      a token's place in bucket order
                     int* token_starts,  // [V]      first bt_list slot of the token of each rank
                     int* unit_starts,  // [V]      first unit of the token of each rank
                     int4* bucket_info, int4* units, int* bt_list, int* counters,
                     int stop_after) {  // > 0: return after that phase (per-phase timing); 0: run all
    __shared__ BucketingScratch s;
    if (stop_after < 0) { return; }  // an empty run: what the launch alone costs
    cg::grid_group grid = cg::this_grid();
    int stride = gridDim.x * BUCKETING_THREADS;
    int tid = blockIdx.x * BUCKETING_THREADS + threadIdx.x;

    // Phase 0: clear what accumulates.
    for (int i = tid; i < V; i += stride) { counts[i] = 0; }
    for (int i = tid; i <= BT; i += stride) { presence[i] = 0; }
    if (tid < NUM_COUNTERS) { counters[tid] = 0; }
    grid.sync();
    if (stop_after == 1) { return; }  // the same value in every thread: the whole grid returns together

    // Phase 1: count each token; the first occurrence of a token also counts a distinct token.
    for (int bt = tid; bt < BT; bt += stride) {
        int before = atomicAdd(&counts[inp[bt]], 1);
        if (before == 0) { atomicAdd(&counters[COUNTER_NUM_DISTINCT], 1); }
    }
    grid.sync();
    if (stop_after == 2) { return; }

    // Phase 2: which count values occur, and the largest one.
    for (int ix = tid; ix < V; ix += stride) {
        int count = counts[ix];
        if (count > 0) {
            presence[count] = 1;  // many threads may write the same 1: no order matters
            atomicMax(&counters[COUNTER_MAX_COUNT], count);
        }
    }
    grid.sync();
    if (stop_after == 3) { return; }

    // Phase 3: class of a count value = how many larger count values occur (a reversed exclusive scan);
    // presence[] becomes that class. Only values up to the largest count can occur.
    int max_count = counters[COUNTER_MAX_COUNT];
    int num_classes = grid_scan_inplace(presence + 1, max_count, true, hist, s, grid);
    if (stop_after == 4) { return; }

    // Phase 4: sort tokens by class, stably: absent tokens get the class after all others and sort last.
    for (int ix = tid; ix < V; ix += stride) {
        int count = counts[ix];
        keys0[ix] = (unsigned int)(count > 0 ? presence[count] : num_classes);
        vals0[ix] = ix;
    }
    grid.sync();
    bool tokens_in_one = radix_sort(keys0, vals0, keys1, vals1, V, (unsigned int)num_classes, hist, s, grid);
    const int* token_of_rank = tokens_in_one ? vals1 : vals0;
    if (stop_after == 5) { return; }

    // Phase 5: ranks, and each rank's start in bt_list and in the unit list (two grid-wide exclusive scans).
    int num_distinct = counters[COUNTER_NUM_DISTINCT];
    for (int rank = tid; rank < num_distinct; rank += stride) {
        int ix = token_of_rank[rank];
        int count = counts[ix];
        rank_of_ix[ix] = rank;
        token_starts[rank] = count;
        unit_starts[rank] = CEIL_DIV(count, CHUNK_ITEMS);
    }
    grid.sync();
    grid_scan_inplace(token_starts, num_distinct, false, hist, s, grid);
    int num_units = grid_scan_inplace(unit_starts, num_distinct, false, hist, s, grid);
    if (tid == 0) {
        counters[COUNTER_NUM_UNITS] = num_units;
        counters[COUNTER_NUM_BUCKETS] = num_distinct * num_c_groups;
    }
    if (stop_after == 6) { return; }
    // Phase 6: sort positions by the rank of their token, stably (so bt stays ascending inside a token).
    // The keys are written into the buffer pair the token sort did not leave its result in.
    unsigned int* item_keys0 = tokens_in_one ? keys0 : keys1;
    int* item_vals0 = tokens_in_one ? vals0 : vals1;
    unsigned int* item_keys1 = tokens_in_one ? keys1 : keys0;
    int* item_vals1 = tokens_in_one ? vals1 : vals0;
    for (int bt = tid; bt < BT; bt += stride) {
        item_keys0[bt] = (unsigned int)rank_of_ix[inp[bt]];
        item_vals0[bt] = bt;
    }
    grid.sync();
    bool items_in_one =
        radix_sort(item_keys0, item_vals0, item_keys1, item_vals1, BT, (unsigned int)(num_distinct - 1), hist, s, grid);
    const int* sorted_bt = items_in_one ? item_vals1 : item_vals0;
    if (stop_after == 7) { return; }

    // Phase 7: the table. bt_list is the sorted positions; buckets and units are written per rank.
    for (int i = tid; i < BT; i += stride) { bt_list[i] = sorted_bt[i]; }
    for (int rank = tid; rank < num_distinct; rank += stride) {
        // The token sort's output buffer was reused by the item sort, so read the token back from one of its
        // positions, and its count from the distance to the next token's start.
        int start = token_starts[rank];
        int count = (rank + 1 < num_distinct ? token_starts[rank + 1] : BT) - start;
        int ix = inp[sorted_bt[start]];
        for (int g = 0; g < num_c_groups; g++) {
            bucket_info[rank * num_c_groups + g] = make_int4(start, count, ix, g);
        }
        int chunks = CEIL_DIV(count, CHUNK_ITEMS);
        for (int chunk = 0; chunk < chunks; chunk++) {
            units[unit_starts[rank] + chunk] = make_int4(ix, chunk, start, count);
        }
    }
}
