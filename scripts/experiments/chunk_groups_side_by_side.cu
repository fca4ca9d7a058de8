// chunk_groups_side_by_side.cu: the package's chunk kernel (kernels/encoder_backward_wte_chunked.cu) compiled
// unchanged, but launched so that the channel groups of one unit block run side by side. For the probe
// scripts/experiments/probe_chunk_group_order.py; nothing in gpt2enc_edu launches it.
//
// The question (docs/experiments.md, wte kernels: "channel groups side by side"): the package launches the chunk
// kernel on a grid (unit blocks, channel groups) and takes the group from blockIdx.y. Blocks start in order of their
// linear index,
// x fastest, so at B=64 every unit block's group 0 runs in about the first third of the kernel's time, then
// group 1, then group 2: the three 512-byte pieces of one dout row (b, t) and of one dwte row are read some 20-25 us
// apart, each as a separate visit to DRAM. Here the grid is (groups, unit blocks), the package's two dimensions
// swapped, and the kernel reads its unit block from blockIdx.y and its group from blockIdx.x: block (g, u) starts
// right after (g - 1, u), so a row's three pieces are asked for together. Every warp does exactly the work it does in
// the package (the same unit, group, sums and rounding), so the bits cannot change; only the order in which blocks
// start does. (A one-row grid with block k taking unit block k / 3 and group k % 3 would do the same, but the
// division made ptxas spill at the kernel's 32 registers; the swap needs no extra register.)
//
// How: the kernel file is included after blockIdx is redefined as the swapped index. Its own include of common.cuh
// is then a no-op (#pragma once), so nothing else is remapped. (The combine kernel in the same file is remapped
// too: the probe launches the package's.) Launch:
//   grid = (num_groups, CEIL_DIV(max_units, CHUNKED_WARPS_PER_BLOCK)): at most 65535 unit blocks, so at most
//   524,280 units (every probe shape has at most 65,536 ids);
//   block, arguments and partials as the package's encoder_backward_wte_chunked_kernel.
#include "common.cuh"

__device__ __forceinline__ uint3 groups_side_by_side_block_index() { return make_uint3(blockIdx.y, blockIdx.x, 0); }

#define blockIdx groups_side_by_side_block_index()
#include "encoder_backward_wte_chunked.cu"
#undef blockIdx
