/* safetensors.c - see safetensors.h */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dtype.h"
#include "fileio.h"

static const struct {
    const char *name;
    int esize;
    cpc_st_dtype dt;
} dtypes[] = {
    {"F32", 4, CPC_ST_F32},     {"F16", 2, CPC_ST_F16},     {"BF16", 2, CPC_ST_BF16},
    {"U8", 1, CPC_ST_U8},       {"BOOL", 1, CPC_ST_BOOL},   {"I8", 1, CPC_ST_OTHER},
    {"F8_E5M2", 1, CPC_ST_OTHER}, {"F8_E4M3", 1, CPC_ST_OTHER}, {"I16", 2, CPC_ST_OTHER},
    {"U16", 2, CPC_ST_OTHER},   {"I32", 4, CPC_ST_OTHER},   {"U32", 4, CPC_ST_OTHER},
    {"F64", 8, CPC_ST_OTHER},   {"I64", 8, CPC_ST_OTHER},   {"U64", 8, CPC_ST_OTHER},
};

static const char *st_name(cpc_st_dtype d)
{
    switch (d) {
    case CPC_ST_F32: return "F32";
    case CPC_ST_F16: return "F16";
    case CPC_ST_BF16: return "BF16";
    case CPC_ST_U8: return "U8";
    case CPC_ST_BOOL: return "BOOL";
    default: return "?";
    }
}

static int st_esize(cpc_st_dtype d)
{
    switch (d) {
    case CPC_ST_F32: return 4;
    case CPC_ST_F16:
    case CPC_ST_BF16: return 2;
    case CPC_ST_U8:
    case CPC_ST_BOOL: return 1;
    default: return 0;
    }
}

cpc_st_dtype cpc_st_from_dtype(cpc_dtype d)
{
    switch (d) {
    case CPC_DTYPE_FP32: return CPC_ST_F32;
    case CPC_DTYPE_FP16: return CPC_ST_F16;
    default: return CPC_ST_BF16;
    }
}

void cpc_st_close(cpc_st_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    for (int i = 0; i < f->n; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    free(f);
}

/* Reads exactly n bytes at off; CPC_E_INPUT when the file ends first. */
static cpc_status *pread_all(const cpc_st_file *f, void *dst, size_t n, uint64_t off,
                             const char *what)
{
    char *d = dst;
    while (n > 0) {
        ssize_t r = pread(f->fd, d, n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return cpc_error(CPC_E_IO, "%s: reading %s: %s", f->path, what, strerror(errno));
        }
        if (r == 0)
            return cpc_error(CPC_E_INPUT, "%s: %s: file truncated", f->path, what);
        d += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return NULL;
}

/* A JSON number that is an exact non-negative integer below 2^53. */
static bool json_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double v = j->valuedouble;
    if (!(v >= 0) || v > 9007199254740992.0 || v != floor(v))
        return false;
    *out = (uint64_t)v;
    return true;
}

/* A non-negative integer too large for json_uint (>= 2^53, where doubles
 * are no longer exact): told apart so that the message says "too large". */
static bool json_huge_uint(const cJSON *j)
{
    return cJSON_IsNumber(j) && j->valuedouble > 9007199254740992.0 && j->valuedouble == floor(j->valuedouble);
}

/* "[2, 4608, 24, 128]" (at most ~200 characters). */
static void shape_text(const cJSON *sh, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = 0;
    int nd = cJSON_GetArraySize(sh);
    for (int i = 0; i < nd && used + 32 < n; i++) {
        const cJSON *d = cJSON_GetArrayItem(sh, i);
        int w = cJSON_IsNumber(d) ? snprintf(buf + used, n - used, "%s%.0f", i ? ", " : "[", d->valuedouble)
                                  : snprintf(buf + used, n - used, "%s?", i ? ", " : "[");
        if (w < 0)
            return;
        used += (size_t)w;
    }
    snprintf(buf + used, n - used, "%s]", nd ? "" : "[");
}

static cpc_status *bad(const cpc_st_file *f, const char *tensor, const char *fmt, const char *a)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, a ? a : "");
    if (tensor)
        return cpc_error(CPC_E_INPUT, "%s: bad safetensors header: tensor '%s': %s", f->path,
                         tensor, msg);
    return cpc_error(CPC_E_INPUT, "%s: bad safetensors header: %s", f->path, msg);
}

