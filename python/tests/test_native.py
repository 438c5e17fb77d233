"""The ctypes mirrors of libcpc's public structs (cpc/_native.py) against the C
compiler's view of include/cpc/*.h: a small C program prints sizeof and every
field's offsetof; a field added to a header without its mirror (or the reverse)
fails here instead of corrupting memory at run time (cpc_rank_options_init writes
sizeof(cpc_rank_options) bytes into the mirror).  Needs a C compiler (cc); skipped
without one."""
import ctypes
import shutil
import subprocess

import pytest

from conftest import REPO

from cpc import _native as N

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")

MIRRORS = {"cpc_tensor": N.Tensor, "cpc_token_run": N.TokenRun,
           "cpc_compile_options": N.CompileOptions, "cpc_rank_options": N.RankOptions}


def test_struct_layouts_match_the_headers(tmp_path):
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "cpc/cpc.h"',
             'int main(void) {']
    for cname, py in MIRRORS.items():
        lines.append(f'printf("{cname} size %zu\\n", sizeof({cname}));')
        for fname, _ in py._fields_:
            lines.append(f'printf("{cname} {fname} %zu\\n", offsetof({cname}, {fname}));')
    lines += ['return 0;', '}']
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run([CC, "-std=c11", "-I", str(REPO / "include"), str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    seen = {}
    for line in out.splitlines():
        cname, what, value = line.split()
        seen[(cname, what)] = int(value)
    for cname, py in MIRRORS.items():
        assert ctypes.sizeof(py) == seen[(cname, "size")], \
            f"{cname}: ctypes {ctypes.sizeof(py)} bytes, C {seen[(cname, 'size')]}"
        for fname, _ in py._fields_:
            assert getattr(py, fname).offset == seen[(cname, fname)], f"{cname}.{fname}"
