"""ctypes declarations of libcpc's public C API (include/cpc/*.h).

libcpc is loaded lazily, on the first call that needs it, so that ``import cpc``
(and everything that is pure Python: ``cpc.from_diffusers``, plan dicts) works on
a machine without the library's dependencies; a library that cannot be loaded is
reported by the call that needed it (``cpc.UnsupportedError``).

Which library: ``$CPC_LIBRARY`` (a path) when set, else the copy that
``pip install`` bundled in ``cpc/_lib/``, else the system's ``libcpc.so.0.2`` /
``libcpc.so``.  Every declaration below mirrors a header; ``tests/test_native.py``
checks the struct layouts against the C compiler's view (offsetof / sizeof).
"""

import ctypes
import glob
import os
import threading

# ---- types.h -----------------------------------------------------------------

DTYPE_BF16, DTYPE_FP16, DTYPE_FP32 = 0, 1, 2
DTYPE_U8 = 100
DTYPE_NAMES = {DTYPE_BF16: "bf16", DTYPE_FP16: "fp16", DTYPE_FP32: "fp32", DTYPE_U8: "u8"}

(ROLE_Q, ROLE_K, ROLE_V, ROLE_OUT, ROLE_LSE, ROLE_MASK, ROLE_DOUT, ROLE_DQ, ROLE_DK,
 ROLE_DV) = range(10)
ROLES = {"q": ROLE_Q, "k": ROLE_K, "v": ROLE_V, "out": ROLE_OUT, "lse": ROLE_LSE,
         "mask": ROLE_MASK, "dout": ROLE_DOUT, "dq": ROLE_DQ, "dk": ROLE_DK, "dv": ROLE_DV}


class Tensor(ctypes.Structure):
    """struct cpc_tensor: a strided view of caller memory (strides in elements)."""
    _fields_ = [("data", ctypes.c_void_p),
                ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 4),
                ("strides", ctypes.c_int64 * 4)]


class TokenRun(ctypes.Structure):
    _fields_ = [("start", ctypes.c_int64), ("len", ctypes.c_int64)]


# ---- compiler.h / rank.h option structs ---------------------------------------
# Each begins with `size` (compiler.h THE SIZE MEMBER): sizeof the struct as this
# mirror knows it; the init functions take it (init(byref(o), sizeof(o))) and set it,
# and libcpc refuses 0 or a too-small size (CPC_E_USAGE).  The layouts are checked
# against the headers by python/tests/test_native.py.


class _Sized(ctypes.Structure):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.size = ctypes.sizeof(self)


class CompileOptions(_Sized):
    _fields_ = [("size", ctypes.c_size_t),
                ("sets", ctypes.POINTER(ctypes.c_char_p)),
                ("n_sets", ctypes.c_int),
                ("lua", ctypes.c_char_p),
                ("kernels", ctypes.c_bool),
                ("arch", ctypes.c_char_p)]


BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2
BACKENDS = {"auto": BACKEND_AUTO, "cpu": BACKEND_CPU, "cuda": BACKEND_CUDA}


class RankOptions(_Sized):
    _fields_ = [("size", ctypes.c_size_t),
                ("backend", ctypes.c_int),
                ("device", ctypes.c_int),
                ("timeout_s", ctypes.c_double),
                ("cuda_stream", ctypes.c_void_p)]


# ---- status.h ------------------------------------------------------------------

CODE_NAMES = ["ok", "plan", "check", "usage", "io", "input", "nomem", "internal",
              "runtime", "unsupported"]
SEVERITIES = ["error", "warning", "note"]

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_I64P = ctypes.POINTER(ctypes.c_int64)

# rank.h: cpc_p2p_callbacks (cpc_rank_new_callbacks)
P2P_SEND = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(ctypes.c_int64))
P2P_RECV = P2P_SEND
P2P_WAIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int64)


class P2PCallbacks(_Sized):
    _fields_ = [("size", ctypes.c_size_t),
                ("user", ctypes.c_void_p),
                ("isend", P2P_SEND),
                ("irecv", P2P_RECV),
                ("wait", P2P_WAIT)]


