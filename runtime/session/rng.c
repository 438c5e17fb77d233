/* rng.c - see rng.h */
#include "rng.h"

#include <math.h>
#include <string.h>

#include <Random123/philox.h>

#include "backend.h"

#define CPC_TWO_PI 6.283185307179586476925286766559

/* (0, 1]: 32 random bits, +1, scaled by 2^-32 (never 0, so log is finite). */
static double u01(uint32_t x)
{
    return ((double)x + 1.0) * (1.0 / 4294967296.0);
}

static void pair(uint64_t seed, uint32_t stream, uint64_t j, float *z0, float *z1)
{
    philox4x32_ctr_t c = {{(uint32_t)j, (uint32_t)(j >> 32), stream, 0}};
    philox4x32_key_t k = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    philox4x32_ctr_t r = philox4x32(c, k);
    double rad = sqrt(-2.0 * log(u01(r.v[0])));
    double th = CPC_TWO_PI * u01(r.v[1]);
    *z0 = (float)(rad * cos(th));
    *z1 = (float)(rad * sin(th));
}

float cpc_rng_normal(uint64_t seed, uint32_t stream, uint64_t index)
{
    float a, b;
    pair(seed, stream, index >> 1, &a, &b);
    return (index & 1) ? b : a;
}

static void store(void *dst, cpc_dtype dtype, int64_t i, float x)
{
    switch (dtype) {
    case CPC_DTYPE_FP32: ((float *)dst)[i] = x; break;
    case CPC_DTYPE_BF16: ((uint16_t *)dst)[i] = cpc_f32_to_bf16(x); break;
    default: ((uint16_t *)dst)[i] = cpc_f32_to_fp16(x); break;
    }
}

void cpc_rng_fill(void *dst, cpc_dtype dtype, uint64_t seed, uint32_t stream, uint64_t first,
                  int64_t n)
{
    int64_t i = 0;
    if (n <= 0)
        return;
    if (first & 1) {
        store(dst, dtype, 0, cpc_rng_normal(seed, stream, first));
        i = 1;
    }
    for (; i + 1 < n; i += 2) {
        float a, b;
        pair(seed, stream, (first + (uint64_t)i) >> 1, &a, &b);
        store(dst, dtype, i, a);
        store(dst, dtype, i + 1, b);
    }
    if (i < n)
        store(dst, dtype, i, cpc_rng_normal(seed, stream, first + (uint64_t)i));
}

void cpc_rng_fill_box(void *dst, cpc_dtype dtype, uint64_t seed, uint32_t stream, int64_t S,
                      int64_t H, int64_t D, int64_t b0, int64_t nb, int64_t h0, int64_t nh,
                      const cpc_run *runs, int n_runs)
{
    int64_t row = H * D, srow = nh * D;
    int esize = cpc_dtype_size(dtype);
    int64_t T = 0;
    for (int i = 0; i < n_runs; i++)
        T += runs[i].len;
    for (int64_t b = 0; b < nb; b++) {
        int64_t t = 0;
        for (int i = 0; i < n_runs; i++) {
            char *d = (char *)dst + ((b * T + t) * srow) * esize;
            uint64_t first = (uint64_t)(((b0 + b) * S + runs[i].start) * row + h0 * D);
            if (srow == row) { /* whole rows: one stretch per run */
                cpc_rng_fill(d, dtype, seed, stream, first, runs[i].len * row);
            } else {
                for (int64_t k = 0; k < runs[i].len; k++)
                    cpc_rng_fill(d + k * srow * esize, dtype, seed, stream, first + (uint64_t)(k * row), srow);
            }
            t += runs[i].len;
        }
    }
}

void cpc_rng_fill_runs(void *dst, cpc_dtype dtype, uint64_t seed, uint32_t stream, int B,
                       int64_t S, int64_t H, int64_t D, const cpc_run *runs, int n_runs)
{
    cpc_rng_fill_box(dst, dtype, seed, stream, S, H, D, 0, B, 0, H, runs, n_runs);
}
