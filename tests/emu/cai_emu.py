"""cpc.Attention(..., backend="cuda") on device arrays that expose
__cuda_array_interface__ (and the same memory through DLPack, kDLCUDA), forward and
backward, on the CPU emulator of CUDA.

Run by tests/cli/cuda_emu.sh with the fake CUDA runtime first on LD_LIBRARY_PATH
(libcpc and this script's ctypes both bind libcudart.so.13 to it), CPC_LIBRARY the
build's libcpc.so, PYTHONPATH the package's sources.  DevArray is a minimal device
array (the protocol's version 3 fields over cudaMalloc memory), standing in for a
CuPy array or a torch CUDA tensor, which a machine without a GPU cannot have.

Every rank of a ring world (2 ranks, threads of this process, cpc.LocalWorld with
backend="cuda") takes its shards as device arrays; the gathered output and LSE are
checked against a float64 numpy reference, the gradients (fp32, lse=None: the
saved LSE of the rank's last forward) against the float64 reference backward;
a strided device array and a host array on a CUDA rank are refused
(cpc.UsageError).  Exit 0 when every check passes."""
import ctypes
import sys
import threading

import numpy as np

import cpc

cudart = ctypes.CDLL("libcudart.so.13")
cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
cudart.cudaFree.argtypes = [ctypes.c_void_p]
cudart.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
H2D, D2H = 1, 2


class DevArray:
    """Device memory with __cuda_array_interface__ (version 3)."""

    def __init__(self, shape, dtype, strides=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        p = ctypes.c_void_p()
        assert cudart.cudaMalloc(ctypes.byref(p), max(self.nbytes, 1)) == 0
        self.ptr, self.strides = p.value, strides

    @classmethod
    def of(cls, a):
        d = cls(a.shape, a.dtype)
        a = np.ascontiguousarray(a)
        assert cudart.cudaMemcpy(d.ptr, a.ctypes.data, d.nbytes, H2D) == 0
        return d

    def get(self):
        a = np.empty(self.shape, self.dtype)
        assert cudart.cudaMemcpy(a.ctypes.data, self.ptr, self.nbytes, D2H) == 0
        return a

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "version": 3, "strides": self.strides, "stream": None}

    def __del__(self):
        cudart.cudaFree(self.ptr)


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_DLTENSOR = b"dltensor"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLPackOnly:
    """A DevArray seen only through DLPack (kDLCUDA, device 0): as JAX arrays are."""

    def __init__(self, d):
        self.d, self._keep = d, []

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        shape = (ctypes.c_int64 * len(self.d.shape))(*self.d.shape)
        mt = _DLManagedTensor()
        mt.dl_tensor.data = self.d.ptr
        mt.dl_tensor.device_type, mt.dl_tensor.device_id = 2, 0
        mt.dl_tensor.ndim = len(self.d.shape)
        mt.dl_tensor.dtype = _DLDataType(2, self.d.dtype.itemsize * 8, 1)
        mt.dl_tensor.shape = shape
        self._keep.append((mt, shape))
        return _capsule_new(ctypes.addressof(mt), _DLTENSOR, None)


