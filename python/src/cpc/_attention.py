"""Running in-process: cpc.Attention (one rank) and cpc.LocalWorld (every rank as a
thread of this process)."""

import atexit
import ctypes
import sys
import threading
import weakref

from . import _native as N
from ._errors import UsageError, check as _check

_NUMPY_DTYPES = {"bf16": "uint16", "fp16": "float16", "fp32": "float32"}
_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_CODES = {"bf16": N.DTYPE_BF16, "fp16": N.DTYPE_FP16, "fp32": N.DTYPE_FP32}

# MPI ranks still alive: destroyed (collectively, in creation order) before mpi4py
# finalises MPI at exit; atexit runs handlers in reverse order of registration and
# mpi4py registered its own when it was imported, before any rank existed.
_mpi_ranks = []
_atexit_registered = False


def abort(reason="aborted by the caller"):
    """Ends the MPI job cleanly after an error on this process (e.g. in an except
    clause, or from sys.excepthook): libcpc prints "rank P: aborted by the caller:
    REASON" and calls MPI_Abort, so the peers blocked in a cpc forward or backward
    end at once (exit status 3) instead of at the stall limit (Attention's
    timeout_s, default 600 s).  Does not return while an MPI rank is alive; without
    one (no MPI rank in this process) it raises cpc.UsageError.

        try:
            out = att(q, k, v)
        except cpc.Error as e:
            cpc.abort(str(e))
    """
    for ref in list(_mpi_ranks):
        att = ref()
        if att is not None and att._ptr is not None:
            att.abort(reason)
    raise UsageError("cpc.abort: this process has no MPI rank (a LocalWorld rank is "
                     "aborted with Attention.abort)", code="usage")


def _destroy_mpi_ranks():
    for ref in list(_mpi_ranks):
        att = ref()
        if att is not None:
            att.close()


class _View:
    """A cpc_tensor over an array's memory, the array kept alive; `copied` says whether
    the memory is a copy (layout cpc cannot take: negative, zero or unaligned strides)."""

    __slots__ = ("t", "keep", "copied", "readonly", "capsule")


def _torch():
    return sys.modules.get("torch")


def _dlpack_device(x):
    """(device_type, device_id) of a DLPack producer, or None."""
    f = getattr(x, "__dlpack_device__", None)
    if f is None:
        return None
    try:
        return tuple(int(v) for v in f())
    except Exception:  # noqa: BLE001 - not a usable producer
        return None


_KDLCUDA, _KDLCUDA_MANAGED = 2, 13


def _kind(x):
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch"
    if hasattr(x, "__cuda_array_interface__"):
        return "cuda_array"
    dev = _dlpack_device(x) if hasattr(x, "__dlpack__") else None
    if dev is not None and dev[0] in (_KDLCUDA, _KDLCUDA_MANAGED):
        return "dlpack_cuda"
    import numpy as np
    if isinstance(x, np.ndarray):
        return "numpy"
    return None


def _is_torch_group(comm):
    torch = _torch()
    if torch is None:
        return False
    try:
        import torch.distributed as dist
        return isinstance(comm, dist.ProcessGroup)
    except (ImportError, AttributeError):
        return False


def _strides_ok(shape, strides):
    return all(n == 1 or s > 0 for n, s in zip(shape, strides))


# __cuda_array_interface__ typestrs per cpc dtype (bf16: its bit patterns, as numpy has
# no bfloat16: "<u2", or the opaque "<V2")
_CAI_TYPES = {N.DTYPE_FP32: ("<f4",), N.DTYPE_FP16: ("<f2",), N.DTYPE_BF16: ("<u2", "<V2"),
              N.DTYPE_U8: ("|u1", "|b1", "<u1")}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


# DLPack (code, bits) per cpc dtype: float, bfloat (or its bits as uint16), uint8/bool masks
_DL_TYPES = {N.DTYPE_FP32: ((2, 32),), N.DTYPE_FP16: ((2, 16),), N.DTYPE_BF16: ((4, 16), (1, 16)),
             N.DTYPE_U8: ((1, 8), (6, 8))}


def _dlpack_view(x, name, dtype_code, want_shape):
    """(pointer, element strides, capsule) of a DLPack producer of CUDA memory (JAX,
    CuPy, ...): the capsule is only read (not consumed, so its deleter runs when it is
    collected); keep it alive while the pointer is used."""
    capsule = x.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    addr = get(capsule, b"dltensor")
    t = ctypes.cast(addr, ctypes.POINTER(_DLManagedTensor)).contents.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if shape != tuple(want_shape):
        raise UsageError(f"{name}: shape {shape}, this rank's shard is {tuple(want_shape)}",
                         code="usage")
    code = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or code not in _DL_TYPES[dtype_code]:
        raise UsageError(f"{name}: DLPack dtype (code {code[0]}, {code[1]} bits, "
                         f"{t.dtype.lanes} lanes), the plan's dtype is "
                         f"{N.DTYPE_NAMES[dtype_code]}", code="usage")
    strides = ([t.strides[i] for i in range(t.ndim)] if t.strides
               else _contiguous_strides(shape))
    if any(n > 1 and s != c for n, s, c in zip(shape, strides, _contiguous_strides(shape))):
        raise UsageError(f"{name}: the CUDA backend takes contiguous device arrays (strides "
                         f"{tuple(strides)} elements)", code="usage")
    return (t.data or 0) + t.byte_offset, strides, capsule


