"""cpc.Attention / cpc.LocalWorld on numpy arrays and torch tensors: every variant
against a float64 reference, dtypes, masks, cross-attention, GQA, strides without
copies, and errors as exceptions that leave the rank usable."""

import numpy as np
import pytest

import cpc
from conftest import attention_ref, rel_err

torch = pytest.importorskip("torch")


def plan(variant, P, *, dtype="fp32", H=4, Hkv=None, D=16, B=1, text=24, image=64,
         mask="none", kv=None):
    segs = [{"name": "text", "tokens": text}, {"name": "image", "tokens": image}]
    if mask == "causal":
        segs = [{"name": "seq", "tokens": text + image}]
    p = {"version": 1, "model": {"heads": H, "head_dim": D, "dtype": dtype},
         "input": {"batch": B, "segments": segs, "mask": mask},
         "cluster": {"world_size": P}, "parallel": {"variant": variant}}
    if Hkv:
        p["model"]["kv_heads"] = Hkv
    if kv:
        p["input"]["kv"] = {"tokens": kv}
    return cpc.compile(p)


def qkv(a, rng, dtype=np.float32):
    q = rng.standard_normal((a.batch, a.tokens, a.heads, a.head_dim)).astype(dtype)
    k = rng.standard_normal((a.batch, a.kv_tokens, a.kv_heads, a.head_dim)).astype(dtype)
    v = rng.standard_normal((a.batch, a.kv_tokens, a.kv_heads, a.head_dim)).astype(dtype)
    return q, k, v


VARIANTS = [("none", 1, 64), ("ring", 2, 64), ("ring", 4, 64), ("ulysses", 2, 64),
            ("ulysses", 4, 64), ("unified", 4, 64), ("ulysses_anything", 3, 61),
            ("ulysses_anything", 4, 61), ("ring_anything", 3, 61)]


@pytest.mark.parametrize("variant,P,image", VARIANTS, ids=[f"{v}{p}" for v, p, _ in VARIANTS])
def test_every_variant_numpy_fp32(variant, P, image, rng):
    a = plan(variant, P, image=image, B=2)
    q, k, v = qkv(a, rng)
    ref, lse_ref = attention_ref(q, k, v)
    with cpc.LocalWorld(a) as w:
        out = w(q, k, v)
        assert isinstance(out, np.ndarray) and out.dtype == np.float32
        assert rel_err(out, ref) < 1e-5
        if variant in ("none", "ring", "ring_anything"):
            out2, lse = w(q, k, v, return_lse=True)
            assert np.array_equal(out2, out)
            assert np.abs(lse - lse_ref).max() < 1e-4


def test_torch_fp32_bf16_fp16(rng):
    for dtype, tol in (("fp32", 1e-5), ("bf16", 1e-2), ("fp16", 2e-3)):
        a = plan("unified", 4, dtype=dtype)
        q, k, v = (torch.from_numpy(x) for x in qkv(a, rng))
        tdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        q, k, v = (x.to(tdt) for x in (q, k, v))
        ref, _ = attention_ref(*(x.float().numpy() for x in (q, k, v)))
        with cpc.LocalWorld(a) as w:
            out = w(q, k, v)
        assert isinstance(out, torch.Tensor) and out.dtype == tdt
        assert rel_err(out.float().numpy(), ref) < tol, dtype


def test_numpy_bf16_as_uint16_and_fp16(rng):
    a = plan("ring", 2, dtype="bf16")
    q, k, v = qkv(a, rng)
    bq, bk, bv = (cpc.to_bf16(x) for x in (q, k, v))
    # to_bf16 rounds as torch does
    assert np.array_equal(bq, torch.from_numpy(q).to(torch.bfloat16).view(torch.int16)
                          .numpy().view(np.uint16))
    ref, _ = attention_ref(*(cpc.from_bf16(x) for x in (bq, bk, bv)))
    with cpc.LocalWorld(a) as w:
        out = w(bq, bk, bv)
        assert out.dtype == np.uint16
        assert rel_err(cpc.from_bf16(out), ref) < 1e-2
        with pytest.raises(cpc.UsageError, match="uint16"):
            w.rank(0)(*(a.shard(x, 0, r) for x, r in ((q, "q"), (k, "k"), (v, "v"))))
    a16 = plan("ulysses", 2, dtype="fp16")
    h = [x.astype(np.float16) for x in qkv(a16, rng)]
    with cpc.LocalWorld(a16) as w:
        assert rel_err(w(*h), attention_ref(*h)[0]) < 2e-3


