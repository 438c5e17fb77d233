/*
 * cpc/export.h - CPC_API marks the functions libcpc exports.
 *
 * libcpc is compiled with -fvisibility=hidden: a function is in the shared
 * library's dynamic symbol table only when its declaration carries CPC_API
 * (every function of the public headers does; tests/cli/library.sh checks the
 * table against the headers).  Internal functions stay hidden, so a program
 * cannot declare one by hand and link it from libcpc.so.  For the static
 * library and for callers the attribute changes nothing.
 */
#ifndef CPC_PUBLIC_EXPORT_H
#define CPC_PUBLIC_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define CPC_API __attribute__((visibility("default")))
#else
#define CPC_API
#endif

#endif
