/*
 * test_safetensors.c - runtime/io/safetensors.h: files written here are read
 * back whole and by token runs (a rank's shard), with dtype conversion; every
 * kind of broken file (truncated, bad header length, header not JSON, bad
 * entries, offsets out of range or not matching the shape, wrong shapes and
 * dtypes against the plan) is a CPC_E_INPUT naming the file and the tensor,
 * never a crash.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "rng.h"
#include "safetensors.h"

static char *tmpname(void)
{
    char *p = strdup("/tmp/cpc_st_XXXXXX");
    int fd = mkstemp(p);
    cr_assert(fd >= 0);
    close(fd);
    return p;
}

/* q [2, 10, 3, 4] bf16 with value = global element index (exact in bf16 up
 * to 256, so use index % 200), k [2, 10, 1, 4] f32, mask [2, 10] U8. */
static char *write_sample(uint16_t *q, float *k, uint8_t *mask)
{
    for (int i = 0; i < 240; i++)
        q[i] = cpc_f32_to_bf16((float)(i % 200) - 50.0f);
    for (int i = 0; i < 80; i++)
        k[i] = (float)i * 0.25f;
    for (int i = 0; i < 20; i++)
        mask[i] = (uint8_t)(i % 3 ? 1 : 0);
    char *path = tmpname();
    cpc_st_out ts[3] = {
        {.name = "q", .dtype = CPC_ST_BF16, .ndim = 4, .shape = {2, 10, 3, 4}, .data = q},
        {.name = "k", .dtype = CPC_ST_F32, .ndim = 4, .shape = {2, 10, 1, 4}, .data = k},
        {.name = "mask", .dtype = CPC_ST_U8, .ndim = 2, .shape = {2, 10}, .data = mask},
    };
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    cpc_status *st = cpc_st_write(path, ts, 3, mk, mv, 1);
    cr_assert_null(st, "%s", st ? st->message : "");
    return path;
}

Test(safetensors, write_then_read_whole_and_sharded)
{
    uint16_t q[240];
    float k[80];
    uint8_t mask[20];
    char *path = write_sample(q, k, mask);
    cpc_st_file *f = NULL;
    cpc_status *st = cpc_st_open(path, &f);
    cr_assert_null(st, "%s", st ? st->message : "");
    cr_assert_eq(f->n, 3);
    const cpc_st_tensor *t;
    int64_t qs[4] = {2, 10, 3, 4};
    cr_assert_null(cpc_st_expect(f, "q", 4, qs, true, &t));
    /* A shard: tokens [1, 3) and [7, 10) of every batch. */
    cpc_run runs[2] = {{1, 2}, {7, 3}};
    uint16_t got[2 * 5 * 12];
    cr_assert_null(cpc_st_read_runs(f, t, runs, 2, CPC_DTYPE_BF16, got));
    for (int b = 0; b < 2; b++) {
        int tok = 0;
        for (int r = 0; r < 2; r++)
            for (int s = (int)runs[r].start; s < runs[r].start + runs[r].len; s++, tok++)
                for (int e = 0; e < 12; e++)
                    cr_assert_eq(got[(b * 5 + tok) * 12 + e], q[(b * 10 + s) * 12 + e],
                                 "b %d token %d elem %d", b, s, e);
    }
    /* Converted: the bf16 tensor read as fp32, the fp32 tensor read as fp16. */
    float qf[240];
    cpc_run all = {0, 10};
    cr_assert_null(cpc_st_read_runs(f, t, &all, 1, CPC_DTYPE_FP32, qf));
    for (int i = 0; i < 240; i++)
        cr_assert_eq(qf[i], cpc_bf16_to_f32(q[i]));
    const cpc_st_tensor *tk = cpc_st_find(f, "k");
    cr_assert_not_null(tk);
    uint16_t kh[80];
    cr_assert_null(cpc_st_read_runs(f, tk, &all, 1, CPC_DTYPE_FP16, kh));
    for (int i = 0; i < 80; i++)
        cr_assert_eq(cpc_fp16_to_f32(kh[i]), k[i]);
    int64_t ms[2] = {2, 10};
    cr_assert_null(cpc_st_expect(f, "mask", 2, ms, false, &t));
    uint8_t m2[20];
    cr_assert_null(cpc_st_read_mask(f, t, m2));
    cr_assert_eq(memcmp(m2, mask, 20), 0);
    /* A run outside the tensor is refused. */
    cpc_run bad = {8, 5};
    st = cpc_st_read_runs(f, tk, &bad, 1, CPC_DTYPE_FP32, qf);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INPUT);
    cpc_status_free(st);
    cpc_st_close(f);
    unlink(path);
    free(path);
}