def _contiguous_strides(shape):
    st, n = [], 1
    for d in reversed(shape):
        st.append(n)
        n *= d
    return list(reversed(st))


def _cuda_array_view(x, name, dtype_code, want_shape):
    """(pointer, element strides, readonly) of an object with __cuda_array_interface__
    (version 2 or 3: CuPy, Numba, PyTorch, ...): device memory for the CUDA backend,
    which takes it contiguous and as it is (no copy)."""
    cai = x.__cuda_array_interface__
    shape = tuple(cai["shape"])
    if shape != tuple(want_shape):
        raise UsageError(f"{name}: shape {shape}, this rank's shard is {tuple(want_shape)}",
                         code="usage")
    ts = cai["typestr"]
    if ts not in _CAI_TYPES[dtype_code]:
        want = N.DTYPE_NAMES[dtype_code]
        raise UsageError(f"{name}: __cuda_array_interface__ typestr {ts!r}, the plan's dtype "
                         f"{want} is {' or '.join(repr(t) for t in _CAI_TYPES[dtype_code])}",
                         code="usage")
    isz = int(ts[2:])
    strides = cai.get("strides")
    if strides is None:
        strides = _contiguous_strides(shape)
    else:
        if any(s % isz for s in strides):
            raise UsageError(f"{name}: strides {tuple(strides)} are not whole elements",
                             code="usage")
        strides = [s // isz for s in strides]
    if any(n > 1 and s != c for n, s, c in zip(shape, strides, _contiguous_strides(shape))):
        raise UsageError(f"{name}: the CUDA backend takes contiguous device arrays (strides "
                         f"{tuple(strides)} elements)", code="usage")
    ptr, readonly = cai["data"]
    return int(ptr or 0), strides, bool(readonly)


def _view(x, name, dtype_code, want_shape, device_kind, writable=False):
    """(_View) for array x as role `name`; raises cpc.UsageError for a wrong type,
    dtype, shape or device, and (writable: an output cpc writes) for a read-only
    numpy array (flags.writeable False: a read-only np.memmap, np.frombuffer of
    bytes, a broadcast view), which would otherwise be written through or crash
    the interpreter (SPEC 9)."""
    v = _View()
    v.copied = False
    v.readonly = False
    v.capsule = None
    kind = _kind(x)
    if kind is None and hasattr(x, "__dlpack__"):
        import numpy as np
        x = np.from_dlpack(x)
        kind = "numpy"
    if kind is None:
        raise UsageError(f"{name}: expected a numpy array or a torch tensor (or a device "
                         f"array with __cuda_array_interface__), got {type(x).__name__}",
                         code="usage")
    if kind in ("cuda_array", "dlpack_cuda"):
        if device_kind != "cuda":
            raise UsageError(f"{name}: a device array ("
                             f"{'__cuda_array_interface__' if kind == 'cuda_array' else 'DLPack'}"
                             "), but this rank's backend takes host memory (cpc.Attention(..., "
                             "backend='cuda') for device arrays)", code="usage")
        if kind == "cuda_array":
            ptr, strides, readonly = _cuda_array_view(x, name, dtype_code, want_shape)
        else:  # the capsule is kept with the view: the pointer is valid while it lives
            ptr, strides, v.capsule = _dlpack_view(x, name, dtype_code, want_shape)
            readonly = False
        v.readonly = readonly
        return _bind(v, x, ptr, strides, dtype_code, want_shape)
    if tuple(x.shape) != tuple(want_shape):
        raise UsageError(f"{name}: shape {tuple(x.shape)}, this rank's shard is "
                         f"{tuple(want_shape)}", code="usage")
    if writable and kind == "numpy" and not x.flags.writeable:
        raise UsageError(f"{name}: the array is read-only (flags.writeable is False, e.g. "
                         "a read-only np.memmap, np.frombuffer of bytes or a broadcast "
                         "view); cpc writes its output there: pass a writable array",
                         code="usage")
    if kind == "torch":
        torch = _torch()
        if dtype_code == N.DTYPE_U8:
            if x.dtype not in (torch.bool, torch.uint8):
                raise UsageError(f"{name}: dtype {x.dtype}, a mask is torch.bool or "
                                 "torch.uint8 (1 = the key takes part)", code="usage")
        else:
            want = getattr(torch, _TORCH_DTYPES[N.DTYPE_NAMES[dtype_code]])
            if x.dtype != want:
                alt = _dtype_name_torch(x.dtype)
                alt = (f" or compile the plan with model.dtype {alt}"
                       if alt in ("bf16", "fp16", "fp32") else
                       " (cpc runs bf16, fp16 and fp32)")
                raise UsageError(f"{name}: dtype {x.dtype}, the plan's dtype is "
                                 f"{N.DTYPE_NAMES[dtype_code]} ({want}): convert it with "
                                 f".to({want}){alt}", code="usage")
        is_cuda = x.device.type == "cuda"
        if is_cuda != (device_kind == "cuda"):
            raise UsageError(f"{name}: a {x.device.type} tensor, but this rank's backend "
                             f"takes {'device' if device_kind == 'cuda' else 'host'} memory "
                             "(cpc.Attention(..., backend='cuda') for CUDA tensors)",
                             code="usage")
        if not _strides_ok(x.shape, x.stride()) or (is_cuda and not x.is_contiguous()):
            # (the CUDA backend binds device tensors as they are: contiguous ones)
            x = x.contiguous()
            v.copied = True
        ptr, strides = x.data_ptr(), list(x.stride())
    else:
        import numpy as np
        if device_kind == "cuda":
            raise UsageError(f"{name}: a numpy array is host memory; the CUDA backend takes "
                             "CUDA tensors", code="usage")
        if dtype_code == N.DTYPE_U8:
            if x.dtype not in (np.bool_, np.uint8):
                raise UsageError(f"{name}: dtype {x.dtype}, a mask is bool or uint8 "
                                 "(1 = the key takes part)", code="usage")
        else:
            pname = N.DTYPE_NAMES[dtype_code]
            want = np.dtype(_NUMPY_DTYPES[pname])
            if x.dtype != want:
                extra = (" (numpy has no bfloat16: pass the bf16 bit patterns as uint16, "
                         "e.g. cpc.to_bf16(array), or a torch.bfloat16 tensor)"
                         if pname == "bf16" else "")
                raise UsageError(f"{name}: dtype {x.dtype}, the plan's dtype is {pname}: "
                                 f"pass {want}{extra}", code="usage")
        isz = x.itemsize
        if (not _strides_ok(x.shape, x.strides) or any(s % isz for s in x.strides)
                or not x.flags.aligned):
            x = np.ascontiguousarray(x)
            v.copied = True
        ptr, strides = x.ctypes.data, [s // isz for s in x.strides]
    return _bind(v, x, ptr, strides, dtype_code, want_shape)


def _bind(v, x, ptr, strides, dtype_code, want_shape):
    """v with its cpc_tensor (pointer, dtype, shape, element strides) filled and x
    kept alive with it; returns v."""
    t = N.Tensor()
    t.data = ptr
    t.dtype = dtype_code
    t.ndim = len(want_shape)
    for i, n in enumerate(want_shape):
        t.shape[i] = n
        t.strides[i] = strides[i]
    v.t, v.keep = t, x
    return v


def _dtype_name_torch(dt):
    return {"torch.bfloat16": "bf16", "torch.float16": "fp16",
            "torch.float32": "fp32"}.get(str(dt), str(dt))


def _empty_like_kind(kind, ref, shape, plan_dtype, lse=False, what="out"):
    if kind in ("cuda_array", "dlpack_cuda"):
        raise UsageError(f"device arrays (__cuda_array_interface__, DLPack): pass {what}= (a writable "
                         f"device array of shape {tuple(shape)}); cpc allocates only torch and "
                         "numpy outputs", code="usage")
    if kind == "torch":
        torch = _torch()
        dt = torch.float32 if lse else getattr(torch, _TORCH_DTYPES[plan_dtype])
        return torch.empty(shape, dtype=dt, device=ref.device)
    import numpy as np
    return np.empty(shape, dtype=np.float32 if lse else _NUMPY_DTYPES[plan_dtype])


_autograd_function = None


def _records_grad(artifact, q, k, v):
    """Whether a call on q, k, v is recorded by torch autograd (a training artifact,
    grad mode on, one of them a tensor that requires grad).  An inference artifact
    given such tensors raises cpc.UsageError: its output would silently carry no
    gradient."""
    torch = _torch()
    wants = (torch is not None and torch.is_grad_enabled()
             and any(isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v)))
    if wants and not artifact.trains:
        raise UsageError("q/k/v require grad but this artifact does not train (its plan's "
                         "input.mode is inference): the output would carry no gradient",
                         code="usage", hint="compile the plan with input.mode: training "
                         "(cpc.from_diffusers(..., mode='training')), or call under "
                         "torch.no_grad() / on detached tensors")
    return wants and artifact.trains


def _function():
    """cpc's torch.autograd.Function (made on first use: torch is optional), for an
    Attention (one rank) or a LocalWorld (global tensors, every rank a thread).
    forward: their forward, keeping out and the saved LSE (cpc_rank_saved_lse: the
    layout the backward takes, for every variant); backward: their backward with the
    incoming gradient of out (cpc_rank_backward, collective over the world)."""
    global _autograd_function
    if _autograd_function is not None:
        return _autograd_function
    torch = _torch()

    class AttentionFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, att, mask, q, k, v):
            with torch.no_grad():
                out, saved = att._train_forward(q, k, v, mask)
            ctx.att, ctx.mask, ctx.saved = att, mask, saved
            ctx.save_for_backward(q, k, v, out)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out = ctx.saved_tensors
            dq, dk, dv = ctx.att._train_backward(q, k, v, out, ctx.saved, dout.contiguous(),
                                                 ctx.mask)
            return None, None, dq, dk, dv

    _autograd_function = AttentionFunction
    return AttentionFunction