static cpc_status *parse_entry(cpc_st_file *f, const cJSON *e, uint64_t data_start,
                               cpc_st_tensor *t)
{
    const char *nm = e->string;
    if (!cJSON_IsObject(e))
        return bad(f, nm, "entry is not an object", NULL);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return bad(f, nm, "missing or non-string \"dtype\"", NULL);
    if (!cJSON_IsArray(sh))
        return bad(f, nm, "missing or non-array \"shape\"", NULL);
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return bad(f, nm, "\"data_offsets\" must be an array of two integers", NULL);
    int found = -1;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dt->valuestring, dtypes[i].name) == 0)
            found = (int)i;
    if (found < 0)
        return bad(f, nm, "unknown dtype \"%s\"", dt->valuestring);
    t->dtype = dtypes[found].dt;
    t->esize = dtypes[found].esize;
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dtypes[found].name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > CPC_ST_MAX_DIMS)
        return bad(f, nm, "more than 8 dimensions", NULL);
    t->ndim = nd;
    uint64_t numel = 1;
    bool overflow = false, huge = false;
    for (int i = 0; i < nd; i++) {
        uint64_t v;
        const cJSON *d = cJSON_GetArrayItem(sh, i);
        if (json_huge_uint(d)) {
            huge = true; /* reported with the whole shape below */
            continue;
        }
        if (!json_uint(d, &v))
            return bad(f, nm, "shape entries must be non-negative integers", NULL);
        t->shape[i] = (int64_t)v;
        if (v && numel > UINT64_MAX / v)
            overflow = true;
        numel *= v;
    }
    /* a zero dimension makes the tensor empty, whatever the others say */
    bool empty = false;
    for (int i = 0; i < nd; i++) {
        const cJSON *d = cJSON_GetArrayItem(sh, i);
        empty = empty || (cJSON_IsNumber(d) && d->valuedouble == 0);
    }
    if (huge || (!empty && (overflow || numel > UINT64_MAX / (uint64_t)t->esize))) {
        char st[224], msg[320];
        shape_text(sh, st, sizeof st);
        if (huge)
            snprintf(msg, sizeof msg, "shape %s is too large: a dimension is >= 2^53 elements", st);
        else
            snprintf(msg, sizeof msg, "shape %s is too large: its %s overflows 64 bits", st,
                     overflow ? "element count" : "byte size");
        return bad(f, nm, "%s", msg);
    }
    if (empty)
        numel = 0;
    uint64_t b, en;
    if (json_huge_uint(cJSON_GetArrayItem(off, 0)) || json_huge_uint(cJSON_GetArrayItem(off, 1)))
        return bad(f, nm, "\"data_offsets\" too large (>= 2^53 bytes)", NULL);
    if (!json_uint(cJSON_GetArrayItem(off, 0), &b) || !json_uint(cJSON_GetArrayItem(off, 1), &en))
        return bad(f, nm, "\"data_offsets\" must be non-negative integers", NULL);
    if (b > en)
        return bad(f, nm, "data_offsets begin > end", NULL);
    uint64_t data_size = f->file_size - data_start;
    if (en > data_size) {
        char msg[160];
        snprintf(msg, sizeof msg, "data_offsets [%llu, %llu) outside the %llu data bytes (file truncated?)",
                 (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_size);
        return bad(f, nm, "%s", msg);
    }
    if (en - b != numel * (uint64_t)t->esize) {
        char msg[160];
        snprintf(msg, sizeof msg, "data_offsets span %llu bytes, shape x %s needs %llu",
                 (unsigned long long)(en - b), t->dtype_name,
                 (unsigned long long)(numel * (uint64_t)t->esize));
        return bad(f, nm, "%s", msg);
    }
    t->offset = data_start + b;
    t->nbytes = en - b;
    t->name = strdup(nm);
    if (!t->name)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    return NULL;
}

/* A NUL character in the header's text: a raw 0 byte, or a \u0000 escape
 * inside a JSON string.  cJSON would end the C string there, so tensor
 * "q\u0000x" would be read as "q" (and dtype "F32\u0000junk" as "F32").
 * Returns the byte offset in the header, or -1. */
static int64_t header_nul(const char *h, uint64_t n)
{
    bool in_str = false;
    for (uint64_t i = 0; i < n; i++) {
        char c = h[i];
        if (c == 0)
            return (int64_t)i;
        if (!in_str) {
            in_str = c == '"';
            continue;
        }
        if (c == '"') {
            in_str = false;
        } else if (c == '\\' && i + 1 < n) {
            if (h[i + 1] == 'u' && i + 5 < n && strncmp(h + i + 2, "0000", 4) == 0)
                return (int64_t)i;
            i++; /* the escaped character (\" does not end the string) */
        }
    }
    return -1;
}

