// encoder_backward_wte_bucketed.cu: the deterministic token-embedding backward,
// dwte[ix,:] += sum over every (b,t) with inp[b,t] == ix of dout[b,t,:], without atomics.
//
// The work comes pre-sorted into buckets (gpt2enc_edu/buckets.py builds the table, on the CPU or the GPU):
//   a bucket = one token id `ix` x one channel group of WARP_SIZE * x128::size channels
//              (256 for bf16, 128 for fp32), listing the positions bt = b*T + t where that token occurs.
//   bucket_info[bucket] = {start, size, ix, c_group}; its items are bt_list[start : start + size], in
//   ascending bt order. The channel groups of one token share the same item range.
//   Buckets come largest first, so the long ones start early instead of running alone at the end.
//
// Three kernels, the same sums in the same fp32 order, so the same bits:
//   encoder_backward_wte_bucketed_kernel        llm.c's form: one block of 8 warps per bucket. The course
//                                               builds this one.
//   encoder_backward_wte_bucketed_warps_kernel  the package's launch: a bucket with more than 8 items still gets
//                                               a block; every other bucket gets one warp, which adds its items
//                                               in the order the block would.
//   encoder_backward_wte_bucketed_warps_prefetch_kernel   the same, and a block first asks L2 for all the rows
//                                               of its big bucket (the package's launch where dout fits easily
//                                               in L2: gpt2enc_edu.cuda.bucketed_form).
//
// Launch, all: block = WTE_BLOCK_SIZE = 256 threads (8 warps),
//   kernel(dwte, bucket_info, bt_list, dout, num_buckets, C, seed)
//   llm.c's form:    grid = max_buckets (one block per bucket);
//   the warps forms: grid = CEIL_DIV(max_buckets, 8) (gpt2enc_edu.layout.bucketed_warps_grid).
// *num_buckets (device memory) is the table's size; max_buckets >= it is what the host knows without a sync
// when the table was built on the GPU. Work past *num_buckets is skipped at once. The package launches all three as
// programmatic dependents of the kernel before (common.cuh): they wait for it before they read anything.
//
// Inside a block of llm.c's form: lane `lane_id` of every warp owns channels c .. c + x128::size - 1 of the
// bucket's group; warp w sums items w, w + 8, w + 16, ... in that order; then warp 0 adds warps 1, 2, ... 7 in that
// order (through shared memory, behind a named barrier that counts only the warps with items; the others have
// left), adds the old dwte value, and rounds once. Every sum has a fixed order, so the result is the same on every
// run and equals the NumPy mirror bit for bit.
#include "common.cuh"

// WTE_BLOCK_SIZE: constants.cuh.
#define WTE_WARPS (WTE_BLOCK_SIZE / WARP_SIZE)

// Blocks per SM to fit: all its thread slots (SM_THREAD_SLOTS, common.cuh). On an H200, 8 blocks of 256 threads need
// <= 32 registers per thread; without the cap the compiler takes 40 and fits 6 blocks, and the many tiny buckets of a
// large batch ran up to 1.2x slower.
#define WTE_MIN_BLOCKS (SM_THREAD_SLOTS / WTE_BLOCK_SIZE)