# name: (restype, argtypes)
_DECLS = {
    # cpc.h
    "cpc_version": (ctypes.c_char_p, []),
    "cpc_have_mpi": (ctypes.c_bool, []),
    "cpc_have_cuda": (ctypes.c_bool, []),
    "cpc_have_nccl": (ctypes.c_bool, []),
    "cpc_have_cudnn": (ctypes.c_bool, []),
    # status.h
    "cpc_status_code": (ctypes.c_int, [_P]),
    "cpc_status_severity": (ctypes.c_int, [_P]),
    "cpc_status_message": (ctypes.c_char_p, [_P]),
    "cpc_status_rule": (ctypes.c_int, [_P]),
    "cpc_status_hint": (ctypes.c_char_p, [_P]),
    "cpc_status_position": (None, [_P, ctypes.POINTER(ctypes.c_char_p),
                                   ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]),
    "cpc_status_next": (_P, [_P]),
    "cpc_status_notes": (_P, [_P]),
    "cpc_status_free": (None, [_P]),
    "cpc_status_print": (None, [_P, _P, ctypes.c_char_p]),
    # compiler.h
    "cpc_compile_options_init": (None, [ctypes.POINTER(CompileOptions), ctypes.c_size_t]),
    "cpc_compile_plan_file": (_P, [ctypes.c_char_p, ctypes.POINTER(CompileOptions), _PP, _PP]),
    "cpc_compile_plan_string": (_P, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                     ctypes.POINTER(CompileOptions), _PP, _PP]),
    "cpc_artifact_load": (_P, [ctypes.c_char_p, _PP]),
    "cpc_artifact_write": (_P, [_P, ctypes.c_char_p]),
    "cpc_artifact_free": (None, [_P]),
    "cpc_artifact_variant": (ctypes.c_char_p, [_P]),
    "cpc_artifact_world_size": (ctypes.c_int, [_P]),
    "cpc_artifact_ring_degree": (ctypes.c_int, [_P]),
    "cpc_artifact_ulysses_degree": (ctypes.c_int, [_P]),
    "cpc_artifact_dtype": (ctypes.c_int, [_P]),
    "cpc_artifact_shape": (None, [_P, _I64P, _I64P, _I64P, _I64P, _I64P, _I64P]),
    "cpc_artifact_causal": (ctypes.c_bool, [_P]),
    "cpc_artifact_key_padding": (ctypes.c_bool, [_P]),
    "cpc_artifact_cross_attention": (ctypes.c_bool, [_P]),
    "cpc_artifact_trains": (ctypes.c_bool, [_P]),
    "cpc_artifact_get_prediction": (ctypes.c_bool, [_P, ctypes.c_char_p,
                                                    ctypes.POINTER(ctypes.c_double)]),
    "cpc_artifact_shard_shape": (_P, [_P, ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_int), ctypes.c_int64 * 4]),
    "cpc_artifact_shard_runs": (_P, [_P, ctypes.c_int, ctypes.POINTER(TokenRun), ctypes.c_int,
                                     ctypes.POINTER(ctypes.c_int)]),
    # rank.h
    "cpc_rank_options_init": (None, [ctypes.POINTER(RankOptions), ctypes.c_size_t]),
    "cpc_local_world_new": (_P, [_P, _PP]),
    "cpc_local_world_free": (None, [_P]),
    "cpc_rank_new_local": (_P, [_P, _P, ctypes.c_int, ctypes.POINTER(RankOptions), _PP]),
    "cpc_rank_new_mpi": (_P, [_P, _P, ctypes.POINTER(RankOptions), _PP]),
    "cpc_rank_new_callbacks": (_P, [_P, ctypes.c_int, ctypes.POINTER(P2PCallbacks),
                                       ctypes.POINTER(RankOptions), _PP]),
    "cpc_rank_new_nccl": (_P, [_P, _P, _P, ctypes.POINTER(RankOptions), _PP]),
    "cpc_nccl_unique_id": (_P, [ctypes.c_void_p, ctypes.c_size_t]),
    "cpc_rank_new_nccl_id": (_P, [_P, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                  ctypes.POINTER(RankOptions), _PP]),
    "cpc_rank_index": (ctypes.c_int, [_P]),
    "cpc_rank_world_size": (ctypes.c_int, [_P]),
    "cpc_rank_allocated_bytes": (ctypes.c_int64, [_P]),
    "cpc_rank_forward": (_P, [_P, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor),
                              ctypes.POINTER(Tensor), ctypes.POINTER(Tensor),
                              ctypes.POINTER(Tensor), ctypes.POINTER(Tensor)]),
    "cpc_rank_backward": (_P, [_P] + [ctypes.POINTER(Tensor)] * 10),
    "cpc_rank_saved_lse_elements": (ctypes.c_int64, [_P]),
    "cpc_rank_saved_lse": (_P, [_P, ctypes.c_void_p, ctypes.c_int64]),
    "cpc_rank_abort": (_P, [_P, ctypes.c_char_p]),
    "cpc_rank_free": (None, [_P]),
}

