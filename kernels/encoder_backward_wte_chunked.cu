// encoder_backward_wte_chunked.cu: the deterministic token-embedding backward, fast and skew-proof.
//
// Same kind of result definition as encoder_backward_wte_bucketed.cu (a fixed order for every sum), but the
// work is cut so that neither rare nor very frequent tokens waste the GPU:
//   a unit = (token, chunk): CHUNK_ITEMS consecutive positions of one token (the last chunk may be shorter);
//   one WARP per unit and channel group (not one block per bucket). A token seen once no longer idles 7 warps,
//   and a token seen n times is spread over CEIL_DIV(n, CHUNK_ITEMS) units instead of running alone on one block.
//
// The fixed order, which the NumPy mirror (gpt2enc_edu/mirror.py) follows exactly, for every channel:
//   chunk partial  p = ((0 + d[item 0]) + d[item 1]) + ...      over the chunk's items, in bt order
//   token total    s = ((p_0 + p_1) + p_2) + ...                 over the token's chunks, in chunk order
//   dwte           = round_to_storage(s + dwte_old)               (for a single chunk, s = p_0)
//
// Two kernels, launched one after the other on one stream, each as a programmatic dependent of the kernel before
// it (common.cuh: on sm_90 and newer it is set up while that kernel runs and waits for it inside):
//   the chunk kernel, in one of two forms with the same arguments, the same grid and the same bits:
//     encoder_backward_wte_chunked_kernel: a warp walks its chunk's rows one at a time, in registers;
//     encoder_backward_wte_chunked_staged_kernel: a warp copies STAGED_ROWS rows at a time into shared memory
//       (cp.async) and adds them from there; fewer blocks fit an SM, so the package launches it only where its
//       grid fits on the GPU in one wave (gpt2enc_edu.cuda.chunk_walk: on an H200 at GPT-2 shapes, B <= 2).
//     One warp per (unit, channel group). A single-chunk token (most of them) is finished here: read-modify-write
//     of dwte. A multi-chunk token's warps store their partials.
//     grid = (CEIL_DIV(max_units, CHUNKED_WARPS_PER_BLOCK), num_groups), block = WARP_SIZE * CHUNKED_WARPS_PER_BLOCK
//     kernel(dwte, units, bt_list, dout, partials, num_units, C, seed)
//     num_groups = CEIL_DIV(C, WARP_SIZE * x128::size): 3 for C = 768 in bf16. blockIdx.y is the group, so the
//     grid must have exactly num_groups rows: a warp sums one channel group and keeps nothing across groups.
//   encoder_backward_wte_chunk_combine_kernel: the blocks of a multi-chunk token's units share its channels
//     (slices of columns of 4 channels); a block copies its slice's partials into shared memory, and one thread
//     per column adds them in chunk order, then the old value, and rounds once.
//     grid = max_multi_chunk_units, block = COMBINE_THREADS
//     kernel(dwte, units, partials, num_units, C, seed)
// units[u] = {ix, chunk, start, size}: the token, which chunk, and the token's range in bt_list.
// max_units may exceed *num_units (the GPU bucketing route knows only a bound on the host, without a sync);
// warps and blocks past *num_units exit at once. `units` must hold an initialised row for every warp of the
// chunk kernel's grid (the package pads it to a multiple of CHUNKED_WARPS_PER_BLOCK rows). partials: for
// each unit of a multi-chunk token (a prefix of the unit list), C rounded up to whole channel groups of floats.
#include "chunk_sum.cuh"

// CHUNK_ITEMS, CHUNKED_WARPS_PER_BLOCK, COMBINE_THREADS, COMBINE_STAGE_PACKS, COMBINE_MIN_COLUMNS: constants.cuh.
// Each warp waits on a chain of dependent loads (unit -> positions -> gradients): latency, not bandwidth,
// bounds it, so the kernel wants many warps per SM. One channel group per warp keeps a thread's state small
// (8 sums, one dout pack, one dwte pack) so that 8 blocks of 8 warps fit an SM, the most an SM holds.
// (The forms measured: docs/experiments.md, wte kernels: "a warp per (unit, channel group)".)
// Ask for what fits an SM's thread slots (common.cuh).
#define CHUNKED_MIN_BLOCKS (SM_THREAD_SLOTS / (WARP_SIZE * CHUNKED_WARPS_PER_BLOCK))
// The staged form: rows a warp has in flight at once, and the blocks per SM it asks registers for. A warp's stage
// holds STAGED_ROWS rows of its channel group (8 rows x 512 bytes): 32 KB per block of 8 warps, so 6 blocks
// fit the 228 KB of an H100/H200 SM, and 65536 / (6 * 256) leaves 42 registers per thread, enough not to spill.
#define STAGED_ROWS 8
#if defined(__CUDA_ARCH__) && \
    (__CUDA_ARCH__ == 750 || __CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890)
