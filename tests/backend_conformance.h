/*
 * backend_conformance.h - one conformance suite for every compute backend
 * (runtime/backend/backend.h), written once and run against each
 * implementation (the CPU backend, the CUDA backend on the CPU emulator of
 * tests/emu, the CUDA backend on a GPU), as transport_conformance.h does for
 * the transports.
 *
 * What it checks, against the float64 reference (runtime/session/reference.h)
 * on fresh random inputs rounded to the dtype (the reference reads the same
 * rounded values, so the error measured is the backend's alone):
 *
 *  ATTN      every case of the matrix below (cpc_bc_cases), for each of its
 *            dtypes: a global problem q [B,S,H,D], k/v [B,Skv,Hkv,D] (+ key
 *            padding) and one rank's view of it - query rows = the
 *            concatenation of the q runs, keys = the concatenation of the kv
 *            runs (positions not increasing, zigzag), query heads
 *            [qh0, qh0+nqh) with the K/V heads they need plus a spare one on
 *            each side where the global tensor has it (kv_head_off), `extra`
 *            poison (NaN) rows and `slack` poison elements per batch in the
 *            local q/k/v buffers (batch strides larger than the block).  With
 *            nblk > 1 the keys are split into nblk blocks attended one by one
 *            (rotated order) and merged with init_acc + merge, which must
 *            equal attention over all of the view's keys (ring attention).
 *            Outputs start as NaN on the device (every element must be
 *            written).  Rows that see no key must be exactly o = 0,
 *            lse = -inf; a NaN planted in q must make its row NaN (o and
 *            lse) and leave every other row finite; every other row is
 *            compared: out relative error (||got-ref||_2 / ||ref||_2 over the
 *            compared rows) <= out_tol, and |lse - ref| <= lse_tol *
 *            (1 + |ref|) for every row.
 *  MERGE     merge of random (acc, lse) and (o, lse) rows, including rows
 *            where one or both LSEs are -inf, against float64.
 *  INIT      init_acc: acc = +0, lse = -inf, over odd lengths.
 *  CONVERT   convert between fp32 and the dtype (and between bf16 and fp16
 *            unless skipped): bit-exact against cpc_f32_to_bf16/fp16 (round
 *            to nearest even), with inf, -0, NaN, subnormals and overflow.
 *  COPY      copy_strided: select tokens and heads out of a larger tensor,
 *            scatter them back (the rest untouched), unaligned pointers and
 *            odd inner sizes, fully contiguous, 2- and 4-byte elements.
 *  ADD       add_strided: fp32 dst += src over a strided block (the gaps
 *            untouched) and over one long row, bitwise against host sums; a
 *            backend without add_strided fails it.
 *  MEMORY    alloc (0 bytes gives unique pointers), upload, copy, download,
 *            sync.
 *  BWD       attn_bwd (backend.h, cpc_attn_bwd_args) on every case of the
 *            backward matrix (cpc_bc_bwd_cases), for each of its dtypes: the
 *            same global problem and view as ATTN plus dout [B,S,H,D]; the
 *            backend's own forward over the view's keys gives out (fp32, or
 *            converted to the plan dtype with the case's out_dtype) and the
 *            row's LSE (natural log: a forward/backward mismatch of the LSE
 *            base shows here), then the backward runs over the keys split
 *            into nblk blocks (rotated order; with nblk > 1 delta comes from a
 *            delta-only call, skv = 0, else from the first block), each
 *            block's dk/dv written in place into the view's gradient
 *            (dkv_bstride), dq/dk/dv accumulated (+=) onto prior values when
 *            the case says so.  Gradient buffers have `extra` sentinel rows
 *            per batch (must survive: batch strides), the K/V heads of the
 *            block that no query head of the view uses must stay untouched,
 *            rows that see no key must leave dq unchanged.  Compared with the
 *            float64 reference backward (cpc_reference_attention_bwd) with the
 *            keys restricted to the view and dout zeroed outside the view's
 *            rows and heads: relative error of dq, dk, dv (each) <= the SPEC
 *            gradient tolerance (fp32 1e-5, fp16 2e-3, bf16 2e-2; out_tol
 *            overrides), no NaN/Inf.  With opts.repeat the whole backward
 *            runs twice (perturbed): the gradients must be bitwise equal.
 *            Cases with pad 1 pass the key padding mask as host memory (what
 *            the executor passes), the others as a device buffer.
 *            A backend without attn_bwd fails this check (skip it instead).
 *  BAD_ARGS  the refusals of the contract: CPC_E_INTERNAL for query heads
 *            whose K/V heads are not in the block, runs that do not cover
 *            the rows, a key position outside the key padding mask, a batch
 *            stride smaller than a batch's block, negative sizes, group < 1,
 *            NULL q with work to do, run counts without runs; the outputs
 *            are left untouched.  And the edge cases that are not errors:
 *            skv = 0 (every row o = 0, lse = -inf), sq = 0 and B = 0
 *            (nothing written).  On a backend with attn_bwd, the backward
 *            of each problem is refused or accepted alike, with the
 *            forward's message (one cpc_attn_problem_check).
 *
 * Seeds: one base seed per call (opts->seed, else CPC_TEST_SEED, else the
 * clock), from which every case derives its own; every diagnostic names the
 * base seed, the case and the dtype.  CPC_TEST_SEED=N replays a run and
 * CPC_BC_ONLY=NAME (a case name prefix) runs only matching cases.
 *
 * Errors: every failed check is a CPC_E_CHECK diagnostic (the suite goes
 * on); a backend method that fails where it must not, or a backend that
 * cannot be created, is a diagnostic of the case too.  The returned chain
 * (NULL: everything passed) is owned by the caller (cpc_status_free).
 *
 * Thread-safety: no global state beyond what the backend has; one call at a
 * time per backend factory.
 */