cpc_status *cpc_st_open(const char *path, cpc_st_file **out)
{
    *out = NULL;
    cpc_st_file *f = calloc(1, sizeof *f);
    if (!f)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) {
        free(f);
        return cpc_error(CPC_E_NOMEM, "out of memory");
    }
    cpc_status *st = NULL;
    char *hdr = NULL;
    cJSON *root = NULL;
    /* fileio.h: regular files only, and a FIFO does not block open() */
    f->fd = cpc_open_read(path, "--input", false, &st);
    if (f->fd < 0)
        goto done;
    struct stat sb;
    if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = cpc_error(CPC_E_IO, "%s: not a regular file", path);
        goto done;
    }
    f->file_size = (uint64_t)sb.st_size;
    if (f->file_size < 8) {
        st = cpc_error(CPC_E_INPUT, "%s: not a safetensors file: %llu bytes, shorter than the 8-byte header length",
                       path, (unsigned long long)f->file_size);
        goto done;
    }
    uint8_t lenb[8];
    if ((st = pread_all(f, lenb, 8, 0, "header length")))
        goto done;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | lenb[i];
    if (n < 2 || n > CPC_ST_MAX_HEADER || n > f->file_size - 8) {
        st = cpc_error(CPC_E_INPUT, "%s: bad safetensors header: header length %llu does not fit the file (%llu bytes, limit %u)",
                       path, (unsigned long long)n, (unsigned long long)f->file_size,
                       CPC_ST_MAX_HEADER);
        goto done;
    }
    hdr = malloc(n + 1);
    if (!hdr) {
        st = cpc_error(CPC_E_NOMEM, "out of memory");
        goto done;
    }
    if ((st = pread_all(f, hdr, n, 8, "header")))
        goto done;
    hdr[n] = 0;
    int64_t nul = header_nul(hdr, n);
    if (nul >= 0) {
        /* the string that holds it, for the message (printable bytes only) */
        int64_t a = nul;
        while (a > 0 && hdr[a - 1] != '"')
            a--;
        char shown[96];
        size_t k = 0;
        for (int64_t i = a; i < (int64_t)n && hdr[i] != '"' && k + 1 < sizeof shown; i++)
            shown[k++] = hdr[i] >= 32 && hdr[i] < 127 ? hdr[i] : '?';
        shown[k] = 0;
        st = cpc_error(CPC_E_INPUT,
                       "%s: bad safetensors header: the string \"%s\" (header byte %lld) holds a NUL character; tensor names, dtypes and metadata cannot contain one",
                       path, shown, (long long)nul);
        goto done;
    }
    root = cJSON_ParseWithLength(hdr, n);
    if (!root || !cJSON_IsObject(root)) {
        st = bad(f, NULL, "header is not a JSON object", NULL);
        goto done;
    }
    int cnt = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) cnt++;
    f->tensors = calloc((size_t)(cnt ? cnt : 1), sizeof *f->tensors);
    if (!f->tensors) {
        st = cpc_error(CPC_E_NOMEM, "out of memory");
        goto done;
    }
    cJSON_ArrayForEach(e, root)
    {
        if (!e->string) {
            st = bad(f, NULL, "entry without a name", NULL);
            goto done;
        }
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) {
                st = bad(f, NULL, "__metadata__ is not an object", NULL);
                goto done;
            }
            continue;
        }
        for (int i = 0; i < f->n; i++)
            if (strcmp(f->tensors[i].name, e->string) == 0) {
                st = bad(f, e->string, "duplicate tensor name", NULL);
                goto done;
            }
        if ((st = parse_entry(f, e, 8 + n, &f->tensors[f->n])))
            goto done;
        f->n++;
    }
done:
    cJSON_Delete(root);
    free(hdr);
    if (st) {
        cpc_st_close(f);
        return st;
    }
    *out = f;
    return NULL;
}