#define STAGED_MIN_BLOCKS 4
#else
#define STAGED_MIN_BLOCKS 6
#endif
// The combine kernel's stages: COMBINE_STAGE_PACKS = 1536 packs of 16 bytes each, two of them: 48 KB, the most static shared memory a
// block may have. A token gets at most CEIL_DIV(C / 4, COMBINE_MIN_COLUMNS) slices, so a slice is about
// COMBINE_MIN_COLUMNS columns of 4 channels wide or wider (128 bytes of a partial row).

// The chunk's rows of dout, summed in item order (chunk_sum.cuh): accum = ((0 + d[item 0]) + d[item 1]) + ...
// One row at a time: each read waits for its row before the next is asked for (the order of the adds is fixed,
// and a second row in flight would cost registers that 8 blocks per SM do not leave). Lane i holds item i's bt;
// every lane takes part in each shuffle, and only lanes with channels load.
__device__ __forceinline__ void sum_rows(float* accum, const floatX* dout, int my_bt, int chunk_size, int C, int c,
                                         bool has_channels) {
    chunk_sum<1, x128>(accum, chunk_size, has_channels, [&](int item, x128& row) {
        int bt = __shfl_sync(0xffffffffu, my_bt, item);
        if (has_channels) { row = load128cs(dout + bt * C + c); }
    });
}

// The same sum, STAGED_ROWS rows at a time, added to accum (zero when it starts): the lane copies its 16 bytes of each of the next STAGED_ROWS rows into
// its slots of shared memory (`stage`: slot i at stage + i * WARP_SIZE * x128::size, so that a warp's 32 lanes
// touch 512 contiguous bytes), waits for them once, then adds them from there in the same order. One memory
// latency per STAGED_ROWS rows instead of one per row, and no register holds a row while it travels: a frequent
// token's chunk of 32 rows waited 32 latencies, now 4 (docs/experiments.md, wte kernels: "a chunk's rows staged").
__device__ __forceinline__ void add_rows_staged(float* accum, const floatX* dout, int my_bt, int chunk_size, int C,
                                                int c, bool has_channels, floatX* stage) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    for (int base = 0; base < chunk_size; base += STAGED_ROWS) {
        int rows = min(STAGED_ROWS, chunk_size - base);
        // cp.async is not ordered with this thread's other shared-memory accesses: __syncwarp makes the reads of
        // the round before complete before these copies overwrite the slots.
        __syncwarp();
        for (int i = 0; i < rows; i++) {
            int bt = __shfl_sync(0xffffffffu, my_bt, base + i);
            if (has_channels) { copy16_async(stage + i * WARP_SIZE * x128::size, dout + bt * C + c); }
        }
        wait_async_copies();
        for (int i = 0; i < rows; i++) {
            if (has_channels) {
                x128 packed_dout = *reinterpret_cast<const x128*>(stage + i * WARP_SIZE * x128::size);
                for (int k = 0; k < x128::size; k++) { accum[k] += (float)packed_dout[k]; }
            }
        }
    }
#else
    sum_rows(accum, dout, my_bt, chunk_size, C, c, has_channels);  // no cp.async before sm_80
#endif
}

