/*
 * yaml_tree.h - a small YAML document tree with source positions, built from
 * libyaml's event API (yaml_parser_parse).  Used to read plan files (SPEC
 * section 1) and, later, the .cplan artifact (SPEC section 4).
 *
 * WHAT IS ACCEPTED.  One YAML document (or none: an empty stream) made of
 * mappings, sequences and scalars, block or flow style.  Refused, with a
 * CPC_E_PLAN diagnostic and its position:
 *   CP100  YAML syntax errors (libyaml's problem text and position, with a
 *          note at libyaml's context position when it gives one), anchors
 *          (&a), aliases (*a), tags (!!int, !foo) and %TAG directives,
 *          non-scalar mapping keys, a second document;
 *   CP105  a key repeated in one mapping (the later pair is dropped from the
 *          tree, the error points at it with a note at the first one);
 *   CP106  input larger than CPC_YAML_MAX_BYTES (1 MiB) or collections nested
 *          deeper than CPC_YAML_MAX_DEPTH (64) levels (the top-level mapping
 *          is level 1).
 * Every diagnostic has class CPC_E_PLAN, severity ERROR and the rule number.
 * After CP100/CP106 parsing stops and no tree is returned; after CP105 only,
 * the tree is returned together with the errors (so that a caller can report
 * further problems of the same file), and the caller must check the chain.
 *
 * POSITIONS.  Every node keeps the span (file, line, column, 1-based) of its
 * first character: for a block mapping or sequence that is its first key or
 * "- ", for a flow collection its '{' or '[', for a block scalar its '|' or
 * '>'.  Columns count characters, as libyaml does.  Spans' file strings are
 * owned by the tree (they stay valid until cpc_ytree_free).
 *
 * SCALAR TYPING.  Plain scalars are typed by a strict subset of the YAML 1.2
 * core schema (SPEC section 1); quoted and block scalars are always strings:
 *   null   : empty, ~, null, Null, NULL
 *   bool   : true, false                        (NOT True, yes, on, ...)
 *   int    : [-+]?[0-9]+                         (NOT 0x18, 0o17, 1_000, 24.0)
 *   float  : [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?, [-+]?.inf
 *            (.inf/.Inf/.INF), .nan/.NaN/.NAN    (an int is also a valid float)
 *   string : every other plain scalar
 * cpc_ynode_describe() explains a value in words for "expected X, found Y"
 * diagnostics and recognises the forms that are commonly mistaken for
 * numbers or booleans (hex/octal, underscores, YAML 1.1 booleans).
 *
 * OWNERSHIP.  A cpc_ytree owns its root node and everything below it; nodes
 * own their children and their scalar text.  cpc_ytree_free() releases all.
 * Nodes created with cpc_ynode_new_*() are owned by the caller until they
 * are put into a tree (cpc_ynode_map_put / cpc_ynode_seq_set).
 *
 * Thread-safety: parsing uses no global state (several threads may parse at
 * once); a tree may be read from several threads, but not while mutated.
 */
#ifndef CPC_YAML_TREE_H
#define CPC_YAML_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define CPC_YAML_MAX_BYTES ((size_t)1 << 20) /* 1 MiB: larger input is CP106 */
#define CPC_YAML_MAX_DEPTH 64                /* nesting levels: deeper is CP106 */

typedef enum cpc_ynode_kind {
    CPC_YNODE_SCALAR = 0,
    CPC_YNODE_MAPPING,
    CPC_YNODE_SEQUENCE,
    CPC_YNODE__COUNT
} cpc_ynode_kind;

/* How a scalar was written. */
typedef enum cpc_ystyle {
    CPC_YSTYLE_PLAIN = 0,
    CPC_YSTYLE_SINGLE_QUOTED,
    CPC_YSTYLE_DOUBLE_QUOTED,
    CPC_YSTYLE_LITERAL,  /* | block */
    CPC_YSTYLE_FOLDED,   /* > block */
    CPC_YSTYLE__COUNT
} cpc_ystyle;

/* Resolved type of a node (strict core schema, see above). */
typedef enum cpc_ytype {
    CPC_YTYPE_NULL = 0,
    CPC_YTYPE_BOOL,
    CPC_YTYPE_INT,
    CPC_YTYPE_FLOAT,
    CPC_YTYPE_STRING,
    CPC_YTYPE_MAPPING,
    CPC_YTYPE_SEQUENCE,
    CPC_YTYPE__COUNT
} cpc_ytype;

