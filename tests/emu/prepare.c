/*
 * prepare.c - cpc_emu_prepare: builds the CPU-emulator modules of the
 * kernels of .cplan artifacts, for the fake CUDA runtime (fake_cudart.c).
 *
 *   cpc_emu_prepare ARTIFACT.cplan [ARTIFACT.cplan ...] DIR
 *
 * For each kernel module of each artifact (compiler/ir/artifact.h: its CUDA
 * source and PTX), DIR/<sha256 of the PTX text>.so is built from the source
 * with cpc_emu_build_module (emu.h) - the name under which the fake
 * cudaLibraryLoadData looks the module up when cprun hands it that PTX.  A
 * module that already exists is kept (the same PTX comes from the same
 * source), so one DIR serves many artifacts and a kernel shared by several
 * is built once.  Each module is written to a temporary name and renamed
 * into place.  DIR is created when missing.
 *
 * Prints one line per module.  Exit status: 0 done, 2 usage or an artifact
 * that cannot be read or has no PTX (cpc --no-kernels), 3 a build failure
 * (the compiler's diagnostics are printed).
 */
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "artifact.h"
#include "emu.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Lowercase hex SHA-256 of the text's strlen bytes, as fake_cudart.c hashes it. */
static int sha256_hex(const char *text, char hex[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (!EVP_Digest(text, strlen(text), md, &n, EVP_sha256(), NULL) || n != 32)
        return -1;
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}

/* Builds the modules of one artifact; returns the exit status (0, 2, 3). */
static int prepare(const char *path, const char *dir)
{
    cpc_artifact *a = NULL;
    cpc_status *st = cpc_artifact_read(path, &a);
    if (st) {
        fprintf(stderr, "cpc_emu_prepare: %s\n", st->message);
        cpc_status_free(st);
        return 2;
    }
    int rc = 0;
    if (a->n_kernels == 0) {
        fprintf(stderr, "cpc_emu_prepare: %s: the artifact has no kernels\n", path);
        rc = 2;
    }
    for (int i = 0; i < a->n_kernels && !rc; i++) {
        const cpc_artifact_kernel *k = &a->kernels[i];
        if (!k->ptx || !k->ptx[0] || !k->source || !k->source[0]) {
            fprintf(stderr, "cpc_emu_prepare: %s: kernel module '%s' has no %s (compiled with --no-kernels?)\n",
                    path, k->name, !k->ptx || !k->ptx[0] ? "PTX" : "source");
            rc = 2;
            break;
        }
        char hex[65], so[4096], tmp[4200];
        if (sha256_hex(k->ptx, hex) != 0) {
            fprintf(stderr, "cpc_emu_prepare: SHA-256 failed\n");
            rc = 3;
            break;
        }
        snprintf(so, sizeof so, "%s/%s.so", dir, hex);
        if (access(so, R_OK) == 0) {
            printf("%s: %s (%s): %s exists\n", path, k->name, k->arch, so);
            continue;
        }
        snprintf(tmp, sizeof tmp, "%s/.%s.%ld.so", dir, hex, (long)getpid());
        char err[8192];
        double t0 = now_s();
        if (cpc_emu_build_module(k->source, tmp, err, sizeof err) != 0) {
            fprintf(stderr, "cpc_emu_prepare: %s: kernel module '%s': %s\n", path, k->name, err);
            unlink(tmp);
            rc = 3;
            break;
        }
        if (rename(tmp, so) != 0) {
            fprintf(stderr, "cpc_emu_prepare: %s: %s\n", so, strerror(errno));
            unlink(tmp);
            rc = 3;
            break;
        }
        printf("%s: %s (%s): built %s (%.1f s)\n", path, k->name, k->arch, so, now_s() - t0);
    }
    cpc_artifact_free(a);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fprintf(argc < 3 ? stderr : stdout,
                "usage: cpc_emu_prepare ARTIFACT.cplan [ARTIFACT.cplan ...] DIR\n"
                "builds DIR/<sha256 of each kernel's PTX>.so for the fake CUDA runtime\n");
        return argc < 3 ? 2 : 0;
    }
    const char *dir = argv[argc - 1];
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "cpc_emu_prepare: %s: %s\n", dir, strerror(errno));
        return 2;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "cpc_emu_prepare: %s: not a directory\n", dir);
        return 2;
    }
    for (int i = 1; i < argc - 1; i++) {
        int rc = prepare(argv[i], dir);
        if (rc)
            return rc;
    }
    return 0;
}