const cpc_st_tensor *cpc_st_find(const cpc_st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

cpc_status *cpc_st_expect(const cpc_st_file *f, const char *name, int ndim, const int64_t *shape,
                          bool want_float, const cpc_st_tensor **out)
{
    *out = NULL;
    const cpc_st_tensor *t = cpc_st_find(f, name);
    if (!t)
        return cpc_error(CPC_E_INPUT, "%s: tensor '%s' is missing", f->path, name);
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char a[160], b[160];
        shape_str(a, sizeof a, t->ndim, t->shape);
        shape_str(b, sizeof b, ndim, shape);
        return cpc_error(CPC_E_INPUT, "%s: tensor '%s' has shape %s, the plan needs %s", f->path,
                         name, a, b);
    }
    bool is_float = t->dtype == CPC_ST_F32 || t->dtype == CPC_ST_F16 || t->dtype == CPC_ST_BF16;
    bool is_mask = t->dtype == CPC_ST_U8 || t->dtype == CPC_ST_BOOL;
    if (want_float && !is_float)
        return cpc_error(CPC_E_INPUT, "%s: tensor '%s' has dtype %s; F32, F16 or BF16 expected",
                         f->path, name, t->dtype_name);
    if (!want_float && !is_mask)
        return cpc_error(CPC_E_INPUT, "%s: tensor '%s' has dtype %s; U8 or BOOL expected", f->path,
                         name, t->dtype_name);
    *out = t;
    return NULL;
}

static float load_f(cpc_st_dtype d, const void *src, int64_t i)
{
    const uint8_t *p = (const uint8_t *)src + i * (int64_t)st_esize(d);
    if (d == CPC_ST_F32) {
        float x;
        memcpy(&x, p, 4);
        return x;
    }
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    return d == CPC_ST_BF16 ? cpc_bf16_to_f32(h) : cpc_fp16_to_f32(h);
}

/* Stores x in dtype d; false when a finite x rounds to Inf there (1e38 in
 * fp16, 3.4e38 in bf16): the input error of SPEC section 5. */
static bool store_f(cpc_dtype d, void *dst, int64_t i, float x)
{
    uint16_t h;
    if (d == CPC_DTYPE_FP32) {
        ((float *)dst)[i] = x;
        return true;
    } else if (d == CPC_DTYPE_BF16) {
        h = cpc_f32_to_bf16(x);
        ((uint16_t *)dst)[i] = h;
        return !isfinite(x) || (h & 0x7fffu) != 0x7f80u;
    }
    h = cpc_f32_to_fp16(x);
    ((uint16_t *)dst)[i] = h;
    return !isfinite(x) || (h & 0x7fffu) != 0x7c00u;
}

/* "tensor 'v' element [0, 5, 2, 7] = 1e+38 rounds to Inf in fp16", or for
 * an element that is Inf in the file "tensor 'v' element [...] is Inf" (both
 * CPC_E_INPUT, exit status 2: SPEC section 5). */
static cpc_status *overflow_error(const cpc_st_file *f, const cpc_st_tensor *t, int64_t flat,
                                  float x, cpc_dtype dtype)
{
    char idx[160];
    size_t k = 0;
    int64_t rest = flat, pos[CPC_ST_MAX_DIMS] = {0};
    for (int i = t->ndim - 1; i >= 0; i--) {
        int64_t e = t->shape[i] > 0 ? t->shape[i] : 1;
        pos[i] = rest % e;
        rest /= e;
    }
    idx[0] = 0;
    for (int i = 0; i < t->ndim && k + 24 < sizeof idx; i++)
        k += (size_t)snprintf(idx + k, sizeof idx - k, "%s%lld", i ? ", " : "", (long long)pos[i]);
    if (isinf(x)) /* already Inf in the file: no rounding to blame */
        return cpc_error(CPC_E_INPUT, "%s: tensor '%s' element [%s] is %s: inputs must be finite",
                         f->path, t->name, idx, x > 0 ? "Inf" : "-Inf");
    cpc_status *st = cpc_error(CPC_E_INPUT,
                               "%s: tensor '%s' element [%s] = %g rounds to Inf in the plan's dtype %s (largest finite value %g)",
                               f->path, t->name, idx, (double)x, cpc_dtype_name(dtype),
                               dtype == CPC_DTYPE_FP16 ? 65504.0 : 3.3895313892515355e38);
    cpc_status_set_hint(st, "scale the inputs into the dtype's range, or run the plan in fp32 (--set model.dtype=fp32)");
    return st;
}