extern "C" __global__ void __launch_bounds__(WTE_BLOCK_SIZE, WTE_MIN_BLOCKS)
    encoder_backward_wte_bucketed_kernel(floatX* dwte, const int4* bucket_info, const int* bt_list, const floatX* dout,
                                         const int* num_buckets, int C, unsigned int seed) {
    __shared__ float accum_shared[x128::size * WTE_BLOCK_SIZE];
    wait_for_previous_grid();  // the table (and dwte) are ready from here on (common.cuh)

    int bucket = blockIdx.x;
    // The table's size and this block's bucket are loaded together (the row exists even past the size:
    // bucket_info has max_buckets rows, all initialised), so the block waits one memory latency, not two.
    int table_size = *num_buckets;
    int4 info = bucket_info[bucket];
    if (bucket >= table_size) { return; }  // uniform across the block: no thread reaches the barrier
    int warp_id = threadIdx.x / WARP_SIZE;
    int lane_id = threadIdx.x % WARP_SIZE;
    int c_per_warp = WARP_SIZE * x128::size;

    int bucket_start = info.x;
    int bucket_size = info.y;
    int bucket_ix = info.z;
    int c = info.w * c_per_warp + lane_id * x128::size;

    // When C is not a multiple of c_per_warp (C = 776, say), the last group's high lanes have no channels.
    // They still reach the barrier below with their warp.
    bool has_channels = c < C;

    // Warps without an item (a bucket of 3 items keeps warps 0..2 busy) leave now, as in llm.c: they issue no
    // more instructions, but the block keeps its SM slot until its busy warps end (the warps form below is the
    // answer to that for small buckets). The busy warps meet at a named
    // barrier that counts only them (bar.sync 1, busy_warps * 32), so no thread waits for one that left;
    // a bucket of one item needs no barrier at all. Every thread that a barrier counts reaches it.
    int busy_warps = min(WTE_WARPS, bucket_size);
    if (warp_id >= busy_warps) { return; }

    // Warp 0 fetches the old dwte value now: its latency overlaps the dout loads instead of following them.
    floatX* dwte_ix = dwte + bucket_ix * C + c;
    x128 packed_dwte;
    if (warp_id == 0 && has_channels) { packed_dwte = load128(dwte_ix); }

    float accum[x128::size];
    for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }

    if (has_channels) {
        for (int item = warp_id; item < bucket_size; item += WTE_WARPS) {
            int bt = bt_list[bucket_start + item];
            x128 packed_dout = load128cs(dout + bt * C + c);  // each dout pack is read by one bucket only
            for (int k = 0; k < x128::size; k++) { accum[k] += (float)packed_dout[k]; }
        }
    }

    // Warps 1.. hand their partial sums to warp 0. Layout [k][thread] keeps a warp's 32 stores in 32 banks.
    if (busy_warps > 1) {
        if (warp_id != 0) {
            for (int k = 0; k < x128::size; k++) { accum_shared[threadIdx.x + k * WTE_BLOCK_SIZE] = accum[k]; }
        }
        asm volatile("bar.sync 1, %0;" ::"r"(busy_warps * WARP_SIZE) : "memory");
    }
    if (warp_id != 0 || !has_channels) { return; }

    // Warp 0 adds the busy warps in order 1, 2, ... (idle warps would have added +0.0: nothing to add).
    for (int w = 1; w < busy_warps; w++) {
        for (int k = 0; k < x128::size; k++) { accum[k] += accum_shared[w * WARP_SIZE + lane_id + k * WTE_BLOCK_SIZE]; }
    }

    for (int k = 0; k < x128::size; k++) {
        // Noise position: the element's flat index in dwte, so the rounding ignores bucket order and launch shape.
        round_to_storage(accum[k] + (float)packed_dwte[k], &packed_dwte[k], (unsigned int)(bucket_ix * C + c + k),
                         NOISE_STREAM_DWTE, seed);
    }
    store128(dwte_ix, packed_dwte);
}

