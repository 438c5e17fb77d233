/*
 * api_options.h - reading and initialising the public API's size-first input
 * structs (include/cpc/compiler.h, THE SIZE MEMBER): cpc_compile_options,
 * cpc_rank_options, cpc_job_options, cpc_p2p_callbacks.
 *
 * The rule (as Linux's copy_struct_from_user for openat2/clone3, and
 * ncclConfig_t's size): the caller's struct has `size` bytes, its first
 * member.  size < the struct's first version (0: never initialised) is
 * CPC_E_USAGE; a smaller size than this libcpc's struct keeps the defaults
 * for the fields past it; a larger one is accepted when its tail (the fields
 * this libcpc does not know) is all zero bytes, else CPC_E_USAGE.
 *
 * Internal to api/ (static inline: no exported symbol).  Thread-safe
 * (no state).
 */
#ifndef CPC_API_OPTIONS_H
#define CPC_API_OPTIONS_H

#include <stddef.h>
#include <string.h>

#include "status.h"

/* Reads the caller's struct `src` into `dst` (`dst_size` bytes, already
 * holding the defaults; its first member is the size_t size, set to
 * dst_size on success).  `min_size`: the struct's first version.  `fn`,
 * `type`: the function and struct named by the error.  src NULL: dst keeps
 * the defaults.  Errors: CPC_E_USAGE as above (dst unchanged). */
static inline cpc_status *cpc_api_read_options(void *dst, size_t dst_size, size_t min_size,
                                               const void *src, const char *fn, const char *type)
{
    if (!src)
        return NULL;
    size_t size;
    memcpy(&size, src, sizeof size);
    if (size < min_size)
        return cpc_error(CPC_E_USAGE,
                         "%s: %s.size is %zu, expected at least %zu (sizeof the struct: fill it "
                         "with %s_init(&o, sizeof o) or set .size = sizeof o)",
                         fn, type, size, min_size, type);
    if (size > dst_size) {
        const unsigned char *tail = (const unsigned char *)src;
        for (size_t i = dst_size; i < size; i++)
            if (tail[i])
                return cpc_error(CPC_E_USAGE,
                                 "%s: %s.size is %zu and byte %zu is set, but this libcpc knows "
                                 "only %zu bytes of it (built against a newer header: upgrade "
                                 "libcpc, or leave the new fields zero)",
                                 fn, type, size, i, dst_size);
        size = dst_size;
    }
    memcpy(dst, src, size);
    memcpy(dst, &dst_size, sizeof dst_size);
    return NULL;
}

/* Copies the library's defaults `defaults` (dst_size bytes) into the
 * caller's struct o of `size` bytes: the first min(size, dst_size) bytes,
 * the rest zeroed, and o->size = size.  size < sizeof(size_t): nothing. */
static inline void cpc_api_init_options(void *o, size_t size, const void *defaults,
                                        size_t dst_size)
{
    if (!o || size < sizeof(size_t))
        return;
    memcpy(o, defaults, size < dst_size ? size : dst_size);
    if (size > dst_size)
        memset((unsigned char *)o + dst_size, 0, size - dst_size);
    memcpy(o, &size, sizeof size);
}

#endif