_lock = threading.Lock()
_lib = None
_load_error = None


class _Missing:
    """Stands in for a function the loaded libcpc does not export (an older
    library): calling it raises, everything else keeps working."""

    def __init__(self, name, path):
        self.name, self.path = name, path

    def __call__(self, *args):
        from ._errors import UnsupportedError
        raise UnsupportedError(f"{self.name} is not exported by {self.path} (libcpc too old "
                               "for this package?)", code="unsupported")


def _candidates():
    env = os.environ.get("CPC_LIBRARY")
    if env:
        return [env]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib")
    bundled = sorted(glob.glob(os.path.join(here, "libcpc.so*")), key=len)
    return bundled + ["libcpc.so.0.2", "libcpc.so"]


def library_path():
    """The path of the libcpc that is (or would be) loaded."""
    lib = lib_or_none()
    return getattr(lib, "_cpc_path", None)


def lib_or_none():
    try:
        return lib()
    except Exception:  # noqa: BLE001 - reported by lib()
        return None


def _prefer_pip_nccl():
    """Where PyTorch's NCCL wheel (nvidia-nccl-*, package nvidia.nccl) is installed, load
    its libnccl.so.2 globally before libcpc: libcpc needs libnccl.so.2 too, and the
    dynamic loader serves one library per soname, so whichever loads first serves both.
    Loaded first, the system's older NCCL left torch's libtorch_cuda without symbols it
    needs (`undefined symbol: ncclCommResume` at `import torch` after a cpc call); the
    wheel's NCCL is the newer one and keeps NCCL's backward-compatible ABI for libcpc.
    Nothing happens without the wheel or when it cannot be loaded."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return
    for folder in (spec.submodule_search_locations or []) if spec else []:
        so = os.path.join(folder, "lib", "libnccl.so.2")
        if os.path.exists(so):
            try:
                ctypes.CDLL(so, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass
            return


def lib():
    """The loaded libcpc (ctypes.CDLL with declarations), loading it on first use.
    Raises cpc.UnsupportedError naming every path tried when it cannot be loaded."""
    global _lib, _load_error
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        _prefer_pip_nccl()
        for path in _candidates():
            try:
                # RTLD_GLOBAL: libcpc's MPI is then the same Open MPI instance as mpi4py's
                # (Open MPI's plugins resolve libmpi symbols globally).
                handle = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                errors.append(f"{path}: {e}")
                continue
            for name, (res, args) in _DECLS.items():
                try:
                    fn = getattr(handle, name)
                except AttributeError:
                    setattr(handle, name, _Missing(name, path))
                    continue
                fn.restype = res
                fn.argtypes = args
            handle._cpc_path = path
            _lib = handle
            return _lib
        _load_error = "; ".join(errors)
    from ._errors import UnsupportedError
    raise UnsupportedError("libcpc could not be loaded (" + _load_error + "); reinstall the "
                           "package with `pip install ./python`, or set CPC_LIBRARY to a "
                           "libcpc.so", code="unsupported")
