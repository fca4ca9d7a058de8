// encoder_backward_wte_chunked.cu: the deterministic token-embedding backward, fast and skew-proof.
//
// Same result definition style as encoder_backward_wte_bucketed.cu (a fixed order for every sum), but the
// work is cut finer, so that neither tiny buckets nor huge ones waste the GPU:
//   a unit = (bucket, chunk): CHUNK_ITEMS consecutive items of one bucket (the last chunk may be shorter);
//   one WARP per unit (not one block per bucket): a bucket of 1 item no longer idles 7 warps, and a bucket of
//   9000 items (a very frequent token) is spread over 282 warps instead of running alone on one block.
//
// The fixed order, which the NumPy mirror (gpt2enc_edu/mirror.py) follows exactly:
//   chunk partial  p = ((0 + d[item 0]) + d[item 1]) + ...      over the chunk's items, in bt order
//   bucket total   s = ((p_0 + p_1) + p_2) + ...                 over the bucket's chunks, in chunk order
//   dwte           = round_to_storage(s + dwte_old)               (for one chunk, s = p_0)
// The warp that finishes a bucket's chunks last adds the partials; *which* warp that is depends on timing,
// but the order of the additions it performs does not, so the bits never change.
//
// Launch: 1-D grid of CHUNKED_WARPS_PER_BLOCK warps per block, one warp per unit:
//   grid = CEIL_DIV(max_units, CHUNKED_WARPS_PER_BLOCK), block = 32 * CHUNKED_WARPS_PER_BLOCK
//   kernel(dwte, unit_info, bucket_info, bt_list, dout, partials, chunks_done, num_units, C, seed)
// max_units may exceed *num_units (the GPU bucketing route knows only a bound on the host without a sync);
// warps past *num_units exit at once. partials: floats for units of multi-chunk buckets (a prefix of the
// unit list), WARP_SIZE * x128::size per unit. chunks_done: one int per bucket, zero before the launch; the
// last warp of a bucket resets its counter to zero, so the buffer is ready for the next launch.
#include "common.cuh"

#define CHUNK_ITEMS 32
#define CHUNKED_WARPS_PER_BLOCK 8
#define CHUNK_UNROLL 4

