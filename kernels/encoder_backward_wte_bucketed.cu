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
// Launch: one block of WTE_BLOCK_SIZE = 256 threads (8 warps) per bucket:
//   grid = max_buckets, kernel(dwte, bucket_info, bt_list, dout, num_buckets, C, seed)
// *num_buckets (device memory) is the table's size; max_buckets >= it is what the host knows without a sync
// when the table was built on the GPU. Blocks past *num_buckets exit at once. The package launches it as a
// programmatic dependent of the kernel before it (common.cuh): it waits for that kernel before it reads anything.
//
// Inside a block: lane `lane_id` of every warp owns channels c .. c + x128::size - 1 of the bucket's group;
// warp w sums items w, w + 8, w + 16, ... in that order; then warp 0 adds warps 1, 2, ... 7 in that order
// (through shared memory, behind a named barrier that counts only the warps with items; the others have left),
// adds the old dwte value, and rounds once. Every sum has a fixed order, so the
// result is the same on every run and equals the NumPy mirror bit for bit.
#include "common.cuh"

#define WTE_BLOCK_SIZE 256
#define WTE_WARPS (WTE_BLOCK_SIZE / WARP_SIZE)

// Blocks per SM to fit: all its thread slots (2048 on sm_80/sm_90, 1536 on sm_86/89, 1024 on sm_75). On an
// H200, 8 blocks of 256 threads need <= 32 registers per thread; without the cap the compiler takes 40 and
// fits 6 blocks, and the many tiny buckets of a large batch ran up to 1.2x slower.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 750
#define WTE_MIN_BLOCKS 4
#elif defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890)
#define WTE_MIN_BLOCKS 6
#else
#define WTE_MIN_BLOCKS 8
#endif

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

    // Warps without an item (a bucket of 3 items keeps warps 0..2 busy) leave now, as in llm.c: their slots
    // go to the next blocks, which is what makes small buckets cheap. The busy warps meet at a named
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