// The warps form. Why: at B=64 on uniform ids a table has about 110,000 buckets of one or two items. In llm.c's form
// each is a block whose 7 or 8 idle warps leave at once, yet the block keeps its SM slot until it ends, so an SM
// works on about 8 buckets at a time; and a table built on the GPU launches max_buckets blocks (150,771 there),
// the empty ones included. Here each of those buckets is one warp's work: 48 warps at a time per SM of an H200 (6
// blocks of 8), in a grid of an eighth of the blocks.
//
// Thread -> work, with G = gridDim.x = CEIL_DIV(max_buckets, 8):
//   warp w of block b sums bucket 8b + w alone if it has at most WTE_WARPS items: the items in order, which is the
//   block's sum exactly (in a block, warp w would hold 0 + item w, and warp 0 adds those in order; 0 + x is x for
//   every x but -0, which it makes +0, and adding -0 or +0 to a sum that is never -0 gives the same);
//   a bucket with more items is summed by block (bucket % G), as llm.c's form sums it, with all 8 warps: block b
//   takes the big buckets among b, b + G, ..., b + 7G. Every bucket below 8G is thus summed once, in whatever
//   order the table lists them (the big ones first only makes it faster: block b has at most one then).
//
// Blocks per SM of the warps form: at most 6, so that a thread has 40 registers. With 32 (8 blocks, as llm.c's form
// has) the big buckets' loop of four loads in flight spilled to local memory and ran slower on every kind of ids
// (docs/experiments.md, wte kernels: "the warps form").
#if WTE_MIN_BLOCKS < 6
#define WTE_WARPS_MIN_BLOCKS WTE_MIN_BLOCKS
#else
#define WTE_WARPS_MIN_BLOCKS 6
#endif