def test_key_padding_mask(rng):
    a = plan("ulysses", 4, mask="key_padding", B=2)
    q, k, v = qkv(a, rng)
    mask = rng.random((2, a.kv_tokens)) > 0.2
    mask[1, :] = False                 # every key of batch 1 masked: output 0, never NaN
    ref, _ = attention_ref(q, k, v, mask=mask)
    with cpc.LocalWorld(a) as w:
        out = w(q, k, v, mask=mask)
        assert np.isfinite(out).all() and not out[1].any()
        assert rel_err(out, ref) < 1e-5
        out_t = w(*(torch.from_numpy(x) for x in (q, k, v)), mask=torch.from_numpy(mask))
        assert rel_err(out_t.numpy(), ref) < 1e-5
        with pytest.raises(cpc.UsageError, match="key_padding"):
            w.rank(0)(a.shard(q, 0), a.shard(k, 0, "k"), a.shard(v, 0, "v"))


def test_causal_gqa_cross(rng):
    a = plan("ring", 4, mask="causal")       # zigzag layout: several runs per rank
    assert len(a.shard_runs(0)) == 2
    q, k, v = qkv(a, rng)
    with cpc.LocalWorld(a) as w:
        assert rel_err(w(q, k, v), attention_ref(q, k, v, causal=True)[0]) < 1e-5
    g = plan("ulysses", 2, H=8, Hkv=2)
    q, k, v = qkv(g, rng)
    with cpc.LocalWorld(g) as w:
        assert rel_err(w(q, k, v), attention_ref(q, k, v)[0]) < 1e-5
    c = plan("ulysses", 4, kv=40)
    q, k, v = qkv(c, rng)
    assert c.shard_shape(2, "k") == (1, 40, 4, 16)
    with cpc.LocalWorld(c) as w:
        assert rel_err(w(q, k, v), attention_ref(q, k, v)[0]) < 1e-5


def test_no_copies_for_strided_inputs(rng):
    """q, k, v as views of one packed [B, S, 3, H, D] projection (what a fused QKV
    linear gives): strided, passed to libcpc as they are; a negative stride needs a
    copy, and says so."""
    a = plan("none", 1, B=2)
    att = cpc.Attention(a)
    qkv_packed = rng.standard_normal((2, a.tokens, 3, 4, 16)).astype(np.float32)
    q, k, v = qkv_packed[:, :, 0], qkv_packed[:, :, 1], qkv_packed[:, :, 2]
    assert not q.flags.c_contiguous
    out = att(q, k, v)
    assert att.last_copies == []
    assert rel_err(out, attention_ref(q, k, v)[0]) < 1e-5
    tp = torch.from_numpy(qkv_packed)
    out_t = att(tp[:, :, 0], tp[:, :, 1], tp[:, :, 2])
    assert att.last_copies == [] and rel_err(out_t.numpy(), out) < 1e-6
    out2 = att(q[:, ::-1][:, ::-1], k, v)      # positive strides again: no copy
    assert att.last_copies == []
    rq = np.ascontiguousarray(q[:, ::-1])
    out3 = att(rq[:, ::-1], k, v)              # negative stride: copied
    assert att.last_copies == ["q"]
    assert np.array_equal(out3, out2)
    # a preallocated output is written in place and returned
    buf = np.empty_like(out)
    assert att(q, k, v, out=buf) is buf and np.array_equal(buf, out)
    att.close()


def test_errors_leave_the_rank_usable(rng):
    a = plan("none", 1)
    q, k, v = qkv(a, rng)
    with cpc.Attention(a) as att:
        with pytest.raises(cpc.UsageError, match="shape"):
            att(q[:, :10], k, v)
        with pytest.raises(cpc.UsageError, match="float64"):
            att(q.astype(np.float64), k, v)
        with pytest.raises(cpc.UsageError, match="numpy"):
            att(q, torch.from_numpy(k), v)
        with pytest.raises(cpc.UsageError, match="mask"):
            att(q, k, v, mask=np.ones((1, a.tokens), bool))
        with pytest.raises(cpc.UsageError, match="bfloat16"):
            att(*(torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v)))
        with pytest.raises(cpc.UsageError, match="numpy array or a torch tensor"):
            att(q.tolist(), k, v)
        assert rel_err(att(q, k, v), attention_ref(q, k, v)[0]) < 1e-5
    with pytest.raises(cpc.UsageError, match="closed"):
        att(q, k, v)
    with pytest.raises(cpc.UsageError, match="LocalWorld"):
        cpc.Attention(plan("ring", 2))
    with pytest.raises(cpc.UsageError, match="backend"):
        cpc.Attention(a, backend="tpu")


