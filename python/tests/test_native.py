"""The ctypes mirrors of libcpc's public structs (cpc/_native.py) against the C
compiler's view of include/cpc/*.h: a small C program prints sizeof and every
field's offsetof; a field added to a header without its mirror (or the reverse)
fails here instead of corrupting memory at run time.  The size-first structs
(compiler.h THE SIZE MEMBER) must begin with `size`, which a fresh mirror sets.  Needs a C compiler (cc); skipped
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
           "cpc_compile_options": N.CompileOptions, "cpc_rank_options": N.RankOptions,
           "cpc_p2p_callbacks": N.P2PCallbacks}
# the size-first structs (compiler.h THE SIZE MEMBER): `size` must be their first
# field, and a fresh mirror must carry its own sizeof in it
SIZED = ("cpc_compile_options", "cpc_rank_options", "cpc_p2p_callbacks")


def test_struct_layouts_match_the_headers(tmp_path):
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "cpc/cpc.h"',
             'int main(void) {']
    for cname, py in MIRRORS.items():
        lines.append(f'printf("{cname} sizeof %zu\\n", sizeof({cname}));')
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
        assert ctypes.sizeof(py) == seen[(cname, "sizeof")], \
            f"{cname}: ctypes {ctypes.sizeof(py)} bytes, C {seen[(cname, 'sizeof')]}"
        for fname, _ in py._fields_:
            assert getattr(py, fname).offset == seen[(cname, fname)], f"{cname}.{fname}"
    for cname in SIZED:
        py = MIRRORS[cname]
        assert py._fields_[0][0] == "size" and seen[(cname, "size")] == 0, cname
        assert py.size.offset == 0 and py().size == ctypes.sizeof(py), cname


def test_init_sets_the_size_and_the_library_checks_it():
    """cpc_rank_options_init writes `size` and the defaults; a zeroed or too small size
    is refused by the library (CPC_E_USAGE) before anything is made."""
    L = N.lib()
    o = N.RankOptions()
    o.size = 0
    L.cpc_rank_options_init(ctypes.byref(o), ctypes.sizeof(o))
    assert o.size == ctypes.sizeof(o) and o.device == -1 and o.timeout_s == 600.0
    co = N.CompileOptions()
    co.size = 0
    L.cpc_compile_options_init(ctypes.byref(co), ctypes.sizeof(co))
    assert co.size == ctypes.sizeof(co)
    yaml = REPO / "plans" / "flux1-dev-1024.yaml"
    art = ctypes.c_void_p()
    for size, ok in ((0, False), (8, False), (ctypes.sizeof(co), True)):
        co.size = size
        st = L.cpc_compile_plan_file(str(yaml).encode(), ctypes.byref(co), ctypes.byref(art), None)
        code = L.cpc_status_code(st)
        if st:
            msg = L.cpc_status_message(st).decode()
            L.cpc_status_free(st)
        assert (code == 0) == ok, (size, code)
        if not ok:
            assert code == 3 and "cpc_compile_options.size" in msg, msg
        if art:
            L.cpc_artifact_free(art)
            art = ctypes.c_void_p()

