    // Solution body for encoder_backward_wpe_kernel (the gap of skeletons.skeleton("wpe")); the package's
    // kernel unrolls the loop over b to keep more loads in flight, in the same order of adds.
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= T * C) { return; }
    float accum[x128::size];
    for (int k = 0; k < x128::size; k++) { accum[k] = 0.0f; }
    for (int b = 0; b < B; b++) {
        x128 packed_dout = load128cs(dout + b * T * C + idx);
        for (int k = 0; k < x128::size; k++) { accum[k] += (float)packed_dout[k]; }
    }
    x128 packed_dwpe = load128(dwpe + idx);
    for (int k = 0; k < x128::size; k++) {
        round_to_storage(accum[k] + (float)packed_dwpe[k], &packed_dwpe[k], (unsigned int)(idx + k),
                         NOISE_STREAM_DWPE, seed);
    }
    store128(dwpe + idx, packed_dwpe);
