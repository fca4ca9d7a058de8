// constants.cuh: the numbers the kernels and the Python side share, each written once.
//
// Every kernel includes this header (through common.cuh). gpt2enc_edu/layout.py reads it when it is imported
// (gpt2enc_edu/sources.py parses it), so the launch shapes, the mirror and the validation use these very values:
// the two sides cannot disagree. Each line is `#define NAME value`, the value an integer or an expression of the
// names above it (+ - * / << >> and parentheses), which the preprocessor and sources.py evaluate alike.
#pragma once

#define WARP_SIZE 32

// The stochastic-rounding noise's second coordinate, one per gradient tensor (common.cuh, round_to_storage).
#define NOISE_STREAM_DWTE 0u
#define NOISE_STREAM_DWPE 1u

// The forward's fast kernel and the fp32 atomic backward's rows kernel: batch rows per thread.
#define FORWARD_ROWS 8
#define ATOMIC_ROWS 8

// The wpe kernel's pipelined form: cp.async copies of dout each thread keeps in flight (its shared-memory slots).
#define WPE_PIPELINE_STAGES 8

// The bucketed wte kernels (encoder_backward_wte_bucketed.cu): threads per block; 8 warps share one bucket.
#define WTE_BLOCK_SIZE 256

// The chunked method: items per chunk, a part of the result's definition (the order of its sums), which the chunk
// kernel, the one-launch kernel and every bucket table route's unit list (a unit is one chunk of one token) follow.
#define CHUNK_ITEMS 32
// The chunk kernel: warps per block, each on its own unit. The combine kernel: threads per block, the 16-byte packs
// of one of its two shared-memory stages, and about the narrowest slice of a token's channels, in columns of 4.
#define CHUNKED_WARPS_PER_BLOCK 8
#define COMBINE_THREADS 128
#define COMBINE_STAGE_PACKS 1536
#define COMBINE_MIN_COLUMNS 8

// The bucket table's counters[] (ints on the device): its size, and where each route leaves the table's sizes.
#define NUM_COUNTERS 8
#define COUNTER_NUM_DISTINCT 0
#define COUNTER_MAX_COUNT 1
#define COUNTER_NUM_CLASSES 2
#define COUNTER_NUM_BUCKETS 3
#define COUNTER_NUM_UNITS 4
// The scatter route's big tokens (seen more than CHUNK_ITEMS times): how many, and their positions and chunks.
#define COUNTER_NUM_BIG 5
#define COUNTER_BIG_ITEMS 6
#define COUNTER_BIG_UNITS 7

// The cooperative route (bucketing.cu): threads per block, and the bits one radix-sort pass sorts by.
#define BUCKETING_THREADS 1024
#define RADIX_BITS 8

// The scatter route (bucketing_scatter.cu): blocks of its per-token and sorting kernels, blocks of its per-position
// kernels, and the most ids it buckets (its bitmap of all positions is static shared memory).
#define SCATTER_THREADS 1024
#define SCATTER_SMALL_BLOCK 256
#define SCATTER_MAX_BT 65536

// The one-block sort of one sequence (block_sort.cuh), which the one-block route (bucketing_small.cu) and the
// one-launch backward (encoder_backward_small.cu) both run: its block, the keys each thread holds, the most ids it
// sorts. A key holds a position in its low SMALL_POS_BITS bits and an id below SMALL_MAX_V above them.
#define SMALL_THREADS 512
#define SMALL_KEYS 2
#define SMALL_MAX_BT (SMALL_THREADS * SMALL_KEYS)
#define SMALL_POS_BITS 10
#define SMALL_POS_MASK ((1u << SMALL_POS_BITS) - 1u)
#define SMALL_MAX_V (1 << (32 - SMALL_POS_BITS))
static_assert(SMALL_MAX_BT == (1 << SMALL_POS_BITS), "a key's low bits hold any position");
// The one-launch backward: its block, and the most ids it takes (its keys are the sort's).
#define SMALL_BACKWARD_THREADS SMALL_THREADS
#define SMALL_BACKWARD_MAX_BT SMALL_MAX_BT