/* Result of a typed conversion. */
typedef enum cpc_yconv {
    CPC_YCONV_OK = 0,
    CPC_YCONV_TYPE,   /* the node is not of the requested type */
    CPC_YCONV_RANGE,  /* right type, but it does not fit (int64 / double overflow) */
} cpc_yconv;

/* A node.  Fields are public for reading; modify trees only through the
 * functions below. */
typedef struct cpc_ynode {
    cpc_ynode_kind kind;
    cpc_span span;            /* first character; span.file owned by the tree */
    /* SCALAR */
    char *str;                /* text after YAML unescaping, NUL-terminated; may
                                 contain NUL bytes (double-quoted "\0"): use len */
    size_t len;               /* bytes in str */
    cpc_ystyle style;
    /* MAPPING and SEQUENCE */
    bool flow;                /* written in flow style ({...} / [...]) */
    int n;                    /* mapping: pairs; sequence: items */
    int cap;                  /* allocated entries (private) */
    struct cpc_ynode **keys;  /* mapping: n SCALAR key nodes; NULL for sequences */
    struct cpc_ynode **vals;  /* mapping: n values; sequence: n items */
} cpc_ynode;

typedef struct cpc_ytree {
    cpc_ynode *root;          /* NULL for an empty stream (no document, or
                                 only comments) */
    int n_files;              /* private: file names the spans point to */
    char **files;
} cpc_ytree;

/* ---- parsing ----------------------------------------------------------- */

/* Reads and parses the file at `path`.  Spans name `path` as given.
 * Errors: CPC_E_IO when the file cannot be opened or read; CP100/CP105/CP106
 * as described at the top.  On success (no error in the returned chain)
 * *out is the tree (caller frees with cpc_ytree_free); see the top for the
 * CP105-only case; otherwise *out = NULL. */
cpc_status *cpc_ytree_parse_file(const char *path, cpc_ytree **out);

/* Parses `len` bytes of `text` (need not be NUL-terminated).  `file` names
 * the source in spans (NULL -> "<string>").  Same results as above. */
cpc_status *cpc_ytree_parse_string(const char *text, size_t len, const char *file,
                                   cpc_ytree **out);

/* As cpc_ytree_parse_string, for text embedded in something else (such as
 * the VALUE of a `--set KEY=VALUE` argument): positions are reported as if
 * text[0] were at (first_line, first_col) of `file`; columns of later lines
 * are not shifted.  first_line and first_col are 1-based. */
cpc_status *cpc_ytree_parse_string_at(const char *text, size_t len, const char *file,
                                      int first_line, int first_col, cpc_ytree **out);

/* Frees a tree and all its nodes.  NULL is ignored. */
void cpc_ytree_free(cpc_ytree *tree);

/* ---- reading ----------------------------------------------------------- */

/* Value of key `key` (exact, case-sensitive byte comparison) in mapping
 * `map`; NULL when absent or when `map` is NULL or not a mapping.  Linear in
 * the number of pairs. */
const cpc_ynode *cpc_ynode_get(const cpc_ynode *map, const char *key);
/* Same, also giving the key node (NULL when absent). */
const cpc_ynode *cpc_ynode_get2(const cpc_ynode *map, const char *key,
                                const cpc_ynode **key_node);
/* Index of `key` in `map` (0..n-1), -1 when absent. */
int cpc_ynode_find(const cpc_ynode *map, const char *key);

/* Number of pairs / items (0 for scalars and NULL). */
int cpc_ynode_count(const cpc_ynode *n);
/* Key, value (mapping) or item (sequence) i; NULL when out of range or of
 * the wrong kind.  Iterate with for (i = 0; i < cpc_ynode_count(m); i++). */
const cpc_ynode *cpc_ynode_key(const cpc_ynode *map, int i);
const cpc_ynode *cpc_ynode_value(const cpc_ynode *map, int i);
const cpc_ynode *cpc_ynode_item(const cpc_ynode *seq, int i);

/* True for a scalar whose text equals `s` (any style). */
bool cpc_ynode_is(const cpc_ynode *n, const char *s);

/* ---- typing ------------------------------------------------------------ */

