    // Solution body for encoder_backward_atomic_fp32_kernel (the gap of skeletons.skeleton("atomic")).
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= B * T * C) { return; }
    int bt = idx / C;
    int t = bt % T;
    int c = idx % C;
    int ix = inp[bt];
    x128 packed_dout = load128cs(dout + idx);
    for (int k = 0; k < x128::size; k++) {
        float d = (float)packed_dout[k];
        atomicAdd(dwte32 + ix * C + c + k, d);  // many threads add into one row: atomics
        atomicAdd(dwpe32 + t * C + c + k, d);
    }
