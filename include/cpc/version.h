/*
 * cpc/version.h - the version of the libcpc these headers belong to, for the
 * preprocessor (cpc_version() in cpc/cpc.h gives the linked library's at run
 * time: compare them to detect a header/library mismatch).
 *
 * This header is the single source of the version: CMakeLists.txt reads the
 * three numbers from it (project(cpc VERSION ...), the shared library's
 * SONAME, cpcConfigVersion.cmake, cpc.pc and cpc_version()'s string).
 *
 * CPC_VERSION_CODE orders versions: MAJOR * 10000 + MINOR * 100 + PATCH
 * (CPC_VERSION_AT_LEAST(0, 2, 0) for feature tests).  From 1.0 on, within
 * one MAJOR version the ABI only grows: functions are added, options structs
 * gain fields at their end (the soname is libcpc.so.MAJOR).  Before 1.0 each
 * MINOR version may change the ABI, so the soname carries both numbers
 * (libcpc.so.0.2): 0.2 renamed the lifecycle functions (new/free), put the
 * subject first and gave every options struct a leading `size`, so a program
 * built against 0.1 does not load 0.2 by mistake.
 */
#ifndef CPC_PUBLIC_VERSION_H
#define CPC_PUBLIC_VERSION_H

#define CPC_VERSION_MAJOR 0
#define CPC_VERSION_MINOR 2
#define CPC_VERSION_PATCH 0

#define CPC_VERSION_CODE (CPC_VERSION_MAJOR * 10000 + CPC_VERSION_MINOR * 100 + CPC_VERSION_PATCH)
#define CPC_VERSION_AT_LEAST(major, minor, patch) \
    (CPC_VERSION_CODE >= (major) * 10000 + (minor) * 100 + (patch))

#endif