cpc_status *cpc_st_read_box(const cpc_st_file *f, const cpc_st_tensor *t, int64_t b0, int64_t nb,
                            int64_t col0, int64_t ncol, const cpc_run *runs, int n_runs,
                            cpc_dtype dtype, void *dst)
{
    if (t->dtype != CPC_ST_F32 && t->dtype != CPC_ST_F16 && t->dtype != CPC_ST_BF16)
        return cpc_error(CPC_E_INPUT, "%s: tensor '%s': dtype %s is not a float type", f->path,
                         t->name, t->dtype_name);
    if (t->ndim < 2)
        return cpc_error(CPC_E_INPUT, "%s: tensor '%s' needs at least 2 dimensions", f->path,
                         t->name);
    int64_t B = t->shape[0], S = t->shape[1], row = 1;
    for (int i = 2; i < t->ndim; i++)
        row *= t->shape[i];
    if (b0 < 0 || nb < 0 || b0 + nb > B || col0 < 0 || ncol < 0 || col0 + ncol > row)
        return cpc_error(CPC_E_INPUT, "%s: tensor '%s': batch [%lld, %lld), row elements [%lld, %lld) outside "
                         "[0, %lld) x [0, %lld)", f->path, t->name, (long long)b0, (long long)(b0 + nb),
                         (long long)col0, (long long)(col0 + ncol), (long long)B, (long long)row);
    int64_t T = 0;
    for (int i = 0; i < n_runs; i++) {
        if (runs[i].start < 0 || runs[i].len < 0 || runs[i].start + runs[i].len > S)
            return cpc_error(CPC_E_INPUT, "%s: tensor '%s': tokens [%lld, %lld) outside [0, %lld)",
                             f->path, t->name, (long long)runs[i].start,
                             (long long)(runs[i].start + runs[i].len), (long long)S);
        T += runs[i].len;
    }
    cpc_st_dtype want = cpc_st_from_dtype(dtype);
    int fes = t->esize, des = cpc_dtype_size(dtype);
    bool same = want == t->dtype;
    /* Conversion goes through a bounded staging buffer. */
    const int64_t chunk_elems = 1 << 18;
    void *tmp = NULL;
    if (!same) {
        tmp = malloc((size_t)chunk_elems * (size_t)fes);
        if (!tmp)
            return cpc_error(CPC_E_NOMEM, "out of memory");
    }
    cpc_status *st = NULL;
    char what[128];
    snprintf(what, sizeof what, "tensor '%s'", t->name);
    /* whole rows: one stretch per run; a column box: one stretch per token */
    bool whole = col0 == 0 && ncol == row;
    for (int64_t b = 0; b < nb && !st; b++) {
        int64_t tok = 0;
        for (int i = 0; i < n_runs && !st; i++) {
            int64_t pieces = whole ? 1 : runs[i].len, len = whole ? runs[i].len * ncol : ncol;
            for (int64_t pc = 0; pc < pieces && !st; pc++) {
                int64_t n = len;
                int64_t gfirst = ((b0 + b) * S + runs[i].start + pc) * row + col0; /* global element */
                uint64_t off = t->offset + (uint64_t)gfirst * (uint64_t)fes;
                char *d = (char *)dst + ((b * T + tok + pc) * ncol) * des;
                if (same) {
                    st = pread_all(f, d, (size_t)(n * fes), off, what);
                    for (int64_t j = 0; j < n && !st; j++) /* an Inf input: SPEC 5 */
                        if (isinf(load_f(t->dtype, d, j)))
                            st = overflow_error(f, t, gfirst + j, load_f(t->dtype, d, j), dtype);
                } else {
                    for (int64_t k = 0; k < n && !st; k += chunk_elems) {
                        int64_t m = n - k < chunk_elems ? n - k : chunk_elems;
                        st = pread_all(f, tmp, (size_t)(m * fes), off + (uint64_t)(k * fes), what);
                        for (int64_t j = 0; j < m && !st; j++) {
                            float xv = load_f(t->dtype, tmp, j);
                            if (isinf(xv) || !store_f(dtype, d, k + j, xv))
                                st = overflow_error(f, t, gfirst + k + j, xv, dtype);
                        }
                    }
                }
            }
            tok += runs[i].len;
        }
    }
    free(tmp);
    return st;
}

cpc_status *cpc_st_read_runs(const cpc_st_file *f, const cpc_st_tensor *t, const cpc_run *runs,
                             int n_runs, cpc_dtype dtype, void *dst)
{
    if (t->ndim < 2)
        return cpc_error(CPC_E_INPUT, "%s: tensor '%s' needs at least 2 dimensions", f->path,
                         t->name);
    int64_t row = 1;
    for (int i = 2; i < t->ndim; i++)
        row *= t->shape[i];
    return cpc_st_read_box(f, t, 0, t->shape[0], 0, row, runs, n_runs, dtype, dst);
}