def reference(q, k, v, dout, causal):
    """float64 attention (BSHD, GQA) and its backward: out, lse [B,H,S], dq, dk, dv."""
    q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    B, S, H, D = q.shape
    g = H // k.shape[2]
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    scale = 1.0 / np.sqrt(D)
    s = np.einsum("bshd,bthd->bhst", q, kk) * scale
    if causal:
        s = np.where(np.tril(np.ones((S, S), bool))[None, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    den = p.sum(-1, keepdims=True)
    p /= den
    out = np.einsum("bhst,bthd->bshd", p, vv)
    lse = (np.log(den) + m)[..., 0]
    do = np.einsum("bshd->bhsd", dout)
    dp = np.einsum("bhsd,bthd->bhst", do, vv)
    delta = (do * np.einsum("bshd->bhsd", out)).sum(-1, keepdims=True)
    ds = p * (dp - delta)
    dq = np.einsum("bhst,bthd->bshd", ds, kk) * scale
    dk = np.einsum("bhst,bshd->bthd", ds, q) * scale
    dv = np.einsum("bhst,bhsd->bthd", p, do)
    dk = dk.reshape(B, S, k.shape[2], g, D).sum(3)
    dv = dv.reshape(B, S, k.shape[2], g, D).sum(3)
    return out, lse, dq, dk, dv


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def main():
    fails = []
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else np.random.SeedSequence().entropy % 2**32
    rng = np.random.default_rng(seed)
    a = cpc.compile({"version": 1, "name": "cai-emu",
                     "model": {"heads": 4, "kv_heads": 2, "head_dim": 64, "dtype": "fp32"},
                     "input": {"tokens": 64, "mask": "causal", "mode": "training"},
                     "cluster": {"world_size": 2, "device": "cpu"},
                     "parallel": {"variant": "ring"}}, kernels=True)
    B, S, H, Hkv, D = a.batch, a.tokens, a.heads, a.kv_heads, a.head_dim
    q, dout = (rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((B, S, Hkv, D)).astype(np.float32) for _ in range(2))
    ref = reference(q, k, v, dout, causal=True)
    outs, lses, grads, errs = [None] * 2, [None] * 2, [None] * 2, [None] * 2
    with cpc.LocalWorld(a, backend="cuda", device=0) as w:
        def run(r):
            try:
                att = w.rank(r)
                dq_, dk_, dv_ = (DevArray.of(a.shard(x, r, role)) for x, role in
                                 ((q, "q"), (k, "k"), (v, "v")))
                dd = DevArray.of(a.shard(dout, r, "dout"))
                o = DevArray(att.shard_shape("out"), np.float32)
                lse = DevArray(att.shard_shape("lse"), np.float32)
                # refusals first (every rank, nothing runs): a host array, a strided array
                for bad in (a.shard(q, r), DevArray(dq_.shape, np.float32,
                                                    strides=(S * H * D * 8, H * D * 8, D * 4, 4))):
                    try:
                        att(bad, dk_, dv_, out=o)
                        fails.append(f"rank {r}: {type(bad).__name__} accepted")
                    except cpc.UsageError:
                        pass
                res = att(dq_, dk_, dv_, out=o, lse=lse)
                assert res[0] is o and res[1] is lse
                outs[r], lses[r] = o.get(), lse.get()
                # the same forward on DLPack views of the same memory: the same bits
                o2 = DevArray(att.shard_shape("out"), np.float32)
                att(DLPackOnly(dq_), DLPackOnly(dk_), DLPackOnly(dv_), out=DLPackOnly(o2))
                if not np.array_equal(o2.get(), outs[r]):
                    fails.append(f"rank {r}: the DLPack forward differs")
                gq = DevArray(att.shard_shape("q"), np.float32)
                gk, gv = (DevArray(att.shard_shape("k"), np.float32) for _ in range(2))
                got = att.backward(dq_, dk_, dv_, o, None, dd, dq=gq, dk=gk, dv=gv)
                assert got == (gq, gk, gv)
                grads[r] = (gq.get(), gk.get(), gv.get())
            except BaseException as e:  # noqa: BLE001 - reported below
                errs[r] = e
                att.abort(repr(e))
        ths = [threading.Thread(target=run, args=(r,)) for r in range(2)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
    for r, e in enumerate(errs):
        if e is not None:
            fails.append(f"rank {r}: {e!r}")
    if not fails:
        out = a.gather(outs)
        e_out = rel(out, ref[0])
        lse = a.gather(lses, "lse")
        e_lse = float(np.abs(lse - ref[1]).max())
        g = [a.gather([grads[r][i] for r in range(2)], role) for i, role in
             enumerate(("dq", "dk", "dv"))]
        e_g = [rel(g[i], ref[2 + i]) for i in range(3)]
        print(f"cai_emu: ring 2 fp32 on the CUDA backend (device arrays): out rel_err {e_out:.3g}, "
              f"lse max_err {e_lse:.3g}, dq {e_g[0]:.3g} dk {e_g[1]:.3g} dv {e_g[2]:.3g} "
              f"(seed {seed})")
        if not (e_out < 1e-5 and e_lse < 1e-4 and max(e_g) < 1e-5):
            fails.append("numbers out of tolerance (fp32: 1e-5)")
    for f in fails:
        print(f"FAIL: cai_emu: {f}", file=sys.stderr)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
