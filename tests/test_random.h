/*
 * test_random.h - the random inputs of the backend tests (test_backend_cpu,
 * test_backend_bwd, the backend conformance suite): Random123 Philox keyed by
 * a seed, so every value is a pure function of (seed, stream, index) and a
 * failing case replays from the seed its message prints.
 *
 *   test_seed()                   a fresh seed per call (clock, pid, counter);
 *                                 CPC_TEST_SEED=N makes every call return N
 *   test_normal_at(seed, s, i)    the i-th standard normal of stream s
 *   test_bits_at(seed, s, i)      32 random bits
 *   test_rand_tensor(t, n, ...)   n normals * amp rounded to dtype t
 *                                 (malloc'd; caller frees; aborts on OOM)
 * Header-only (static functions): tests only.
 */
#ifndef CPC_TEST_RANDOM_H
#define CPC_TEST_RANDOM_H

#include <Random123/philox.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "dtype.h"

static inline uint64_t test_seed(void)
{
    static uint64_t counter;
    const char *env = getenv("CPC_TEST_SEED");
    if (env)
        return strtoull(env, NULL, 10);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t base = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 20);
    return base % 1000000007u + 7919u * counter++;
}

static inline double test_normal_at(uint64_t seed, uint32_t stream, uint64_t i)
{
    philox4x32_key_t key = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    philox4x32_ctr_t ctr = {{(uint32_t)(i / 2), (uint32_t)(i / 2 >> 32), stream, 0x5eedu}};
    philox4x32_ctr_t r = philox4x32(ctr, key);
    double u1 = ((double)r.v[0] + 1.0) / 4294967296.0; /* (0, 1] */
    double u2 = ((double)r.v[1] + 0.5) / 4294967296.0;
    double rad = sqrt(-2.0 * log(u1));
    return (i & 1) ? rad * sin(2 * M_PI * u2) : rad * cos(2 * M_PI * u2);
}

static inline uint32_t test_bits_at(uint64_t seed, uint32_t stream, uint64_t i)
{
    philox4x32_key_t key = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    philox4x32_ctr_t ctr = {{(uint32_t)i, (uint32_t)(i >> 32), stream, 0xb175u}};
    return philox4x32(ctr, key).v[0];
}

static inline size_t test_esz(cpc_dtype t) { return t == CPC_DTYPE_FP32 ? 4 : 2; }

static inline void *test_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

static inline void *test_rand_tensor(cpc_dtype t, size_t n, uint64_t seed, uint32_t stream, double amp)
{
    float *f = test_xmalloc(sizeof(float) * n);
    void *out = test_xmalloc(test_esz(t) * n);
    for (size_t i = 0; i < n; i++)
        f[i] = (float)(amp * test_normal_at(seed, stream, i));
    cpc_from_f32_n(out, t, f, n);
    free(f);
    return out;
}

#endif