cpc_status *cpc_st_read_mask(const cpc_st_file *f, const cpc_st_tensor *t, uint8_t *dst)
{
    if (t->dtype != CPC_ST_U8 && t->dtype != CPC_ST_BOOL)
        return cpc_error(CPC_E_INPUT, "%s: tensor '%s': dtype %s, U8 or BOOL expected", f->path,
                         t->name, t->dtype_name);
    char what[128];
    snprintf(what, sizeof what, "tensor '%s'", t->name);
    cpc_status *st = pread_all(f, dst, (size_t)t->nbytes, t->offset, what);
    if (st)
        return st;
    for (uint64_t i = 0; i < t->nbytes; i++)
        dst[i] = dst[i] != 0;
    return NULL;
}

static cpc_status *write_all(int fd, const void *p, size_t n, const char *path)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return cpc_error(CPC_E_IO, "%s: write failed: %s", path, strerror(errno));
        }
        if (w == 0)
            return cpc_error(CPC_E_IO, "%s: write failed: no progress", path);
        c += w;
        n -= (size_t)w;
    }
    return NULL;
}

static cpc_status *st_write(const char *path, const cpc_st_out *ts, int n, const char *const *meta_keys,
                            const char *const *meta_vals, int n_meta, cpc_outfile *staged);

cpc_status *cpc_st_write(const char *path, const cpc_st_out *ts, int n, const char *const *meta_keys,
                         const char *const *meta_vals, int n_meta)
{
    return st_write(path, ts, n, meta_keys, meta_vals, n_meta, NULL);
}

cpc_status *cpc_st_write_staged(const char *path, const cpc_st_out *ts, int n,
                                const char *const *meta_keys, const char *const *meta_vals, int n_meta,
                                cpc_outfile *staged)
{
    memset(staged, 0, sizeof *staged);
    staged->slot = -1;
    cpc_status *st = st_write(path, ts, n, meta_keys, meta_vals, n_meta, staged);
    if (!st)
        st = cpc_outfile_prepare(staged);
    if (st)
        cpc_outfile_discard(staged);
    return st;
}

static cpc_status *st_write(const char *path, const cpc_st_out *ts, int n, const char *const *meta_keys,
                            const char *const *meta_vals, int n_meta, cpc_outfile *staged)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    if (n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; m && i < n_meta; i++)
            cJSON_AddStringToObject(m, meta_keys[i], meta_vals[i]);
    }
    uint64_t off = 0;
    uint64_t *sizes = calloc((size_t)(n ? n : 1), sizeof *sizes);
    if (!sizes) {
        cJSON_Delete(root);
        return cpc_error(CPC_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < ts[i].ndim; d++)
            numel *= (uint64_t)ts[i].shape[d];
        sizes[i] = numel * (uint64_t)st_esize(ts[i].dtype);
        cJSON *e = cJSON_AddObjectToObject(root, ts[i].name);
        if (!e)
            continue;
        cJSON_AddStringToObject(e, "dtype", st_name(ts[i].dtype));
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; sh && d < ts[i].ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)ts[i].shape[d]));
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        if (o) {
            cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
            cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + sizes[i])));
        }
        off += sizes[i];
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) {
        free(sizes);
        return cpc_error(CPC_E_NOMEM, "out of memory");
    }
    size_t jl = strlen(json);
    size_t padded = (jl + 7) / 8 * 8;
    char *hdr = malloc(padded + 8);
    if (!hdr) {
        free(json);
        free(sizes);
        return cpc_error(CPC_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < 8; i++)
        hdr[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
    memcpy(hdr + 8, json, jl);
    memset(hdr + 8 + jl, ' ', padded - jl);
    free(json);
    /* fileio.h: a temporary file in the same directory, fsync'ed and renamed
     * over `path` when complete: a failed or interrupted write leaves the
     * previous file untouched and no partial one */
    cpc_outfile of;
    cpc_status *st = cpc_outfile_open(&of, path, "write failed");
    if (!st) {
        fflush(of.f); /* unbuffered from here: big tensors go straight to write() */
        int fd = fileno(of.f);
        st = write_all(fd, hdr, padded + 8, path);
        for (int i = 0; i < n && !st; i++)
            st = write_all(fd, ts[i].data, (size_t)sizes[i], path);
        if (st)
            cpc_outfile_discard(&of);
        else if (staged)
            *staged = of; /* the caller commits or discards */
        else
            st = cpc_outfile_commit(&of);
    }
    free(hdr);
    free(sizes);
    return st;
}