Test(safetensors, shape_and_dtype_checks_name_the_tensor)
{
    uint16_t q[240];
    float k[80];
    uint8_t mask[20];
    char *path = write_sample(q, k, mask);
    cpc_st_file *f = NULL;
    cr_assert_null(cpc_st_open(path, &f));
    const cpc_st_tensor *t;
    int64_t wrong[4] = {2, 11, 3, 4};
    cpc_status *st = cpc_st_expect(f, "q", 4, wrong, true, &t);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INPUT);
    cr_assert(strstr(st->message, "'q'") && strstr(st->message, "[2, 10, 3, 4]") &&
                  strstr(st->message, "[2, 11, 3, 4]"),
              "%s", st->message);
    cpc_status_free(st);
    st = cpc_st_expect(f, "v", 4, wrong, true, &t);
    cr_assert_not_null(st);
    cr_assert(strstr(st->message, "'v'") && strstr(st->message, "missing"), "%s", st->message);
    cpc_status_free(st);
    int64_t ms[2] = {2, 10};
    st = cpc_st_expect(f, "mask", 2, ms, true, &t);
    cr_assert_not_null(st, "a U8 tensor accepted as q/k/v");
    cpc_status_free(st);
    cpc_st_close(f);
    unlink(path);
    free(path);
}

/* Writes raw bytes: 8-byte length `hlen`, the header text, then `data` bytes
 * of zeros. */
static char *write_raw(uint64_t hlen, const char *hdr, size_t data)
{
    char *path = tmpname();
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp);
    for (int i = 0; i < 8; i++)
        fputc((int)((hlen >> (8 * i)) & 0xff), fp);
    fwrite(hdr, 1, strlen(hdr), fp);
    for (size_t i = 0; i < data; i++)
        fputc(0, fp);
    fclose(fp);
    return path;
}

static void expect_bad(const char *path, const char *needle)
{
    cpc_st_file *f = NULL;
    cpc_status *st = cpc_st_open(path, &f);
    cr_assert_not_null(st, "accepted a broken file (%s)", needle);
    cr_assert_null(f);
    cr_assert_eq(st->code, CPC_E_INPUT, "%s: %s", needle, st->message);
    cr_assert(strstr(st->message, path) != NULL, "message does not name the file: %s", st->message);
    cr_assert(strstr(st->message, needle) != NULL, "expected '%s' in: %s", needle, st->message);
    cpc_status_free(st);
}