#ifndef CPC_BACKEND_CONFORMANCE_H
#define CPC_BACKEND_CONFORMANCE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "kernel.h"
#include "status.h"

/* The checks, as bits (cpc_bc_opts.checks / skip). */
enum {
    CPC_BC_ATTN = 1u << 0,
    CPC_BC_MERGE = 1u << 1,
    CPC_BC_INIT = 1u << 2,
    CPC_BC_CONVERT = 1u << 3,
    CPC_BC_CONVERT_16_16 = 1u << 4, /* bf16 <-> fp16 pairs of CONVERT */
    CPC_BC_COPY = 1u << 5,
    CPC_BC_MEMORY = 1u << 6,
    CPC_BC_BAD_ARGS = 1u << 7,
    CPC_BC_BWD = 1u << 8,
    CPC_BC_ADD = 1u << 9,
    CPC_BC_ALL = (1u << 10) - 1,
};

/* Case flags. */
enum {
    /* Shapes sized to cross the tile boundaries of fast backends (hundreds to
     * thousands of rows): minutes on the CPU emulator of CUDA, so an emulated
     * backend excludes them (its own small cases cover the same features). */
    CPC_BC_LARGE = 1u << 0,
};

/* Position lists of the view instead of runs (`sq`/`skv` rows, global sizes
 * derived): */
enum {
    CPC_BC_POS_RUNS = 0,    /* qr/kr runs (none: every position in order) */
    CPC_BC_POS_ZIGZAG,      /* total = max(sq, skv), S = Skv = total; query row
                               i < sq/2 at i, else total-1-(i-sq/2); key rows
                               alternate front and back: i/2, total-1-i/2 */
    CPC_BC_POS_STRIDED,     /* S = Skv = 2*max(sq, skv); query row i at
                               3i mod S, key row j at 2j+1 */
};

