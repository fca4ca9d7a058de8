    // Solution body for encoder_forward_kernel (goes into the gap of skeletons.skeleton("forward")).
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= B * T * C) { return; }
    int bt = idx / C;
    int t = bt % T;
    int c = idx % C;
    int ix = inp[bt];
    x128 wte128 = load128cs(wte + ix * C + c);
    x128 wpe128 = load128(wpe + t * C + c);
    x128 packed_out;
    for (int k = 0; k < x128::size; k++) {
        packed_out[k] = (floatX)((float)wte128[k] + (float)wpe128[k]);
    }
    store128(out + idx, packed_out);
