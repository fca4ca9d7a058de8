// chunk_sum.cuh: the chunked method's sum of one chunk, which the chunk kernel (encoder_backward_wte_chunked.cu, its
// register form) and the one-launch backward (encoder_backward_small.cu, both of its task kinds) compute.
//
// For every element k of a thread's pack of channels:
//   accum[k] = ((0 + d[item 0][k]) + d[item 1][k]) + ...      over the chunk's n <= CHUNK_ITEMS items, in item order
// (bt ascending inside a token): a part of the result's definition, so the kernels that call this agree bit for bit.
// How the rows travel is the caller's choice, which changes no add and no order: fetch(i, row) puts item i's pack
// in `row`, and ROWS_IN_FLIGHT rows are asked for before the first of them is added: 1, each read waiting for the
// add before it (as a warp with few registers to spare wants), or all of the chunk's rows at once (n <=
// ROWS_IN_FLIGHT, which the caller guarantees). `active` false: the thread only fetches (a lane past C that must
// still take part in the caller's shuffles).
#pragma once

#include "common.cuh"

// The elements of a pack as floats: PackOf<Pack>::size of them, element(pack, k) = (float) of the stored element.
template <class Pack>
struct PackOf;

template <>
struct PackOf<x128> {
    static constexpr int size = x128::size;
    static __device__ __forceinline__ float element(const x128& pack, int k) { return (float)pack[k]; }
};

template <int ROWS_IN_FLIGHT, class Pack, class Fetch>
__device__ __forceinline__ void chunk_sum(float* accum, int n, bool active, Fetch fetch) {
    if constexpr (ROWS_IN_FLIGHT == 1) {
        for (int k = 0; k < PackOf<Pack>::size; k++) { accum[k] = 0.0f; }
        for (int i = 0; i < n; i++) {
            Pack row;
            fetch(i, row);
            if (active) {
                for (int k = 0; k < PackOf<Pack>::size; k++) { accum[k] += PackOf<Pack>::element(row, k); }
            }
        }
    } else {
        Pack rows[ROWS_IN_FLIGHT];
#pragma unroll
        for (int i = 0; i < ROWS_IN_FLIGHT; i++) {
            if (i < n) { fetch(i, rows[i]); }
        }
#pragma unroll
        for (int k = 0; k < PackOf<Pack>::size; k++) { accum[k] = 0.0f; }
#pragma unroll
        for (int i = 0; i < ROWS_IN_FLIGHT; i++) {
            if (active && i < n) {
#pragma unroll
                for (int k = 0; k < PackOf<Pack>::size; k++) { accum[k] += PackOf<Pack>::element(rows[i], k); }
            }
        }
    }
}