typedef struct cpc_bc_case {
    const char *name;
    unsigned dtypes;      /* bits 1 << cpc_dtype; 0: fp32, bf16 and fp16 */
    int B;
    int64_t S, Skv;       /* global tokens (POS_RUNS) */
    int H, Hkv, D;        /* global heads, head_dim */
    bool causal;
    int pad;              /* key padding: 0 none; 1 random ~25% padded; 2 = 1 and
                             batch B-1 fully padded; 3 = 1 and keys 0..4 padded
                             (the first causal rows see no key) */
    int pos;              /* CPC_BC_POS_* */
    int64_t sq, skv;      /* view rows for POS_ZIGZAG / POS_STRIDED */
    cpc_run qr[8];
    int nqr;              /* 0: all [0, S) */
    cpc_run kr[8];
    int nkr;              /* 0: all [0, Skv) */
    int qh0, nqh;         /* query heads of the view; nqh 0: all */
    int extra;            /* poison rows per batch in the local q/k/v */
    int slack;            /* poison elements per batch on top (unaligned strides) */
    double amp;           /* q amplitude (0 -> 1); scores ~ amp * N(0, 1) */
    double vamp;          /* v amplitude (0 -> 1); 5e37: finite bf16/fp32 values
                             whose P V overflows fp32 unless scaled (issue 23) */
    int nblk;             /* > 1: keys split into blocks, merged */
    int row_step;         /* compare every row_step-th query row (0 -> 1) */
    bool nan_q;           /* a NaN planted in q of one row (batch 0, head qh0) */
    int64_t min_empty;    /* at least this many compared rows see no key */
    unsigned flags;       /* CPC_BC_LARGE */
    /* BWD cases only: */
    bool prior;           /* dq/dk/dv start with random values (+= checked) */
    bool out_dtype;       /* the saved out in the plan dtype (as training keeps it), else fp32 */
} cpc_bc_case;

/* The case matrix of ATTN (static storage). */
const cpc_bc_case *cpc_bc_cases(int *n);

/* The case matrix of BWD (static storage; nan_q and min_empty unused:
 * rows that see no key are counted and checked wherever they occur). */
const cpc_bc_case *cpc_bc_bwd_cases(int *n);

/* The backend under test, made per case: `create` gets the kernel
 * specialisation the case needs (dtype, head_dim, causal, gqa = H / Hkv; the
 * CPU backend ignores it) and returns a backend owned by the suite
 * (vt->destroy). */
typedef struct cpc_bc_backend {
    const char *name;     /* in messages */
    void *ctx;
    cpc_status *(*create)(void *ctx, const cpc_kernel_spec *spec, cpc_backend **out);
    /* Optional: NULL to run case `c` in dtype `dt`, else why the backend does
     * not (printed in the log). */
    const char *(*skip_case)(void *ctx, const cpc_bc_case *c, cpc_dtype dt);
    /* Optional, with opts.repeat: called with 1 before the second run of an
     * attention block, 0 after (e.g. the emulator's reversed thread order). */
    void (*perturb)(void *ctx, int on);
} cpc_bc_backend;

typedef struct cpc_bc_opts {
    unsigned checks;          /* CPC_BC_* bits to run; 0: all */
    unsigned skip;            /* bits NOT run (documented unsupported) */
    const char *skip_reason;  /* why (log) */
    unsigned exclude_flags;   /* cases with any of these flags are not run */
    const char *only;         /* case name prefix (NULL: CPC_BC_ONLY or every case) */
    unsigned dtypes;          /* restricts every case's dtypes (0: no restriction) */
    double out_tol;           /* 0: SPEC tolerance of the dtype (cpc_check_tolerance) */
    double lse_tol;           /* 0: the same as out_tol */
    bool repeat;              /* run each single-block case twice (perturb between):
                                 outputs must be bitwise equal */
    uint64_t seed;            /* 0: CPC_TEST_SEED, else from the clock */
    FILE *log;                /* NULL: quiet; else one line per case and check */
} cpc_bc_opts;

/* What ran (optional output of cpc_backend_conformance). */
typedef struct cpc_bc_report {
    uint64_t seed;            /* base seed */
    int cases_run;            /* (case, dtype) pairs run */
    int cases_skipped;        /* skipped by skip_case */
    int checks_run;           /* non-attention checks run (per dtype) */
    double seconds;
} cpc_bc_report;

/* Runs the suite; NULL when everything passed, else the chain of CPC_E_CHECK
 * diagnostics (the caller frees). */
cpc_status *cpc_backend_conformance(const cpc_bc_backend *be, const cpc_bc_opts *opts,
                                    cpc_bc_report *report);

#endif