/* Resolved type (strict core schema).  NULL node -> CPC_YTYPE_NULL. */
cpc_ytype cpc_ynode_type(const cpc_ynode *n);
/* "null", "boolean", "integer", "float", "string", "mapping", "sequence". */
const char *cpc_ytype_name(cpc_ytype t);

/* Typed values.  _int: plain decimal integers only, CPC_YCONV_RANGE when the
 * value does not fit in int64.  _bool: plain true/false only.  _float:
 * integers and floats; CPC_YCONV_RANGE when a finite literal overflows a
 * double (.inf and .nan are returned as such: range-check them yourself).
 * _string: quoted and block scalars and plain scalars that type as strings
 * (not null/bool/int/float); *out points into the node (valid while the
 * tree lives; check len for embedded NULs).  On anything but OK, *out is
 * left unchanged. */
cpc_yconv cpc_ynode_int(const cpc_ynode *n, int64_t *out);
cpc_yconv cpc_ynode_bool(const cpc_ynode *n, bool *out);
cpc_yconv cpc_ynode_float(const cpc_ynode *n, double *out);
cpc_yconv cpc_ynode_string(const cpc_ynode *n, const char **out);

/* Describes a node in words for diagnostics, into buf (always
 * NUL-terminated, truncated with "..." to fit; size >= 16) and returns buf:
 *   integer 24 | float 24.0 | boolean true | null (empty value) |
 *   quoted string "8" | string 'abc' | hexadecimal number 0x18 (only plain
 *   decimal integers are accepted) | number with underscores 1_000 (write it
 *   without underscores) | yes (a YAML 1.1 boolean: write true or false) |
 *   True (booleans are lowercase: write true or false) | a mapping |
 *   a sequence
 * Control and non-ASCII bytes are escaped (\n, \xNN). */
const char *cpc_ynode_describe(const cpc_ynode *n, char *buf, size_t size);

/* Writes s[0..len) into buf (size >= 8) with control bytes, quotes and
 * backslashes escaped, truncated with "..." to fit; returns buf.  Used to
 * quote user text in messages. */
const char *cpc_yaml_escape(const char *s, size_t len, char *buf, size_t size);

/* ---- building and editing ---------------------------------------------- */

/* New nodes, owned by the caller until put into a tree.  `span.file` must
 * stay valid as long as the node lives (use cpc_ytree_intern_file).  NULL on
 * out-of-memory. */
cpc_ynode *cpc_ynode_new_scalar(const char *s, size_t len, cpc_ystyle style, cpc_span span);
cpc_ynode *cpc_ynode_new_mapping(bool flow, cpc_span span);
cpc_ynode *cpc_ynode_new_sequence(bool flow, cpc_span span);

/* Puts key -> value into mapping `map`, taking ownership of both (also on
 * failure, when they are freed).  When a key with the same text exists, its
 * key node and value are replaced (the old ones freed); otherwise the pair is
 * appended.  Returns false on out-of-memory or when map is not a mapping or
 * key not a scalar. */
bool cpc_ynode_map_put(cpc_ynode *map, cpc_ynode *key, cpc_ynode *value);
/* Appends `item` to sequence `seq` (takes ownership, also on failure). */
bool cpc_ynode_seq_append(cpc_ynode *seq, cpc_ynode *item);
/* Replaces item i (0 <= i < n) of `seq` with `item` (takes ownership; the
 * old item is freed). */
bool cpc_ynode_seq_set(cpc_ynode *seq, int i, cpc_ynode *item);

/* Frees a node and its children.  NULL is ignored. */
void cpc_ynode_free(cpc_ynode *n);

/* Depth of the deepest collection in n (a scalar: 0, {a: 1}: 1). */
int cpc_ynode_depth(const cpc_ynode *n);

/* Returns a copy of `name` owned by `tree` (the same pointer for the same
 * name), for spans of nodes added to the tree; NULL on out-of-memory. */
const char *cpc_ytree_intern_file(cpc_ytree *tree, const char *name);

/* Moves the root of `src` out of it (returned, owned by the caller until put
 * into `dst`) and moves the file names its spans use into `dst`, then frees
 * `src`.  Use it to graft a parsed value into another tree.  Returns NULL
 * when src has no root (src is freed all the same) or on out-of-memory (the
 * root is then freed). */
cpc_ynode *cpc_ytree_adopt(cpc_ytree *dst, cpc_ytree *src);

#endif
