"""Issue 23 (robustness round three) from Python, numpy only: outputs that are not
ours to write (read-only out= / lse= / dq=: ValueError, never a write or a crash),
finite inputs that used to give Inf (bf16 v = 1e38), and from_diffusers on garbage
configs (ValueError naming the field, never a wrong plan, TypeError or
ZeroDivisionError)."""

import mmap

import numpy as np
import pytest

import cpc
from conftest import attention_ref, config, rel_err


def small(P=1, *, dtype="fp32", mode="inference", S=32, H=2, D=16):
    variant = "none" if P == 1 else "ring"
    return cpc.compile({"version": 1, "model": {"heads": H, "head_dim": D, "dtype": dtype},
                        "input": {"tokens": S, "mode": mode},
                        "cluster": {"world_size": P, "device": "cpu"},
                        "parallel": {"variant": variant}})


def qkv(a, rng):
    sh = (a.batch, a.tokens, a.heads, a.head_dim)
    return tuple(rng.standard_normal(sh).astype(np.float32) for _ in range(3))


def test_read_only_outputs_refused(rng, tmp_path):
    a = small()
    q, k, v = qkv(a, rng)
    shape = a.shard_shape(0, "out")
    n = int(np.prod(shape)) * 4
    with cpc.Attention(a) as att:
        good = att(q, k, v)
        # a view of an immutable bytes object: it used to be changed in place
        raw = bytes(n)
        ro = np.frombuffer(raw, dtype=np.float32).reshape(shape)
        with pytest.raises(ValueError, match="out: the array is read-only"):
            att(q, k, v, out=ro)
        assert raw == bytes(n)
        # a read-only np.memmap: it used to crash the interpreter (SIGSEGV)
        path = tmp_path / "out.bin"
        path.write_bytes(b"\x01" * n)
        mm = np.memmap(path, dtype=np.float32, mode="r", shape=shape)
        with pytest.raises(ValueError, match="read-only"):
            att(q, k, v, out=mm)
        del mm
        assert path.read_bytes() == b"\x01" * n
        # variants: a broadcast view, an array made read-only by its owner, a read-only
        # lse= (with a writable out=), a read-only mmap.mmap through np.frombuffer
        with pytest.raises(ValueError, match="read-only"):
            att(q, k, v, out=np.broadcast_to(np.float32(0), shape))
        frozen = np.zeros(shape, np.float32)
        frozen.setflags(write=False)
        with pytest.raises(ValueError, match="read-only"):
            att(q, k, v, out=frozen)
        assert not frozen.any()
        lse = np.zeros(a.shard_shape(0, "lse"), np.float32)
        lse.setflags(write=False)
        out = np.zeros(shape, np.float32)
        with pytest.raises(ValueError, match="lse: the array is read-only"):
            att(q, k, v, out=out, lse=lse)
        assert not lse.any() and not out.any()
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            with pytest.raises(ValueError, match="read-only"):
                att(q, k, v, out=np.frombuffer(m, dtype=np.float32).reshape(shape))
            m.close()
        # the rank is still usable, and a writable out= is written in place
        assert att(q, k, v, out=out) is out and np.array_equal(out, good)


def test_read_only_gradients_refused(rng):
    a = small(mode="training")
    q, k, v = qkv(a, rng)
    with cpc.Attention(a) as att:
        out, lse = att(q, k, v, return_lse=True)
        dout = rng.standard_normal(out.shape).astype(np.float32)
        dq = np.zeros(q.shape, np.float32)
        dk = np.zeros(k.shape, np.float32)
        dv = np.zeros(v.shape, np.float32)
        dk.setflags(write=False)
        with pytest.raises(ValueError, match="dk: the array is read-only"):
            att.backward(q, k, v, out, lse, dout, dq=dq, dk=dk, dv=dv)
        assert not dq.any() and not dk.any() and not dv.any()


