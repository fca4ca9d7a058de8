// bench_spin.cu: a busy-wait of the benchmark's timer (gpt2enc_edu/bench/timer.py), not part of the encoder.
//
// Launch: one block of one thread on the stream of the timed call, just before its first CUDA event:
//   kernel<<<1, 1>>>(ns)
// It keeps that stream busy for `ns` nanoseconds of the GPU's global timer, so the host can enqueue the timed
// call behind it while the GPU still spins: the CUDA events around the call then time the GPU's work, not
// Python's launch overhead. It reads and writes no memory and needs no header, so it compiles the same for
// both storage dtypes.

extern "C" __global__ void bench_spin_kernel(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