def test_unsupported_lse_is_an_exception(rng):
    a = plan("ulysses", 2)
    q, k, v = qkv(a, rng)
    with cpc.LocalWorld(a) as w:
        with pytest.raises(cpc.UnsupportedError):
            w(q, k, v, return_lse=True)
        assert rel_err(w(q, k, v), attention_ref(q, k, v)[0]) < 1e-5


def test_cfg_and_tp_axes(rng):
    """cfg_degree C x tp_degree T > 1 (SPEC section 1, "All four axes"): the world is
    C*T*R*U ranks; each rank takes its batch items and heads (a.shard), each (c, t)
    group runs in its own world, and the gathered output is the whole attention."""
    p = {"version": 1, "model": {"heads": 8, "kv_heads": 2, "head_dim": 16, "dtype": "fp32"},
         "input": {"batch": 2, "tokens": 64, "mask": "key_padding"},
         "cluster": {"world_size": 8},
         "parallel": {"variant": "ring", "ring_degree": 2, "cfg_degree": 2, "tp_degree": 2}}
    a = cpc.compile(p)
    assert (a.world_size, a.cfg_degree, a.tp_degree) == (8, 2, 2)
    assert a.shard_shape(7, "q") == (1, 32, 4, 16) and a.shard_shape(7, "k") == (1, 32, 1, 16)
    q, k, v = qkv(a, rng)
    mask = rng.random((2, 64)) > 0.2
    ref, lse_ref = attention_ref(q, k, v, mask=mask)
    with cpc.LocalWorld(a) as w:
        out, lse = w(q, k, v, mask=mask, return_lse=True)
        assert rel_err(out, ref) < 1e-5
        fin = np.isfinite(lse_ref)
        assert np.abs(lse[fin] - lse_ref[fin]).max() < 1e-4
    # kv_heads 2 < tp_degree 4: each K/V head replicated to two tensor-parallel ranks
    p["parallel"] = {"variant": "none", "tp_degree": 4, "cfg_degree": 2}
    p["input"]["mask"] = "causal"
    g = cpc.compile(p)
    q, k, v = qkv(g, rng)
    with cpc.LocalWorld(g) as w:
        assert rel_err(w(q, k, v), attention_ref(q, k, v, causal=True)[0]) < 1e-5


def test_stall_limit_and_abort_end_a_waiting_peer(rng):
    """A peer that never calls ends this rank's forward at the stall limit (timeout_s);
    Attention.abort on the peer ends it at once (issue 22: the job hung forever)."""
    import threading
    import time
    a = plan("ring", 2)
    q, k, v = qkv(a, rng)
    with cpc.LocalWorld(a, timeout_s=1.0) as w:
        r0 = w.rank(0)
        t0 = time.monotonic()
        with pytest.raises(cpc.RuntimeError, match="stall|waited|timed out|timeout"):
            r0(a.shard(q, 0), a.shard(k, 0, "k"), a.shard(v, 0, "v"))
        assert time.monotonic() - t0 < 30
    with cpc.LocalWorld(a, timeout_s=600) as w:
        errs = []

        def rank0():
            try:
                w.rank(0)(a.shard(q, 0), a.shard(k, 0, "k"), a.shard(v, 0, "v"))
                errs.append(None)
            except cpc.Error as e:
                errs.append(e)

        th = threading.Thread(target=rank0)
        t0 = time.monotonic()
        th.start()
        time.sleep(0.2)
        w.rank(1).abort("bad input on rank 1")
        th.join(30)
        assert not th.is_alive() and time.monotonic() - t0 < 30
        assert isinstance(errs[0], cpc.RuntimeError) and "bad input on rank 1" in str(errs[0])
    with pytest.raises(cpc.UsageError):
        cpc.abort("no MPI rank here")


def test_a_rank_of_another_artifact_is_refused():
    a, b = plan("ring", 2), plan("ulysses", 2)
    with cpc.LocalWorld(a) as w:
        with pytest.raises(cpc.UsageError, match="ring.*ulysses|ulysses.*ring"):
            cpc.Attention(b, rank=1, world=w)