def test_bf16_near_flt_max_is_finite():
    """bf16 v = 1e38 with uniform scores: the exact output is 1e38; P V used to
    overflow to Inf (libcpc and Python returned it silently).  Variant: fp32 v of
    +-3e38 with random scores on two ranks."""
    a = small(dtype="bf16")
    sh = (a.batch, a.tokens, a.heads, a.head_dim)
    z = cpc.to_bf16(np.zeros(sh, np.float32))
    v = cpc.to_bf16(np.full(sh, 1e38, np.float32))
    with cpc.Attention(a) as att:
        out = cpc.from_bf16(att(z, z, v))
    assert np.isfinite(out).all()
    assert np.array_equal(out, cpc.from_bf16(v))
    a = small(2)
    rng = np.random.default_rng()
    q, k, _ = qkv(a, rng)
    v = (np.sign(rng.standard_normal(q.shape)) * 3e38).astype(np.float32)
    with cpc.LocalWorld(a) as w:
        out = w(q, k, v)
    ref, _ = attention_ref(q, k, v)
    assert np.isfinite(out).all() and rel_err(out, ref) < 1e-5


FLUX = {"_class_name": "FluxTransformer2DModel", "num_attention_heads": 24,
        "attention_head_dim": 128, "num_layers": 19, "num_single_layers": 38, "patch_size": 1}


@pytest.mark.parametrize("pc,cfg,kw,match", [
    # the cases
    ({"ulysses_degree": 2, "ulysses_anything": "false"}, FLUX, {}, "ulysses_anything must be True or False"),
    ({"ring_degree": 2}, dict(FLUX, patch_size=[1.9, 2, 2]), {}, r"patch_size\[0\] must be an integer"),
    ({"ring_degree": 2}, dict(FLUX, num_layers="19"), {}, "num_layers must be an integer"),
    ({"ring_degree": 2}, dict(FLUX, _class_name=["FluxTransformer2DModel"]), {}, "_class_name must be a string"),
    ({"ring_degree": 2}, FLUX, {"vae_scale": 0}, "vae_scale must be >= 1"),
    # variants
    ({"ring_degree": 2, "ring_anything": 1}, FLUX, {}, "ring_anything must be True or False"),
    ({"ring_degree": 2, "convert_to_fp32": "yes"}, FLUX, {}, "convert_to_fp32 must be True or False"),
    ({"ring_degree": "2"}, FLUX, {}, "ring_degree must be an integer"),
    ({"ring_degree": 2, "rotate_method": ["p2p"]}, FLUX, {}, "rotate_method must be a string"),
    ({"ring_degree": 2}, dict(FLUX, num_attention_heads=True), {}, "num_attention_heads must be an integer"),
    ({"ring_degree": 2}, dict(FLUX, attention_head_dim=float("nan")), {}, "attention_head_dim must be an integer"),
    ({"ring_degree": 2}, dict(FLUX, num_single_layers=-1), {}, "num_single_layers must be >= 0"),
    ({"ring_degree": 2}, dict(FLUX, patch_size=2.5), {}, "patch_size must be an integer"),
    ({"ring_degree": 2}, FLUX, {"height": "1024"}, "height must be an integer"),
    ({"ring_degree": 2}, FLUX, {"batch": 0}, "batch must be >= 1"),
    ({"ring_degree": 2}, FLUX, {"text_tokens": 12.5}, "text_tokens must be an integer"),
])
def test_from_diffusers_garbage(pc, cfg, kw, match):
    kw = dict({"height": 1024, "width": 1024}, **kw)
    with pytest.raises(ValueError, match=match):
        cpc.from_diffusers(pc, cfg, **kw)


def test_from_diffusers_garbage_video():
    wan = config("wan2.1-t2v-14b")
    with pytest.raises(ValueError, match="vae_temporal must be >= 1"):
        cpc.from_diffusers({"ring_degree": 2}, wan, 832, 480, 81, vae_temporal=0)
    with pytest.raises(ValueError, match="num_frames must be an integer"):
        cpc.from_diffusers({"ring_degree": 2}, wan, 832, 480, "81")
    with pytest.raises(ValueError, match=r"patch_size\[1\] must be >= 1"):
        cpc.from_diffusers({"ring_degree": 2}, dict(wan, patch_size=[1, 0, 2]), 832, 480, 81)
    # what stays accepted: integral floats, numpy bools
    p = cpc.from_diffusers({"ring_degree": 2, "ring_anything": np.bool_(False)},
                           dict(wan, num_layers=40.0), 832, 480, 81)
    assert p["parallel"]["variant"] == "ring" and p["cluster"]["world_size"] == 2
    assert p["model"]["layers"] == 40
