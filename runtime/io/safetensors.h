/*
 * safetensors.h - reading and writing safetensors files (SPEC section 7).
 *
 * Format (huggingface/safetensors): 8 bytes little-endian u64 N, then N bytes
 * of JSON header {"name": {"dtype": "BF16", "shape": [..], "data_offsets":
 * [begin, end]}, ..., "__metadata__": {string: string}}, then the data; the
 * offsets are relative to the start of the data, tensors are row-major and
 * little-endian.
 *
 * Reading validates everything before any tensor is used: a truncated file,
 * a header that is not JSON or not an object, a tensor entry without dtype,
 * shape or offsets, an unknown dtype, offsets out of range or not matching
 * shape x element size all give CPC_E_INPUT naming the file and the tensor;
 * no input crashes.  Data are read with pread, only the rows asked for (a
 * rank reads only its shard).
 *
 * Thread-safety: an open file may be read from several threads at once (pread
 * does not share a file offset); open/close are not concurrent with reads.
 */
#ifndef CPC_SAFETENSORS_H
#define CPC_SAFETENSORS_H

#include <stdbool.h>
#include <stdint.h>

#include "layout.h"
#include "plan.h"
#include "fileio.h"
#include "status.h"

#define CPC_ST_MAX_DIMS 8
/* Largest header accepted (bytes), as the reference implementation. */
#define CPC_ST_MAX_HEADER (100u * 1024u * 1024u)

typedef enum cpc_st_dtype {
    CPC_ST_F32 = 0,
    CPC_ST_F16,
    CPC_ST_BF16,
    CPC_ST_U8,
    CPC_ST_BOOL,
    CPC_ST_OTHER,   /* a valid safetensors dtype cpc does not read (I64, F64, ...) */
} cpc_st_dtype;

typedef struct cpc_st_tensor {
    char *name;                      /* owned by the file */
    char dtype_name[12];             /* as written: "BF16" */
    cpc_st_dtype dtype;
    int esize;                       /* bytes per element */
    int ndim;
    int64_t shape[CPC_ST_MAX_DIMS];
    uint64_t offset;                 /* absolute byte offset in the file */
    uint64_t nbytes;
} cpc_st_tensor;

typedef struct cpc_st_file {
    char *path;                      /* owned */
    int fd;
    uint64_t file_size;
    int n;
    cpc_st_tensor *tensors;          /* owned, in header order */
} cpc_st_file;

/* Opens and validates `path`.  Errors: CPC_E_IO (cannot open/read),
 * CPC_E_INPUT (format).  *out owned by the caller (cpc_st_close). */
cpc_status *cpc_st_open(const char *path, cpc_st_file **out);
void cpc_st_close(cpc_st_file *f);

/* The tensor called `name`, or NULL. */
const cpc_st_tensor *cpc_st_find(const cpc_st_file *f, const char *name);

/* Looks up `name` and checks its shape is exactly shape[0..ndim).  Errors
 * (CPC_E_INPUT): missing tensor, wrong rank or extent (both shapes named),
 * `want_float` and a dtype other than F32/F16/BF16, or !want_float and a
 * dtype other than U8/BOOL. */
cpc_status *cpc_st_expect(const cpc_st_file *f, const char *name, int ndim, const int64_t *shape,
                          bool want_float, const cpc_st_tensor **out);

/* Reads token rows of a float tensor of shape [B, S, ...] (rows along dim 1;
 * `row` = product of dims 2.. elements): dst is [B, T, ...] with T = sum of
 * run lengths, the runs (global token positions) in order for each batch,
 * converted to `dtype` (bf16/fp16 as uint16 bit patterns; round to nearest
 * even).  Errors: CPC_E_INPUT (run outside [0, S), not a float tensor, an
 * element that is +-Inf in the file or rounds to Inf in `dtype`, naming the
 * tensor and the element's index; NaN is read as it is), CPC_E_IO (read
 * error), CPC_E_NOMEM. */
cpc_status *cpc_st_read_runs(const cpc_st_file *f, const cpc_st_tensor *t, const cpc_run *runs,
                             int n_runs, cpc_dtype dtype, void *dst);
/* The same for a box (the outer axes, placement.h): batch items [b0, b0 +
 * nb) and, of each token row, elements [col0, col0 + ncol) (heads
 * [h0, h0 + nh) of a BSHD tensor: col0 = h0*D, ncol = nh*D); dst is
 * [nb, T, ncol].  cpc_st_read_runs is the box of every batch item and the
 * whole row.  Errors as above, also for a box outside the tensor. */
cpc_status *cpc_st_read_box(const cpc_st_file *f, const cpc_st_tensor *t, int64_t b0, int64_t nb,
                            int64_t col0, int64_t ncol, const cpc_run *runs, int n_runs,
                            cpc_dtype dtype, void *dst);

/* Reads a U8/BOOL tensor whole into dst (nbytes bytes), each element
 * normalised to 0/1.  Errors as above. */
cpc_status *cpc_st_read_mask(const cpc_st_file *f, const cpc_st_tensor *t, uint8_t *dst);

/* One tensor to write. */
typedef struct cpc_st_out {
    const char *name;
    cpc_st_dtype dtype;              /* F32, F16, BF16, U8 or BOOL */
    int ndim;
    int64_t shape[CPC_ST_MAX_DIMS];
    const void *data;                /* product(shape) * esize bytes */
} cpc_st_out;

/* Writes a safetensors file with tensors in the given order and optional
 * metadata (n_meta pairs of keys/values, may be 0).  The header is padded
 * with spaces to a multiple of 8 bytes.  Errors: CPC_E_IO naming the path. */
cpc_status *cpc_st_write(const char *path, const cpc_st_out *ts, int n, const char *const *meta_keys,
                         const char *const *meta_vals, int n_meta);

/* The same, staged (issue 23: --output-shards all or nothing): the file is
 * written to its temporary name (fileio.h), flushed and fsync'ed
 * (cpc_outfile_prepare), and left in *staged for the caller to
 * cpc_outfile_commit (rename over `path`) once every part of a set is
 * written, or cpc_outfile_discard.  On error *staged is released and
 * nothing remains. */
cpc_status *cpc_st_write_staged(const char *path, const cpc_st_out *ts, int n,
                                const char *const *meta_keys, const char *const *meta_vals, int n_meta,
                                cpc_outfile *staged);

/* Safetensors dtype for a plan dtype ("BF16" ...). */
cpc_st_dtype cpc_st_from_dtype(cpc_dtype d);

#endif
