/*
 * rng.h - reproducible random normal inputs for cprun --seed and the tests.
 *
 * A counter-based generator (Random123's Philox-4x32-10, Salmon et al., SC'11)
 * keyed by (seed, tensor id) and counted by the GLOBAL element index of a
 * BSHD tensor, so the value of element i never depends on who computes it:
 * every world size sees the same tensors, and each rank generates only its
 * shard.  Element i uses counter {i/2 (64 bits), stream, 0}: of the four
 * 32-bit outputs, words 0 and 1 give two uniforms in (0, 1] and Box-Muller
 * (Box & Muller 1958) turns them into two standard normals: element 2j gets
 * the cosine one, element 2j+1 the sine one.
 *
 * Thread-safety: pure functions.
 */
#ifndef CPC_RNG_H
#define CPC_RNG_H

#include <stdint.h>

#include "layout.h"
#include "plan.h"

/* Tensor ids (the `stream` word of the counter). */
enum { CPC_RNG_Q = 0, CPC_RNG_K = 1, CPC_RNG_V = 2, CPC_RNG_MASK = 3 };

/* Standard normal value of global element `index` of tensor `stream`. */
float cpc_rng_normal(uint64_t seed, uint32_t stream, uint64_t index);

/* Fills dst[0..n) with the normals of elements first .. first+n-1, rounded to
 * `dtype` (bf16/fp16 stored as uint16 bit patterns, fp32 as float). */
void cpc_rng_fill(void *dst, cpc_dtype dtype, uint64_t seed, uint32_t stream, uint64_t first,
                  int64_t n);

/* Fills the rows of a token-sliced BSHD tensor: the global tensor is
 * [B, S, H, D]; dst is [B, T, H, D] with T = sum of runs' lengths, holding
 * for each batch the global tokens of `runs` in order.  dtype as above. */
void cpc_rng_fill_runs(void *dst, cpc_dtype dtype, uint64_t seed, uint32_t stream, int B,
                       int64_t S, int64_t H, int64_t D, const cpc_run *runs, int n_runs);

/* The same for a box of the global tensor [*, S, H, D] (the outer axes,
 * placement.h): dst is [nb, T, nh, D] holding batch items [b0, b0 + nb),
 * the tokens of `runs` and heads [h0, h0 + nh); every element is the one
 * the global tensor holds at that index (Philox counter = its global
 * index), whoever makes it.  cpc_rng_fill_runs is the box b0 = 0, nb = B,
 * h0 = 0, nh = H. */
void cpc_rng_fill_box(void *dst, cpc_dtype dtype, uint64_t seed, uint32_t stream, int64_t S,
                      int64_t H, int64_t D, int64_t b0, int64_t nb, int64_t h0, int64_t nh,
                      const cpc_run *runs, int n_runs);

#endif