// The work of one warp of the chunk kernel: its unit, for channel group blockIdx.y.
// `stage` is the lane's first slot in its warp's stage (the staged form), or nullptr (rows in registers).
template <bool STAGED>
__device__ __forceinline__ void chunk_warp(floatX* dwte, const int4* units, const int* bt_list, const floatX* dout,
                                           float* partials, const int* num_units, int C, unsigned int seed,
                                           floatX* stage) {
    // Launched as a programmatic dependent of the table's kernel (common.cuh): wait for it, then let the combine
    // kernel be set up while this one runs.
    wait_for_previous_grid();
    allow_next_grid();
    int warp_id = threadIdx.x / WARP_SIZE;
    int lane_id = threadIdx.x % WARP_SIZE;
    int unit = blockIdx.x * CHUNKED_WARPS_PER_BLOCK + warp_id;
    // The table's size and this warp's unit are loaded together (units has a row for every warp of the
    // grid, all initialised), so the warp waits one memory latency here, not two.
    int table_size = *num_units;
    int4 work = units[unit];
    if (unit >= table_size) { return; }  // the whole warp leaves together
    int c_per_warp = WARP_SIZE * x128::size;
    int num_groups = CEIL_DIV(C, c_per_warp);

    int ix = work.x;
    int chunk = work.y;
    int token_start = work.z;
    int token_size = work.w;
    int num_chunks = CEIL_DIV(token_size, CHUNK_ITEMS);
    int chunk_first = chunk * CHUNK_ITEMS;
    int chunk_size = min(CHUNK_ITEMS, token_size - chunk_first);
    bool single_chunk = num_chunks == 1;
    // One coalesced load of the chunk's positions (lane i holds item i); shuffles hand them to every lane.
    int my_bt = lane_id < chunk_size ? bt_list[token_start + chunk_first + lane_id] : 0;
    // No L2 prefetch of the chunk's rows before the sum, and no loop over channel groups (one grid row per group):
    // both cost registers (at 32 per thread the kernel spilled) and time, at every batch size measured
    // (docs/experiments.md, wte kernels: "the chunk kernel without its L2 prefetch and its loop over groups").
    int g = blockIdx.y;  // one grid row per channel group
    int c = g * c_per_warp + lane_id * x128::size;
    bool has_channels = c < C;  // lanes past C (in the last group of a C that is no multiple) only shuffle
    // Fetch the old dwte early: its latency overlaps the dout loads.
    x128 packed_dwte;
    if (has_channels && single_chunk) { packed_dwte = load128(dwte + ix * C + c); }

    // The chunk's items in order: accum = ((0 + d[item 0]) + d[item 1]) + ...
    float accum[x128::size];
    if (STAGED && chunk_size > 1) {
        for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }
        add_rows_staged(accum, dout, my_bt, chunk_size, C, c, has_channels, stage);
    } else {  // one row gains nothing from a trip through shared memory
        sum_rows(accum, dout, my_bt, chunk_size, C, c, has_channels);
    }
    if (!has_channels) { return; }  // lanes past C only took part in the shuffles
    if (single_chunk) {
        store_rounded_sum128(dwte + ix * C + c, packed_dwte, accum, (unsigned int)(ix * C + c), NOISE_STREAM_DWTE,
                             seed);
    } else {
        float4* partial =
            reinterpret_cast<float4*>(partials + ((size_t)unit * num_groups + g) * c_per_warp + lane_id * x128::size);
        for (int p = 0; p < x128::size / 4; p++) {
            partial[p] = make_float4(accum[4 * p], accum[4 * p + 1], accum[4 * p + 2], accum[4 * p + 3]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(WARP_SIZE* CHUNKED_WARPS_PER_BLOCK, CHUNKED_MIN_BLOCKS)
    encoder_backward_wte_chunked_kernel(floatX* dwte, const int4* units, const int* bt_list, const floatX* dout,
                                        float* partials, const int* num_units, int C, unsigned int seed) {
    chunk_warp<false>(dwte, units, bt_list, dout, partials, num_units, C, seed, nullptr);
}

extern "C" __global__ void __launch_bounds__(WARP_SIZE* CHUNKED_WARPS_PER_BLOCK, STAGED_MIN_BLOCKS)
    encoder_backward_wte_chunked_staged_kernel(floatX* dwte, const int4* units, const int* bt_list, const floatX* dout,
                                               float* partials, const int* num_units, int C, unsigned int seed) {
    __shared__ alignas(16) floatX stage[CHUNKED_WARPS_PER_BLOCK][STAGED_ROWS][WARP_SIZE * x128::size];
    int warp_id = threadIdx.x / WARP_SIZE;
    int lane_id = threadIdx.x % WARP_SIZE;
    chunk_warp<true>(dwte, units, bt_list, dout, partials, num_units, C, seed,
                     &stage[warp_id][0][lane_id * x128::size]);
}

// Stage one 16-byte pack of partial sums into shared memory: cp.async where there is one (the thread keeps no
// register for it and can have many in flight), else a plain load and store (sm_75: the stage then simply fills
// before the barrier that follows).
__device__ __forceinline__ void stage_pack(float4* shared_target, const float* global_source) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    copy16_async(shared_target, global_source);
#else
    *shared_target = *reinterpret_cast<const float4*>(global_source);
#endif
}

// The combine kernel. Adding a token's partials is one chain of dependent adds per channel, chunk after chunk. A
// block that fetched its own partials, 16 chunks at a time, would wait one memory latency for every 16: the most
// frequent token of a large skewed batch (hundreds of chunks at B=64 on Zipf ids) would keep one block busy long
// after every other warp was done.
// Two changes take the waiting off that chain, without touching the order of any add:
//   * the token's channels are cut into slices, as many as it has chunks (between combine_slices' bounds), and
//     the block of the token's unit `chunk` takes slice `chunk` (and chunk + num_chunks, ... where there are more
//     slices than chunks): a frequent token's partials are read by up to 24 SMs at once (C = 768), not one;
//   * the whole block copies the slice's partials into shared memory, COMBINE_STAGE_PACKS packs per stage and two
//     stages in flight (cp.async), and one thread per column of 4 channels adds them from there in chunk order.
// (What it gained, and the slice widths and stage sizes tried: docs/experiments.md, wte kernels: "the combine
// kernel spread over a token's unit blocks".)
// Slices: Q = C / 4 columns; num_slices = min(max(num_chunks, CEIL_DIV(Q, COMBINE_THREADS)), CEIL_DIV(Q,
// COMBINE_MIN_COLUMNS)), then width = CEIL_DIV(Q, num_slices) columns each (the last may be narrower) and
// num_slices = CEIL_DIV(Q, width). gpt2enc_edu.layout.combine_slices computes the same for the mirror.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
    encoder_backward_wte_chunk_combine_kernel(floatX* dwte, const int4* units, const float* partials,
                                              const int* num_units, int C, unsigned int seed) {
    __shared__ alignas(16) float4 stage[2][COMBINE_STAGE_PACKS];
    wait_for_previous_grid();  // the chunk kernel's partials and dwte rows are written from here on (common.cuh)
    int unit = blockIdx.x;
    if (unit >= *num_units) { return; }
    int4 work = units[unit];
    int ix = work.x;
    int chunk = work.y;
    int num_chunks = CEIL_DIV(work.w, CHUNK_ITEMS);
    if (num_chunks == 1) { return; }  // single-chunk tokens are done already
    int q_total = C / 4;  // columns of 4 channels (C is a multiple of the 16-byte pack)
    int num_slices = min(max(num_chunks, CEIL_DIV(q_total, COMBINE_THREADS)), CEIL_DIV(q_total, COMBINE_MIN_COLUMNS));
    int width = CEIL_DIV(q_total, num_slices);
    num_slices = CEIL_DIV(q_total, width);
    if (chunk >= num_slices) { return; }  // the whole block leaves together: no barrier is skipped
    int c_padded = CEIL_DIV(C, WARP_SIZE * x128::size) * WARP_SIZE * x128::size;
    // The token's units are consecutive, so its chunk ch's partials are ch * c_padded after its first unit's.
    const float* token_partials = partials + (size_t)(unit - chunk) * c_padded;

    for (int slice = chunk; slice < num_slices; slice += num_chunks) {
        int q0 = slice * width;
        int cols = min(width, q_total - q0);
        int rows_per_stage = COMBINE_STAGE_PACKS / cols;
        int num_stages = CEIL_DIV(num_chunks, rows_per_stage);
        int col = threadIdx.x;  // the column this thread adds (threads past cols only copy)
        bool adder = col < cols;
        int c = (q0 + col) * 4;
        // The 4 old dwte values first: their latency overlaps the copies.
        floatX old[4];
        if (adder) {
            for (int k = 0; k < 4; k++) { old[k] = dwte[ix * C + c + k]; }
        }
        // Stage s holds chunks s * rows_per_stage ... as rows of `cols` packs; every thread copies some of them.
        auto copy_stage = [&](int s) {
            if (s < num_stages) {
                int first = s * rows_per_stage;
                int packs = min(rows_per_stage, num_chunks - first) * cols;
                for (int e = threadIdx.x; e < packs; e += COMBINE_THREADS) {
                    int row = e / cols;
                    int q = e - row * cols;
                    stage_pack(&stage[s % 2][e], token_partials + (size_t)(first + row) * c_padded + (q0 + q) * 4);
                }
            }
            commit_async_copies();  // a group per stage, empty past the last, so that the wait below counts right
        };
        copy_stage(0);
        copy_stage(1);
        float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int s = 0; s < num_stages; s++) {
            wait_async_copies_but<1>();  // this thread's copies of stage s have landed (stage s + 1 may not have)
            __syncthreads();  // ... and everyone's
            if (adder) {
                int first = s * rows_per_stage;
                int rows = min(rows_per_stage, num_chunks - first);
                for (int row = 0; row < rows; row++) {
                    float4 loaded = stage[s % 2][row * cols + col];
                    if (first + row == 0) {  // chunk 0: total = p_0
                        total = loaded;
                    } else {
                        total.x += loaded.x;
                        total.y += loaded.y;
                        total.z += loaded.z;
                        total.w += loaded.w;
                    }
                }
            }
            __syncthreads();  // stage s is read: its buffer may take stage s + 2
            copy_stage(s + 2);
        }
        wait_async_copies();  // nothing is left in flight (the groups past the last stage are empty)
        if (adder) {
            float sums[4] = {total.x, total.y, total.z, total.w};
            for (int k = 0; k < 4; k++) {
                round_to_storage(sums[k] + (float)old[k], &old[k], (unsigned int)(ix * C + c + k), NOISE_STREAM_DWTE,
                                 seed);
            }
            for (int k = 0; k < 4; k++) { dwte[ix * C + c + k] = old[k]; }
        }
    }
}