// PREFETCH (the prefetch kernel): before a block sums a big bucket, each of its threads asks L2 for the bucket's rows
// of items t, t + 256, ... (prefetch_l2: no register is held, nothing waits), so that the warps' chains of dependent
// loads below find their rows in L2 instead of each waiting a full memory latency. Worth it where dout fits easily
// in L2; where it does not, the prefetched lines push each other out (docs/experiments.md, wte kernels: "a big
// bucket's rows asked of L2 first"). It is a template parameter, not a kernel argument: with a run-time flag the
// compiler scheduled the loop below slower even where the flag was off.
template <bool PREFETCH>
__device__ __forceinline__ void wte_bucketed_warps(floatX* dwte, const int4* bucket_info, const int* bt_list,
                                                   const floatX* dout, const int* num_buckets, int C, unsigned int seed,
                                                   float* accum_shared) {
    wait_for_previous_grid();

    int table_size = *num_buckets;
    int warp_id = threadIdx.x / WARP_SIZE;
    int lane_id = threadIdx.x % WARP_SIZE;
    int c_per_warp = WARP_SIZE * x128::size;

    // The block's candidates for a big bucket, b + k*G for k = 0..7: lane k of every warp reads one size. Every warp
    // gets the same mask, so all of them run the loop at the end the same way, and every thread reaches each
    // __syncthreads there. (In a table sorted largest first only k = 0 can be big, unless big buckets outnumber G.)
    bool big = false;
    if (lane_id < WTE_WARPS) {
        int candidate = blockIdx.x + lane_id * gridDim.x;
        big = candidate < table_size && bucket_info[candidate].y > WTE_WARPS;
    }
    unsigned int big_mask = __ballot_sync(0xffffffffu, big);

    // First the warp's own bucket, unless it is past the table or big (then a block sums it). Own buckets go first
    // so that they never wait for a big one: in a sorted table, the blocks whose own buckets are small hold only
    // middling big buckets (the biggest ones are the own buckets of the first blocks, which skip them at once).
    int own_bucket = blockIdx.x * WTE_WARPS + warp_id;
    int4 info = own_bucket < table_size ? bucket_info[own_bucket] : make_int4(0, 0, 0, 0);
    int c = info.w * c_per_warp + lane_id * x128::size;
    if (own_bucket < table_size && info.y <= WTE_WARPS && c < C) {
        floatX* dwte_ix = dwte + info.z * C + c;
        x128 packed_dwte = load128(dwte_ix);  // in flight while the items are summed
        float accum[x128::size];
        for (int j = 0; j < x128::size; j++) { accum[j] = 0.0f; }
        for (int item = 0; item < info.y; item++) {
            x128 packed_dout = load128cs(dout + bt_list[info.x + item] * C + c);
            for (int j = 0; j < x128::size; j++) { accum[j] += (float)packed_dout[j]; }
        }
        store_rounded_sum128(dwte_ix, packed_dwte, accum, (unsigned int)(info.z * C + c), NOISE_STREAM_DWTE, seed);
    }

    // Then the block's big buckets, each as llm.c's form sums it: all 8 warps have items.
    while (big_mask != 0) {
        int k = __ffs(big_mask) - 1;
        big_mask &= big_mask - 1;
        int4 big_info = bucket_info[blockIdx.x + k * gridDim.x];
        c = big_info.w * c_per_warp + lane_id * x128::size;
        bool has_channels = c < C;
        floatX* dwte_ix = dwte + big_info.z * C + c;
        x128 packed_dwte;
        if (warp_id == 0 && has_channels) { packed_dwte = load128(dwte_ix); }
        float accum[x128::size];
        for (int j = 0; j < x128::size; j++) { accum[j] = 0.0f; }
        if (has_channels) {
            // A big bucket is the long pole of skewed ids (a block sums thousands of items): four of a warp's
            // items are loaded before the first is added, then added in order, so the sum is unchanged.
            const int* items = bt_list + big_info.x;
            if (PREFETCH) {
                int c0 = big_info.w * c_per_warp;
                for (int i = threadIdx.x; i < big_info.y; i += WTE_BLOCK_SIZE) {
                    const floatX* row = dout + items[i] * C + c0;
                    prefetch_l2(row, row + min(c_per_warp, C - c0));
                }
            }
            int item = warp_id;
            for (; item + 3 * WTE_WARPS < big_info.y; item += 4 * WTE_WARPS) {
                int bt[4];
                for (int u = 0; u < 4; u++) { bt[u] = items[item + u * WTE_WARPS]; }
                x128 packed_dout[4];
                for (int u = 0; u < 4; u++) { packed_dout[u] = load128cs(dout + bt[u] * C + c); }
                for (int u = 0; u < 4; u++) {
                    for (int j = 0; j < x128::size; j++) { accum[j] += (float)packed_dout[u][j]; }
                }
            }
            for (; item < big_info.y; item += WTE_WARPS) {
                x128 packed_dout = load128cs(dout + items[item] * C + c);
                for (int j = 0; j < x128::size; j++) { accum[j] += (float)packed_dout[j]; }
            }
            if (warp_id != 0) {
                for (int j = 0; j < x128::size; j++) { accum_shared[threadIdx.x + j * WTE_BLOCK_SIZE] = accum[j]; }
            }
        }
        __syncthreads();  // the warps' sums are in shared memory
        if (warp_id == 0 && has_channels) {
            for (int w = 1; w < WTE_WARPS; w++) {
                for (int j = 0; j < x128::size; j++) {
                    accum[j] += accum_shared[w * WARP_SIZE + lane_id + j * WTE_BLOCK_SIZE];
                }
            }
            store_rounded_sum128(dwte_ix, packed_dwte, accum, (unsigned int)(big_info.z * C + c), NOISE_STREAM_DWTE,
                                 seed);
        }
        __syncthreads();  // warp 0 has read them: shared memory is free for the next big bucket
    }
}

extern "C" __global__ void __launch_bounds__(WTE_BLOCK_SIZE, WTE_WARPS_MIN_BLOCKS)
    encoder_backward_wte_bucketed_warps_kernel(floatX* dwte, const int4* bucket_info, const int* bt_list,
                                               const floatX* dout, const int* num_buckets, int C, unsigned int seed) {
    __shared__ float accum_shared[x128::size * WTE_BLOCK_SIZE];
    wte_bucketed_warps<false>(dwte, bucket_info, bt_list, dout, num_buckets, C, seed, accum_shared);
}

extern "C" __global__ void __launch_bounds__(WTE_BLOCK_SIZE, WTE_WARPS_MIN_BLOCKS)
    encoder_backward_wte_bucketed_warps_prefetch_kernel(floatX* dwte, const int4* bucket_info, const int* bt_list,
                                                        const floatX* dout, const int* num_buckets, int C,
                                                        unsigned int seed) {
    __shared__ float accum_shared[x128::size * WTE_BLOCK_SIZE];
    wte_bucketed_warps<true>(dwte, bucket_info, bt_list, dout, num_buckets, C, seed, accum_shared);
}
