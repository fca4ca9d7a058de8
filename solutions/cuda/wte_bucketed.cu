    // Solution body for encoder_backward_wte_bucketed_kernel (the gap of skeletons.skeleton("wte_bucketed")).
    __shared__ float partials[WTE_WARPS][x128::size][WARP_SIZE];
    int bucket = blockIdx.x;
    if (bucket >= *num_buckets) { return; }  // the whole block leaves: nobody waits at the barrier
    int warp_id = threadIdx.x / WARP_SIZE;
    int lane_id = threadIdx.x % WARP_SIZE;
    int4 info = bucket_info[bucket];
    int c = info.w * WARP_SIZE * x128::size + lane_id * x128::size;
    bool has_channels = c < C;
    float accum[x128::size];
    for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }
    if (has_channels) {
        for (int item = warp_id; item < info.y; item += WTE_WARPS) {
            x128 packed_dout = load128cs(dout + bt_list[info.x + item] * C + c);
            for (int k = 0; k < x128::size; k++) { accum[k] += (float)packed_dout[k]; }
        }
    }
    for (int k = 0; k < x128::size; k++) { partials[warp_id][k][lane_id] = accum[k]; }
    __syncthreads();  // every thread of the block gets here
    if (warp_id != 0 || !has_channels) { return; }
    for (int w = 1; w < min(WTE_WARPS, info.y); w++) {
        for (int k = 0; k < x128::size; k++) { accum[k] += partials[w][k][lane_id]; }
    }
    floatX* dwte_ix = dwte + info.z * C + c;
    x128 packed_dwte = load128(dwte_ix);
    for (int k = 0; k < x128::size; k++) {
        round_to_storage(accum[k] + (float)packed_dwte[k], &packed_dwte[k], (unsigned int)(info.z * C + c + k),
                         NOISE_STREAM_DWTE, seed);
    }
    store128(dwte_ix, packed_dwte);