extern "C" __global__ void __launch_bounds__(WARP_SIZE * CHUNKED_WARPS_PER_BLOCK)
encoder_backward_wte_chunked_kernel(floatX* dwte, const int2* unit_info, const int4* bucket_info,
                                    const int* bt_list, const floatX* dout, float* partials, int* chunks_done,
                                    const int* num_units, int C, unsigned int seed) {
    int warp_id = threadIdx.x / WARP_SIZE;
    int lane_id = threadIdx.x % WARP_SIZE;
    int unit = blockIdx.x * CHUNKED_WARPS_PER_BLOCK + warp_id;
    if (unit >= *num_units) { return; }  // the whole warp leaves together
    int c_per_warp = WARP_SIZE * x128::size;

    int2 work = unit_info[unit];
    int bucket = work.x;
    int chunk = work.y;
    int4 info = bucket_info[bucket];
    int bucket_start = info.x;
    int bucket_size = info.y;
    int bucket_ix = info.z;
    int c = info.w * c_per_warp + lane_id * x128::size;
    bool has_channels = c < C;

    int num_chunks = CEIL_DIV(bucket_size, CHUNK_ITEMS);
    int chunk_first = chunk * CHUNK_ITEMS;
    int chunk_size = min(CHUNK_ITEMS, bucket_size - chunk_first);

    // Fetch the old dwte early: its latency overlaps the dout loads (only a single-chunk bucket uses it here).
    floatX* dwte_ix = dwte + bucket_ix * C + c;
    x128 packed_dwte;
    if (has_channels && num_chunks == 1) { packed_dwte = load128(dwte_ix); }

    // One coalesced load of the chunk's positions (lane i holds item i); shuffles hand them to every lane.
    int my_bt = lane_id < chunk_size ? bt_list[bucket_start + chunk_first + lane_id] : 0;

    float accum[x128::size];
    for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }

    // Items in order; CHUNK_UNROLL loads are issued before they are added, so several are in flight at once.
    for (int item = 0; item < chunk_size; item += CHUNK_UNROLL) {
        x128 packed_dout[CHUNK_UNROLL];
#pragma unroll
        for (int u = 0; u < CHUNK_UNROLL; u++) {
            int bt = __shfl_sync(0xffffffffu, my_bt, (item + u) % WARP_SIZE);
            if (has_channels && item + u < chunk_size) { packed_dout[u] = load128cs(dout + bt * C + c); }
        }
#pragma unroll
        for (int u = 0; u < CHUNK_UNROLL; u++) {
            if (has_channels && item + u < chunk_size) {
                for (int k = 0; k < x128::size; k++) { accum[k] += (float)packed_dout[u][k]; }
            }
        }
    }

    if (num_chunks == 1) {
        if (!has_channels) { return; }
        for (int k = 0; k < x128::size; k++) {
            round_to_storage(accum[k] + (float)packed_dwte[k], &packed_dwte[k],
                             (unsigned int)(bucket_ix * C + c + k), NOISE_STREAM_DWTE, seed);
        }
        store128(dwte_ix, packed_dwte);
        return;
    }

    // Several chunks: publish this chunk's partial sum, then count finished chunks. The fence makes the
    // partial visible to every other SM before the counter says it is there.
    float4* my_partial = reinterpret_cast<float4*>(partials + (size_t)unit * c_per_warp + lane_id * x128::size);
    if (has_channels) {
        for (int q = 0; q < x128::size / 4; q++) {
            my_partial[q] = make_float4(accum[4 * q], accum[4 * q + 1], accum[4 * q + 2], accum[4 * q + 3]);
        }
    }
    __threadfence();
    __syncwarp();
    int finished_before = 0;
    if (lane_id == 0) { finished_before = atomicAdd(chunks_done + bucket, 1); }
    finished_before = __shfl_sync(0xffffffffu, finished_before, 0);
    if (finished_before != num_chunks - 1) { return; }  // another warp will finish this bucket

    // This warp completed the bucket: add the partials in chunk order (ld.cg: read them from L2, where the
    // other SMs wrote them, never from a stale L1 line), then the old value, and round once.
    __threadfence();
    if (lane_id == 0) { chunks_done[bucket] = 0; }  // ready for the next launch
    if (!has_channels) { return; }
    int first_unit = unit - chunk;
    float total[x128::size];
    for (int k = 0; k < x128::size; k++) { total[k] = 0.0f; }
    for (int ch = 0; ch < num_chunks; ch += CHUNK_UNROLL) {
        float4 loaded[CHUNK_UNROLL][x128::size / 4];
#pragma unroll
        for (int u = 0; u < CHUNK_UNROLL; u++) {
            const float4* partial = reinterpret_cast<const float4*>(
                partials + (size_t)(first_unit + ch + u) * c_per_warp + lane_id * x128::size);
            if (ch + u < num_chunks) {
                for (int q = 0; q < x128::size / 4; q++) { loaded[u][q] = __ldcg(partial + q); }
            }
        }
#pragma unroll
        for (int u = 0; u < CHUNK_UNROLL; u++) {
            if (ch + u < num_chunks) {
                const float* p = reinterpret_cast<const float*>(loaded[u]);
                for (int k = 0; k < x128::size; k++) { total[k] = (ch + u == 0) ? p[k] : total[k] + p[k]; }
            }
        }
    }
    packed_dwte = load128(dwte_ix);
    for (int k = 0; k < x128::size; k++) {
        round_to_storage(total[k] + (float)packed_dwte[k], &packed_dwte[k],
                         (unsigned int)(bucket_ix * C + c + k), NOISE_STREAM_DWTE, seed);
    }
    store128(dwte_ix, packed_dwte);
}