def _run_threads(P, run, errs):
    """run(r) for r in 1..P-1 in threads and r = 0 here; re-raises the first error."""
    threads = [threading.Thread(target=run, args=(r,)) for r in range(1, P)]
    for t in threads:
        t.start()
    run(0)
    for t in threads:
        t.join()
    for e in errs:
        if e is not None:
            raise e


def _options(backend, device, timeout_s, stream=None):
    L = N.lib()
    if backend not in N.BACKENDS:
        raise UsageError(f"backend {backend!r}: one of auto, cpu, cuda", code="usage")
    o = N.RankOptions()
    L.cpc_rank_options_init(ctypes.byref(o), ctypes.sizeof(o))
    o.backend = N.BACKENDS[backend]
    if device is not None:
        o.device = int(device)
    if timeout_s is not None:
        o.timeout_s = float(timeout_s)
    if stream is not None:
        # a cudaStream_t handle: an int, or a torch.cuda.Stream / CuPy stream
        h = getattr(stream, "cuda_stream", getattr(stream, "ptr", stream))
        o.cuda_stream = int(h) or None
    return o


class LocalWorld:
    """An in-process world: every rank of the artifact is a thread of this process
    (libcpc's local transport).  `world.rank(r)` is rank r's cpc.Attention; `world(q,
    k, v)` takes GLOBAL tensors, runs every rank in its own thread and returns the
    global output (a convenience for tests and single-machine use)."""

    def __init__(self, artifact, backend="auto", device=None, timeout_s=None):
        L = N.lib()
        self.artifact = artifact
        # With cfg_degree x tp_degree > 1 every (c, t) group has its own R x U world
        # (libcpc's rank.h, THE OUTER AXES); rank r joins the world of its group.
        self._L = L
        self._ptrs = []
        self._ranks = []
        try:
            for _ in range(artifact.cfg_degree * artifact.tp_degree):
                w = ctypes.c_void_p()
                _check(L, L.cpc_local_world_new(artifact._ptr, ctypes.byref(w)))
                self._ptrs.append(w.value)
            for r in range(artifact.world_size):
                self._ranks.append(Attention(artifact, rank=r, world=self, backend=backend,
                                             device=device, timeout_s=timeout_s))
        except BaseException:
            self.close()
            raise

    def rank(self, r):
        return self._ranks[r]

    @property
    def _ptr(self):
        return self._ptrs[0] if self._ptrs else None

    def _world_of(self, rank):
        """The world of rank `rank`'s (c, t) group: c = rank // (P / C), t = rank % T."""
        a = self.artifact
        C, T = a.cfg_degree, a.tp_degree
        c, t = rank // (a.world_size // C), rank % T
        return self._ptrs[c * T + t]

    def __len__(self):
        return len(self._ranks)

    def __call__(self, q, k, v, mask=None, return_lse=False):
        """The forward on GLOBAL tensors.  Training artifacts with torch tensors that
        require grad: recorded by autograd (one Function for the whole world; its
        backward runs every rank's backward in threads, LocalWorld.backward)."""
        if _records_grad(self.artifact, q, k, v):
            if return_lse:
                raise UsageError("return_lse with autograd: call the world without grad for the "
                                 "LSE", code="usage")
            return _function().apply(self, mask, q, k, v)
        return self._forward(q, k, v, mask, None, None, return_lse)

    def _train_forward(self, q, k, v, mask):
        """(global out, [each rank's saved LSE]) for the autograd Function."""
        a = self.artifact
        P = a.world_size
        res, errs = [None] * P, [None] * P

        def run(r):
            try:
                att = self._ranks[r]
                o = att._forward(a.shard(q, r, "q"), a.shard(k, r, "k"), a.shard(v, r, "v"),
                                 None if mask is None else a.shard(mask, r, "mask"), None, None,
                                 False)
                res[r] = (o, att.saved_lse(like=o))
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errs[r] = e
        _run_threads(P, run, errs)
        return a.gather([x[0] for x in res], "out"), [x[1] for x in res]

    def _train_backward(self, q, k, v, out, saved, dout, mask):
        return self.backward(q, k, v, out, saved, dout, mask=mask)

    def _forward(self, q, k, v, mask, out, lse, return_lse):
        if out is not None or lse is not None:
            raise UsageError("LocalWorld takes no out= / lse=", code="usage")
        a = self.artifact
        P = a.world_size
        res = [None] * P
        errs = [None] * P

        def run(r):
            try:
                att = self._ranks[r]
                res[r] = att._forward(a.shard(q, r, "q"), a.shard(k, r, "k"),
                                      a.shard(v, r, "v"),
                                      None if mask is None else a.shard(mask, r, "mask"),
                                      None, None, return_lse)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errs[r] = e

        threads = [threading.Thread(target=run, args=(r,)) for r in range(1, P)]
        for t in threads:
            t.start()
        run(0)
        for t in threads:
            t.join()
        for e in errs:
            if e is not None:
                raise e
        if return_lse:
            return a.gather([x[0] for x in res], "out"), a.gather([x[1] for x in res], "lse")
        return a.gather(res, "out")

    def backward(self, q, k, v, out, lse, dout, mask=None, grad_dtype=None):
        """The backward on GLOBAL tensors (out and lse as `world(q, k, v,
        return_lse=True)` returned them, dout like out): every rank in its own thread
        (Attention.backward), the global (dq, dk, dv) gathered.  lse may also be None
        (each rank's last forward's LSE: ulysses and unified, whose forward cannot
        return it) or a list of each rank's saved LSE (Attention.saved_lse)."""
        a = self.artifact
        P = a.world_size
        res = [None] * P
        errs = [None] * P

        def run(r):
            try:
                lr = (None if lse is None else lse[r] if isinstance(lse, (list, tuple))
                      else a.shard(lse, r, "lse"))
                res[r] = self._ranks[r].backward(
                    a.shard(q, r, "q"), a.shard(k, r, "k"), a.shard(v, r, "v"),
                    a.shard(out, r, "out"), lr, a.shard(dout, r, "dout"),
                    mask=None if mask is None else a.shard(mask, r, "mask"),
                    grad_dtype=grad_dtype)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errs[r] = e

        threads = [threading.Thread(target=run, args=(r,)) for r in range(1, P)]
        for t in threads:
            t.start()
        run(0)
        for t in threads:
            t.join()
        for e in errs:
            if e is not None:
                raise e
        return tuple(a.gather([x[i] for x in res], n) for i, n in enumerate(("dq", "dk", "dv")))

    def close(self):
        for r in self._ranks:
            r.close()
        self._ranks = []
        ptrs, self._ptrs = self._ptrs, []
        for ptr in ptrs:
            if ptr:
                self._L.cpc_local_world_free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _mpi_comm_checked(comm):
    """mpi4py's MPI module, `comm` being one of its communicators (else cpc.UsageError)."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise UsageError(f"comm given but mpi4py cannot be imported: {e}",
                         code="usage") from e
    if not isinstance(comm, MPI.Comm):
        raise UsageError(f"comm must be an mpi4py communicator or a torch.distributed "
                         f"ProcessGroup, not {type(comm).__name__}", code="usage")
    return MPI


class Attention:
    """One rank of a context-parallel attention layer, in this process.

        att = cpc.Attention(artifact, comm=MPI.COMM_WORLD)   # this process's rank
        out = att(q, k, v)                    # this rank's shards in, its output out
        out, lse = att(q, k, v, return_lse=True)

    comm: None (a world of size 1), an mpi4py communicator or a torch.distributed
    ProcessGroup (torchrun) of size world_size.  transport: "auto" (default): with
    backend="cuda" and a comm, NCCL between the GPUs, bootstrapped from comm (rank 0
    makes the NCCL unique id, comm broadcasts it; see cpc/_nccl.py: a rank without a
    GPU or NCCL makes every rank raise cpc.UnsupportedError saying what to do); with
    host tensors, comm's own transport: libcpc's MPI rank on an mpi4py communicator's
    handle (cpc duplicates it; its traffic never uses the caller's communicator), or
    the group's point-to-point ops (gloo) for a ProcessGroup.  "nccl" insists on
    NCCL, "mpi" keeps the MPI transport for device tensors (staged through host
    memory), "torch" the group's own ops (host tensors only).  device (CUDA): default
    torch's current device, else the launcher's local rank (LOCAL_RANK, ...).  rank:
    defaults to comm's rank (0 without comm).  world: a cpc.LocalWorld (rank threads; LocalWorld makes these).
    backend: "auto" (CPU unless NCCL), "cpu" or "cuda": then the tensors are device
    memory, contiguous: torch CUDA tensors (outputs allocated by torch on their
    device; torch's current stream is synchronised first), or any object with
    __cuda_array_interface__ (CuPy, Numba, ...; pass out= / lse= / dq= ... as device
    arrays: cpc allocates no device memory itself); stream: the cudaStream_t (an int or
    an object with .cuda_stream) cpc waits on before reading them.  timeout_s:
    the stall limit in seconds (default 600; negative: none): a wait of a forward or
    backward longer than that (a peer failed or never called) raises
    cpc.RuntimeError (under MPI the job is then aborted); after an error of your own
    on one rank, cpc.abort(reason) / att.abort(reason) ends the peers at once.

    A call takes this rank's shards (numpy arrays or torch tensors, BSHD, the plan's
    dtype; numpy bf16 as uint16 bit patterns) and returns the output shard of the
    same type.  Inputs are passed to libcpc without a copy whenever cpc can read
    their layout (any positive strides); `last_copies` names the inputs of the last
    call that had to be copied.  Every rank of the world must call it for each
    layer, in the same order (it is collective).  Errors are exceptions (cpc.Error);
    a wrong shape, dtype or device is refused before anything runs and leaves the
    rank usable.  Call close() (or use `with`) to destroy the rank: collective for
    MPI ranks."""

    def __init__(self, artifact, rank=None, comm=None, backend="auto", *, world=None,
                 device=None, timeout_s=None, stream=None, transport="auto"):
        L = N.lib()
        self.artifact = artifact
        self._L = L
        self._ptr = None
        self._own_world = None
        self._comm = comm
        self._p2p = None
        self.last_copies = []
        self.device_kind = "cuda" if backend == "cuda" else "cpu"
        opts = _options(backend, device, timeout_s, stream)
        out = ctypes.c_void_p()
        if comm is not None and world is not None:
            raise UsageError("pass comm or world, not both", code="usage")
        if transport not in ("auto", "nccl", "torch", "mpi"):
            raise UsageError(f"transport {transport!r}: one of auto, nccl, torch, mpi",
                             code="usage")
        kind = None if comm is None else "torch" if _is_torch_group(comm) else "mpi"
        if transport == "nccl" and (comm is None or backend != "cuda"):
            raise UsageError("transport='nccl' needs comm= (a torch.distributed group or an "
                             "mpi4py communicator) and backend='cuda' (device tensors)",
                             code="usage")
        if transport in ("torch", "mpi") and kind is not None and kind != transport:
            raise UsageError(f"transport={transport!r} but comm is "
                             f"{'a torch.distributed group' if kind == 'torch' else 'not a torch.distributed group'}",
                             code="usage")
        if kind is not None and backend == "cuda" and transport in ("auto", "nccl"):
            # device tensors over a launcher's group: NCCL between the GPUs, bootstrapped
            # from the group (cpc/_nccl.py: rank 0's unique id, broadcast by the group)
            if kind == "mpi":
                _mpi_comm_checked(comm)
            from ._nccl import create_rank as _nccl_rank
            self._ptr, self.rank = _nccl_rank(artifact, comm, kind, rank, opts, device)
            self.transport = "nccl"
        elif kind == "torch":
            # a torch.distributed ProcessGroup (torchrun): its point-to-point ops carry
            # cpc's traffic (libcpc's callback transport, cpc/_torchdist.py)
            from ._torchdist import create_rank
            if backend == "cuda":
                raise UsageError("a torch.distributed group's own point-to-point ops carry "
                                 "host memory only (backend='cpu'); device tensors go over "
                                 "NCCL (transport='auto' or 'nccl')", code="usage")
            ptr, self._p2p, crank = create_rank(artifact, comm, opts)
            if rank is not None and rank != crank:
                L.cpc_rank_free(ptr)
                raise UsageError(f"rank {rank} given, but this process is rank {crank} of "
                                 "the group", code="usage")
            self.transport, self.rank, self._ptr = "torch.distributed", crank, ptr
        elif comm is not None:
            self.transport = "mpi"
            MPI = _mpi_comm_checked(comm)
            size, crank = comm.Get_size(), comm.Get_rank()
            if size != artifact.world_size:
                raise UsageError(f"the communicator has {size} processes but the plan's "
                                 f"world_size is {artifact.world_size} (C x T x R x U = "
                                 f"{artifact.cfg_degree} x {artifact.tp_degree} x "
                                 f"{artifact.ring_degree} x {artifact.ulysses_degree})",
                                 code="usage")
            if rank is not None and rank != crank:
                raise UsageError(f"rank {rank} given, but this process is rank {crank} of "
                                 "the communicator", code="usage")
            if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
                raise UsageError("MPI was initialised below MPI_THREAD_SERIALIZED; libcpc "
                                 "needs at least that (mpi4py's default is "
                                 "THREAD_MULTIPLE)", code="usage")
            if not L.cpc_have_mpi():
                from ._errors import UnsupportedError
                raise UnsupportedError(f"this libcpc ({N.library_path()}) was built without "
                                       "MPI", code="unsupported")
            self.rank = crank
            handle = ctypes.c_void_p(MPI._addressof(comm))
            _check(L, L.cpc_rank_new_mpi(artifact._ptr, handle, ctypes.byref(opts),
                                            ctypes.byref(out)))
            self._ptr = out.value
            global _atexit_registered
            _mpi_ranks.append(weakref.ref(self))
            if not _atexit_registered:
                atexit.register(_destroy_mpi_ranks)
                _atexit_registered = True
        else:
            self.transport = "local"
            if world is None:
                if artifact.world_size != 1:
                    raise UsageError(f"the plan's world_size is {artifact.world_size}: pass "
                                     "comm= (an mpi4py communicator of that size) or use "
                                     "cpc.LocalWorld for rank threads", code="usage")
                w = ctypes.c_void_p()
                _check(L, L.cpc_local_world_new(artifact._ptr, ctypes.byref(w)))
                self._own_world = w.value
                wptr = w.value
                rank = 0 if rank is None else rank
            else:
                wptr = world._world_of(rank) if isinstance(rank, int) and \
                    0 <= rank < artifact.world_size else world._ptr
                self._world = world
            if not isinstance(rank, int) or not 0 <= rank < artifact.world_size:
                raise UsageError(f"rank {rank!r} is out of range: the world has "
                                 f"{artifact.world_size} ranks", code="usage")
            self.rank = rank
            st = L.cpc_rank_new_local(artifact._ptr, wptr, rank, ctypes.byref(opts),
                                         ctypes.byref(out))
            if st and self._own_world:
                L.cpc_local_world_free(self._own_world)
                self._own_world = None
            _check(L, st)
            self._ptr = out.value
        a = artifact
        self._shapes = {r: a.shard_shape(self.rank, r) for r in ("q", "k", "v", "out", "lse")}
        if a.key_padding:
            self._shapes["mask"] = a.shard_shape(self.rank, "mask")
        self._code = _CODES[a.dtype]

    @property
    def world_size(self):
        return self.artifact.world_size

    @property
    def allocated_bytes(self):
        """Bytes libcpc allocated for this rank at creation (nothing is allocated later)."""
        return self._L.cpc_rank_allocated_bytes(self._ptr)

    def shard_shape(self, role="q"):
        return self._shapes[role]

    def __call__(self, q, k, v, mask=None, *, out=None, lse=None, return_lse=False):
        """One attention forward on this rank's shards; see the class docstring.
        out / lse: optional preallocated outputs (then nothing is allocated).

        Training: for an artifact that trains (a `mode: training` plan) and torch
        tensors of which one requires grad (with grad mode on), the call is a
        torch.autograd.Function: the output carries a grad_fn whose backward runs
        cpc_rank_backward (collective: every rank of the world must run its backward
        for this layer, in the same order as the forwards)."""
        if self._ptr is None:
            raise UsageError("this rank is closed", code="usage")
        if _records_grad(self.artifact, q, k, v):
            if out is not None or lse is not None or return_lse:
                raise UsageError("out= / lse= / return_lse cannot be given when autograd records "
                                 "the call (call without grad for the LSE)", code="usage")
            return _function().apply(self, mask, q, k, v)
        return self._forward(q, k, v, mask, out, lse, return_lse)

    def _forward(self, q, k, v, mask, out, lse, return_lse):
        if self._ptr is None:
            raise UsageError("this rank is closed", code="usage")
        a, dk = self.artifact, self.device_kind
        vq = _view(q, "q", self._code, self._shapes["q"], dk)
        kind = _kind(vq.keep)
        vk = _view(k, "k", self._code, self._shapes["k"], dk)
        vv = _view(v, "v", self._code, self._shapes["v"], dk)
        if _kind(vk.keep) != kind or _kind(vv.keep) != kind:
            raise UsageError("q, k and v must all be numpy arrays or all torch tensors",
                             code="usage")
        vm = None
        if a.key_padding:
            if mask is None:
                raise UsageError("the plan has mask: key_padding: pass mask= (bool or uint8 "
                                 f"{self._shapes['mask']}, 1 = the key takes part)",
                                 code="usage")
            vm = _view(mask, "mask", N.DTYPE_U8, self._shapes["mask"], dk)
        elif mask is not None:
            raise UsageError("a mask was given but the plan's mask is "
                             f"{'causal' if a.causal else 'none'} (key padding needs "
                             "input.mask: key_padding in the plan)", code="usage")
        if out is None:
            out = _empty_like_kind(kind, vq.keep, self._shapes["out"], a.dtype)
        vo = _view(out, "out", self._code, self._shapes["out"], dk, writable=True)
        vl = None
        if return_lse or lse is not None:
            if lse is None:
                lse = _empty_like_kind(kind, vq.keep, self._shapes["lse"], a.dtype, lse=True,
                                       what="lse")
            vl = _view(lse, "lse", N.DTYPE_FP32, self._shapes["lse"], dk, writable=True)
        if vo.readonly or (vl is not None and vl.readonly):
            raise UsageError("out / lse: a read-only device array", code="usage")
        if vo.copied or (vl is not None and vl.copied):
            raise UsageError("out / lse must be writable in place (positive strides)",
                             code="usage")
        self.last_copies = [n for n, x in (("q", vq), ("k", vk), ("v", vv), ("mask", vm))
                            if x is not None and x.copied]
        if dk == "cuda" and kind == "torch":
            torch = _torch()
            torch.cuda.current_stream(vq.keep.device).synchronize()
        st = self._L.cpc_rank_forward(self._ptr, ctypes.byref(vq.t), ctypes.byref(vk.t),
                                      ctypes.byref(vv.t),
                                      None if vm is None else ctypes.byref(vm.t),
                                      ctypes.byref(vo.t),
                                      None if vl is None else ctypes.byref(vl.t))
        _check(self._L, st)
        return (out, lse) if (return_lse or vl is not None) else out

    def backward(self, q, k, v, out, lse, dout, mask=None, *, dq=None, dk=None, dv=None,
                 grad_dtype=None):
        """One attention backward (SPEC section 10) on this rank's shards: returns
        (dq, dk, dv), the gradients of the loss whose gradient w.r.t. out is `dout`.

        q, k, v, mask: what the forward took; out and lse: what it returned (call it
        with return_lse=True and keep both); dout: this rank's shard of dL/dout, shape
        and dtype of out.  dq, dk, dv: optional preallocated outputs (shapes of q, k,
        v; written in place); else new arrays of the inputs' type, in the plan's dtype,
        or float32 with grad_dtype="fp32" (the unrounded fp32 accumulators).  Needs an
        artifact that trains (compiled from a `mode: training` plan): else
        cpc.UnsupportedError.  Collective, like the forward.  Wrong shapes / dtypes are
        refused before anything is written."""
        if self._ptr is None:
            raise UsageError("this rank is closed", code="usage")
        a, dk_ = self.artifact, self.device_kind
        if grad_dtype not in (None, "fp32", a.dtype):
            raise UsageError(f"grad_dtype {grad_dtype!r}: None (the plan's {a.dtype}) or "
                             "'fp32'", code="usage")
        gname = grad_dtype or a.dtype
        gcode = _CODES[gname]
        views = {}
        for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)):
            views[name] = _view(x, name, self._code, self._shapes_of(name), dk_)
        kind = _kind(views["q"].keep)
        if any(_kind(x.keep) != kind for x in views.values()):
            raise UsageError("q, k, v, out and dout must all be numpy arrays or all torch "
                             "tensors", code="usage")
        vl = None
        if lse is not None:
            n1 = self._L.cpc_rank_saved_lse_elements(self._ptr)
            one_d = len(getattr(lse, "shape", ())) == 1
            vl = _view(lse, "lse", N.DTYPE_FP32, (n1,) if one_d else self._shapes["lse"], dk_)
        vm = None
        if a.key_padding:
            if mask is None:
                raise UsageError("the plan has mask: key_padding: pass the forward's mask=",
                                 code="usage")
            vm = _view(mask, "mask", N.DTYPE_U8, self._shapes["mask"], dk_)
        elif mask is not None:
            raise UsageError("a mask was given but the plan has no key padding",
                             code="usage")
        grads = []
        for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
            if g is None:
                g = _empty_like_kind(kind, views["q"].keep, self._shapes_of(name), gname,
                                     what=name)
            vg = _view(g, name, gcode, self._shapes_of(name), dk_, writable=True)
            if vg.readonly:
                raise UsageError(f"{name}: a read-only device array", code="usage")
            if vg.copied:
                raise UsageError(f"{name} must be writable in place (positive strides)",
                                 code="usage")
            grads.append((g, vg))
        if dk_ == "cuda" and kind == "torch":
            torch = _torch()
            torch.cuda.current_stream(views["q"].keep.device).synchronize()
        st = self._L.cpc_rank_backward(
            self._ptr, *(ctypes.byref(views[n].t) for n in ("q", "k", "v")),
            None if vm is None else ctypes.byref(vm.t), ctypes.byref(views["out"].t),
            None if vl is None else ctypes.byref(vl.t), ctypes.byref(views["dout"].t),
            *(ctypes.byref(vg.t) for _, vg in grads))
        _check(self._L, st)
        return tuple(g for g, _ in grads)

    def saved_lse(self, like=None, out=None):
        """The LSE of this rank's last forward as the backward takes it (1-D float32,
        any variant; cpc_rank_saved_lse): keep it with out to call backward(..., lse=
        saved) later, after other forwards on this rank.  like: an array whose type
        (numpy or torch, device) the result takes (default numpy; a CUDA rank: torch
        on the like's device).  out: a float32 array of that many elements to write
        instead (a device array for a CUDA rank)."""
        n = self._L.cpc_rank_saved_lse_elements(self._ptr)
        if out is not None:
            v = _view(out, "saved lse", N.DTYPE_FP32, (n,), self.device_kind)
            _check(self._L, self._L.cpc_rank_saved_lse(self._ptr, ctypes.c_void_p(v.t.data), n))
            return out
        if self.device_kind == "cuda" and (like is None or _kind(like) != "torch"):
            raise UsageError("saved_lse on a CUDA rank: pass like= (a torch CUDA tensor) or "
                             "out= (a device array)", code="usage")
        if like is not None and _kind(like) == "torch":
            buf = _torch().empty(n, dtype=_torch().float32, device=like.device)
            ptr = buf.data_ptr()
        else:
            import numpy as np
            buf = np.empty(n, dtype=np.float32)
            ptr = buf.ctypes.data
        _check(self._L, self._L.cpc_rank_saved_lse(self._ptr, ctypes.c_void_p(ptr), n))
        return buf

    def _train_forward(self, q, k, v, mask):
        out = self._forward(q, k, v, mask, None, None, False)
        return out, self.saved_lse(like=out)

    def _train_backward(self, q, k, v, out, saved, dout, mask):
        return self.backward(q, k, v, out, saved, dout, mask=mask)

    def _shapes_of(self, role):
        if role not in self._shapes:
            self._shapes[role] = self.artifact.shard_shape(self.rank, role)
        return self._shapes[role]

    def abort(self, reason="aborted by the caller"):
        """Ends this rank's world after an error outside cpc, so that no peer waits
        for this rank until the stall limit (timeout_s): a local world is failed
        (every rank's pending and later calls raise cpc.RuntimeError naming `reason`);
        an MPI rank prints the reason and calls MPI_Abort, ending every process of the
        job with exit status 3 (it does not return).  cpc.abort does this for every
        live MPI rank of the process; see also the stall limit (timeout_s)."""
        if self._ptr is None:
            raise UsageError("this rank is closed", code="usage")
        _check(self._L, self._L.cpc_rank_abort(self._ptr, str(reason).encode()))

    def close(self):
        """Destroys the rank (collective for an MPI rank)."""
        ptr, self._ptr = self._ptr, None
        if ptr:
            self._L.cpc_rank_free(ptr)
        w, self._own_world = self._own_world, None
        if w:
            self._L.cpc_local_world_free(w)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self):
        return (f"<cpc.Attention rank {self.rank}/{self.world_size} {self.transport} "
                f"{self.device_kind} {self.artifact.variant}>")