Test(safetensors, broken_files_are_input_errors)
{
    struct {
        const char *hdr;
        size_t data;
        const char *needle;
    } cases[] = {
        {"not json at all", 0, "not a JSON object"},
        {"[1, 2, 3]", 0, "not a JSON object"},
        {"{\"q\": 5}", 0, "'q'"},
        {"{\"q\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", 8, "dtype"},
        {"{\"q\": {\"dtype\": \"F32\", \"data_offsets\": [0, 8]}}", 8, "shape"},
        {"{\"q\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8, "data_offsets"},
        {"{\"q\": {\"dtype\": \"Q4\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, "unknown dtype"},
        {"{\"q\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8, "shape"},
        {"{\"q\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}}", 8, "shape"},
        {"{\"q\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 16]}}", 16, "needs 8"},
        {"{\"q\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8, "truncated"},
        {"{\"q\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8, "begin > end"},
        {"{\"q\": {\"dtype\": \"F32\", \"shape\": [1099511627776, 1099511627776, 1099511627776], \"data_offsets\": [0, 8]}}",
         8, "shape [1099511627776, 1099511627776, 1099511627776] is too large: its element count overflows"},
        /* dimensions of 2^62: too large, not "must be non-negative integers" */
        {"{\"q\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4611686018427387904, 1, 1], \"data_offsets\": [0, 8]}}",
         8, "shape [4611686018427387904, 4611686018427387904, 1, 1] is too large: a dimension is >= 2^53"},
        /* the element count fits, the byte size does not */
        {"{\"q\": {\"dtype\": \"F32\", \"shape\": [5000000000000000, 1000], \"data_offsets\": [0, 8]}}",
         8, "is too large: its byte size overflows"},
        {"{\"q\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 36893488147419103232]}}", 8,
         "\"data_offsets\" too large"},
        {"{\"__metadata__\": 3}", 0, "__metadata__"},
        /* issue 14: a NUL in a string would end cJSON's C string there: "q\u0000x"
         * read as "q", a dtype "F32\u0000junk" as "F32", in a metadata key too */
        {"{\"q\\u0000x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
         "\"q\\u0000x\" (header byte 3) holds a NUL character"},
        {"{\"q\": {\"dtype\": \"F32\\u0000junk\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
         "holds a NUL character"},
        {"{\"__metadata__\": {\"a\\u0000\": \"b\"}, \"q\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
         8, "holds a NUL character"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *p = write_raw(strlen(cases[i].hdr), cases[i].hdr, cases[i].data);
        expect_bad(p, cases[i].needle);
        unlink(p);
        free(p);
    }
    /* Header length larger than the file, and a file shorter than 8 bytes. */
    char *p = write_raw(1000, "{}", 0);
    expect_bad(p, "header length");
    unlink(p);
    free(p);
    p = tmpname();
    FILE *fp = fopen(p, "wb");
    fputs("abc", fp);
    fclose(fp);
    expect_bad(p, "shorter than");
    unlink(p);
    free(p);
    /* an escaped backslash before "u0000" is no NUL: accepted */
    p = write_raw(strlen("{\"q\\\\u0000\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}"),
                  "{\"q\\\\u0000\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
    cpc_st_file *ok = NULL;
    cpc_status *ost = cpc_st_open(p, &ok);
    cr_assert_null(ost, "%s", ost ? ost->message : "");
    cr_assert_not_null(cpc_st_find(ok, "q\\u0000"));
    cr_assert_null(cpc_st_find(ok, "q"));
    cpc_st_close(ok);
    unlink(p);
    free(p);
    /* a FIFO as the input: refused at once, never a hang in open() */
    p = tmpname();
    unlink(p);
    cr_assert_eq(mkfifo(p, 0600), 0);
    ost = cpc_st_open(p, &ok);
    cr_assert_not_null(ost);
    cr_assert(strstr(ost->message, "is a FIFO") != NULL, "%s", ost->message);
    cpc_status_free(ost);
    unlink(p);
    free(p);
    /* A missing file is an I/O error. */
    cpc_st_file *f = NULL;
    cpc_status *st = cpc_st_open("/nonexistent/x.safetensors", &f);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_IO);
    cpc_status_free(st);
}

Test(safetensors, truncated_real_file)
{
    uint16_t q[240];
    float k[80];
    uint8_t mask[20];
    char *path = write_sample(q, k, mask);
    FILE *fp = fopen(path, "rb");
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fclose(fp);
    /* Every truncation point fails cleanly. */
    for (long cut = 0; cut < n; cut += 7) {
        cr_assert_eq(truncate(path, cut), 0);
        cpc_st_file *f = NULL;
        cpc_status *st = cpc_st_open(path, &f);
        cr_assert_not_null(st, "truncated to %ld of %ld bytes accepted", cut, n);
        cr_assert_eq(st->code, CPC_E_INPUT, "%s", st->message);
        cpc_status_free(st);
        /* restore */
        char *p2 = write_sample(q, k, mask);
        cr_assert_eq(rename(p2, path), 0);
        free(p2);
    }
    unlink(path);
    free(path);
}

Test(safetensors, rng_shards_are_slices_of_the_global_tensor)
{
    /* The generator is keyed by global element index: a shard made alone
     * equals the same rows of the whole tensor, for every dtype. */
    cpc_dtype dts[3] = {CPC_DTYPE_FP32, CPC_DTYPE_BF16, CPC_DTYPE_FP16};
    for (int d = 0; d < 3; d++) {
        int es = cpc_dtype_size(dts[d]);
        int B = 2, S = 13, H = 3, D = 5;
        char *whole = malloc((size_t)(B * S * H * D * es));
        cpc_run all = {0, S};
        cpc_rng_fill_runs(whole, dts[d], 42, CPC_RNG_K, B, S, H, D, &all, 1);
        cpc_run runs[2] = {{3, 4}, {10, 3}};
        char *shard = malloc((size_t)(B * 7 * H * D * es));
        cpc_rng_fill_runs(shard, dts[d], 42, CPC_RNG_K, B, S, H, D, runs, 2);
        for (int b = 0; b < B; b++) {
            cr_assert_eq(memcmp(shard + (size_t)((b * 7 + 0) * H * D * es),
                                whole + (size_t)((b * S + 3) * H * D * es), (size_t)(4 * H * D * es)), 0);
            cr_assert_eq(memcmp(shard + (size_t)((b * 7 + 4) * H * D * es),
                                whole + (size_t)((b * S + 10) * H * D * es), (size_t)(3 * H * D * es)), 0);
        }
        free(whole);
        free(shard);
    }
    /* Roughly standard normal, and streams/seeds differ. */
    double s1 = 0, s2 = 0;
    int n = 20000;
    for (int i = 0; i < n; i++) {
        double x = cpc_rng_normal(7, CPC_RNG_Q, (uint64_t)i);
        s1 += x;
        s2 += x * x;
    }
    cr_assert(fabs(s1 / n) < 0.05, "mean %f", s1 / n);
    cr_assert(fabs(s2 / n - 1.0) < 0.05, "variance %f", s2 / n);
    cr_assert_neq(cpc_rng_normal(7, CPC_RNG_Q, 5), cpc_rng_normal(7, CPC_RNG_K, 5));
    cr_assert_neq(cpc_rng_normal(7, CPC_RNG_Q, 5), cpc_rng_normal(8, CPC_RNG_Q, 5));
}

/* The outer axes (runtime/session/placement.h): a rank's box of batch items,
 * token runs and heads, made by the generator or read from a file, is the
 * same elements of the whole tensor (same bits, converted or not); a box
 * outside the tensor is refused. */
Test(safetensors, boxes_are_slices_of_the_global_tensor)
{
    int B = 4, S = 11, H = 6, D = 3;
    cpc_run all = {0, S}, runs[2] = {{2, 3}, {8, 2}};
    int64_t b0 = 1, nb = 2, h0 = 2, nh = 3, T = 5;
    cpc_dtype dts[3] = {CPC_DTYPE_FP32, CPC_DTYPE_BF16, CPC_DTYPE_FP16};
    for (int d = 0; d < 3; d++) {
        int es = cpc_dtype_size(dts[d]);
        char *whole = malloc((size_t)(B * S * H * D * es));
        char *box = malloc((size_t)(nb * T * nh * D * es));
        cpc_rng_fill_runs(whole, dts[d], 9, CPC_RNG_V, B, S, H, D, &all, 1);
        cpc_rng_fill_box(box, dts[d], 9, CPC_RNG_V, S, H, D, b0, nb, h0, nh, runs, 2);
        for (int64_t b = 0; b < nb; b++) {
            int64_t t = 0;
            for (int r = 0; r < 2; r++)
                for (int64_t s = runs[r].start; s < runs[r].start + runs[r].len; s++, t++)
                    cr_assert_eq(memcmp(box + ((b * T + t) * nh * D) * es,
                                        whole + (((b0 + b) * S + s) * H * D + h0 * D) * es, (size_t)(nh * D * es)),
                                 0, "dtype %d batch %lld token %lld", d, (long long)b, (long long)s);
        }
        free(whole);
        free(box);
    }
    /* the same box read from a file (fp32 on disk, read as fp32 and as bf16) */
    float *whole = malloc((size_t)(B * S * H * D) * sizeof(float));
    cpc_rng_fill_runs(whole, CPC_DTYPE_FP32, 9, CPC_RNG_Q, B, S, H, D, &all, 1);
    char *path = tmpname();
    cpc_st_out o = {.name = "q", .dtype = CPC_ST_F32, .ndim = 4, .shape = {B, S, H, D}, .data = whole};
    cpc_status *st = cpc_st_write(path, &o, 1, NULL, NULL, 0);
    cr_assert_null(st, "%s", st ? st->message : "");
    cpc_st_file *f = NULL;
    cr_assert_null(cpc_st_open(path, &f));
    const cpc_st_tensor *t = cpc_st_find(f, "q");
    cr_assert_not_null(t);
    float got[2 * 5 * 3 * 3];
    uint16_t gotb[2 * 5 * 3 * 3], want_b[2 * 5 * 3 * 3];
    cr_assert_null(cpc_st_read_box(f, t, b0, nb, h0 * D, nh * D, runs, 2, CPC_DTYPE_FP32, got));
    cr_assert_null(cpc_st_read_box(f, t, b0, nb, h0 * D, nh * D, runs, 2, CPC_DTYPE_BF16, gotb));
    float want[2 * 5 * 3 * 3];
    cpc_rng_fill_box(want, CPC_DTYPE_FP32, 9, CPC_RNG_Q, S, H, D, b0, nb, h0, nh, runs, 2);
    cpc_rng_fill_box(want_b, CPC_DTYPE_BF16, 9, CPC_RNG_Q, S, H, D, b0, nb, h0, nh, runs, 2);
    cr_assert_eq(memcmp(got, want, sizeof got), 0);
    cr_assert_eq(memcmp(gotb, want_b, sizeof gotb), 0);
    st = cpc_st_read_box(f, t, 3, 2, 0, H * D, runs, 2, CPC_DTYPE_FP32, got);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INPUT);
    cr_assert(strstr(st->message, "batch [3, 5)"), "%s", st->message);
    cpc_status_free(st);
    st = cpc_st_read_box(f, t, 0, 1, 5 * D, 2 * D, runs, 2, CPC_DTYPE_FP32, got);
    cr_assert_not_null(st);
    cpc_status_free(st);
    cpc_st_close(f);
    unlink(path);
    free(path);
    free(whole);
}
