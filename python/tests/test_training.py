"""Training (SPEC section 10) from Python: Attention.backward / LocalWorld.backward over
cpc_rank_backward against float64 gradients computed here, and the torch autograd path
(Attention.__call__ / LocalWorld.__call__ on tensors that require grad) against torch's
own autograd of a float64 reference attention; refusals as exceptions."""

import threading

import numpy as np
import pytest

import cpc
from conftest import rel_err, run_ranks

torch = pytest.importorskip("torch")


def train_plan(variant, P, *, dtype="fp32", H=4, Hkv=2, D=16, B=2, S=64, mask="causal",
               mode="training"):
    return cpc.compile({"version": 1, "model": {"heads": H, "kv_heads": Hkv, "head_dim": D,
                                                "dtype": dtype},
                        "input": {"batch": B, "tokens": S, "mask": mask, "mode": mode},
                        "cluster": {"world_size": P, "device": "cpu"},
                        "parallel": {"variant": variant}})


def ref_attention(q, k, v, mask=None, causal=False):
    """float64 attention in torch (autograd records it): BSHD, GQA by repeat."""
    B, S, H, D = q.shape
    g = H // k.shape[2]
    k = k.repeat_interleave(g, dim=2)
    v = v.repeat_interleave(g, dim=2)
    s = torch.einsum("bshd,bthd->bhst", q, k) / np.sqrt(D)
    if mask is not None:
        s = s.masked_fill(~mask.bool()[:, None, None, :], float("-inf"))
    if causal:
        s = s.masked_fill(~torch.ones(S, k.shape[1], dtype=torch.bool).tril()[None, None],
                          float("-inf"))
    return torch.einsum("bhst,bthd->bshd", torch.softmax(s, dim=-1), v)


def inputs(a, seed, tdt):
    g = torch.Generator().manual_seed(seed)
    B, S, H, Hkv, D = a.batch, a.tokens, a.heads, a.kv_heads, a.head_dim
    q = torch.randn(B, S, H, D, generator=g).to(tdt)
    k = torch.randn(B, S, Hkv, D, generator=g).to(tdt)
    v = torch.randn(B, S, Hkv, D, generator=g).to(tdt)
    dout = torch.randn(B, S, H, D, generator=g).to(tdt)
    mask = (torch.rand(B, S, generator=g) < 0.8) if a.key_padding else None
    return q, k, v, dout, mask


def ref_grads(q, k, v, dout, mask, causal):
    """dq, dk, dv by torch autograd of the float64 reference on the same rounded inputs."""
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    out = ref_attention(q64, k64, v64, mask, causal)
    (out * dout.double()).sum().backward()
    return q64.grad, k64.grad, v64.grad


TDT = {"fp32": torch.float32, "bf16": torch.bfloat16}
CASES = [("none", 1, "fp32", "causal"), ("ring", 2, "fp32", "none"),
         ("ring", 4, "fp32", "causal"), ("ring", 4, "fp32", "key_padding"),
         ("ring", 4, "bf16", "causal"), ("ulysses", 4, "fp32", "causal"),
         ("ulysses", 2, "bf16", "none"), ("unified", 4, "fp32", "causal")]


@pytest.mark.parametrize("variant,P,dtype,mask", CASES,
                         ids=[f"{v}{p}-{d}-{m}" for v, p, d, m in CASES])
def test_autograd_per_rank_threads_matches_torch_float64(variant, P, dtype, mask):
    """Each rank in its own thread: out = att(q, k, v) on shards that require grad,
    (out * dout).sum().backward(); the gathered .grad against torch autograd."""
    a = train_plan(variant, P, dtype=dtype, mask=mask)
    assert a.trains
    q, k, v, dout, m = inputs(a, 7, TDT[dtype])
    rq, rk, rv = ref_grads(q, k, v, dout, m, a.causal)
    grads = [None] * P
    with cpc.LocalWorld(a) as w:
        def run(r):
            qs, ks, vs = (a.shard(x, r, n).requires_grad_() for x, n in
                          ((q, "q"), (k, "k"), (v, "v")))
            out = w.rank(r)(qs, ks, vs, mask=None if m is None else a.shard(m, r, "mask"))
            assert out.grad_fn is not None and out.dtype == TDT[dtype]
            (out.float() * a.shard(dout, r, "dout").float()).sum().backward()
            grads[r] = (qs.grad, ks.grad, vs.grad)
        run_ranks(P, run)
    tol = 2e-2 if dtype == "bf16" else 1e-5
    for i, (name, ref) in enumerate((("dq", rq), ("dk", rk), ("dv", rv))):
        got = a.gather([g[i] for g in grads], name)
        assert got.dtype == TDT[dtype]
        e = rel_err(got.double().numpy(), ref.numpy())
        assert 0 < e < tol, (name, e)


def test_autograd_local_world_global_tensors():
    """LocalWorld(q, k, v) on global tensors that require grad: one autograd Function
    whose backward runs every rank's backward in threads; GQA 6/2, causal zigzag."""
    a = train_plan("ring", 4, H=6, Hkv=2, mask="causal")
    q, k, v, dout, _ = inputs(a, 3, torch.float32)
    rq, rk, rv = ref_grads(q, k, v, dout, None, True)
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    with cpc.LocalWorld(a) as w:
        out = w(q, k, v)
        assert out.grad_fn is not None
        with pytest.raises(cpc.UsageError, match="return_lse"):
            w(q, k, v, return_lse=True)
        (out * dout).sum().backward()
    for got, ref in ((q.grad, rq), (k.grad, rk), (v.grad, rv)):
        assert rel_err(got.double().numpy(), ref.numpy()) < 1e-5


def test_backward_numpy_fp32_grads_and_preallocated():
    """Attention.backward through LocalWorld.backward on numpy (bf16 as uint16), with
    grad_dtype='fp32' (the unrounded accumulators) and into preallocated arrays."""
    a = train_plan("ring", 2, dtype="bf16", mask="none")
    q, k, v, dout, _ = inputs(a, 11, torch.bfloat16)
    rq, rk, rv = ref_grads(q, k, v, dout, None, False)
    nq, nk, nv, nd = (x.view(torch.int16).numpy().view(np.uint16) for x in (q, k, v, dout))
    with cpc.LocalWorld(a) as w:
        out, lse = w(nq, nk, nv, return_lse=True)
        dq, dk, dv = w.backward(nq, nk, nv, out, lse, nd, grad_dtype="fp32")
        assert dq.dtype == np.float32
        for got, ref in ((dq, rq), (dk, rk), (dv, rv)):
            assert rel_err(got, ref.numpy()) < 2e-2
        # one rank, preallocated outputs in the plan dtype: written in place
        pre = [np.full(a.shard_shape(0, n), 7, dtype=np.uint16) for n in ("dq", "dk", "dv")]
        res = [None, None]

        def run(r):
            att = w.rank(r)
            sh = [a.shard(x, r, n) for x, n in ((nq, "q"), (nk, "k"), (nv, "v"), (out, "out"),
                                                 (lse, "lse"), (nd, "dout"))]
            kw = dict(zip(("dq", "dk", "dv"), pre)) if r == 0 else {}
            res[r] = att.backward(*sh, **kw)
        t = threading.Thread(target=run, args=(1,))
        t.start()
        run(0)
        t.join()
        assert all(x is y for x, y in zip(res[0], pre))
        got = cpc.from_bf16(pre[0])
        assert rel_err(got, a.shard(rq.numpy(), 0, "dq")) < 2e-2


def test_refusals():
    inf = train_plan("none", 1, mode="inference")
    assert not inf.trains
    q, k, v, dout, _ = inputs(inf, 1, torch.float32)
    with cpc.Attention(inf) as att:
        out, lse = att(q, k, v, return_lse=True)
        with pytest.raises(cpc.UnsupportedError, match="input.mode: training"):
            att.backward(q, k, v, out, lse, dout)
        # an inference artifact refuses inputs that require grad (their gradient would
        # silently be lost); without grad mode it runs
        with pytest.raises(cpc.UsageError, match="does not train"):
            att(q.clone().requires_grad_(), k, v)
        with torch.no_grad():
            assert att(q.clone().requires_grad_(), k, v).grad_fn is None
    a = train_plan("none", 1)
    with cpc.Attention(a) as att:
        out, lse = att(q, k, v, return_lse=True)
        dq = torch.full_like(q, 7.0)
        with pytest.raises(cpc.UsageError, match="dout"):
            att.backward(q, k, v, out, lse, dout[:, :-1], dq=dq)
        with pytest.raises(cpc.UsageError):
            att.backward(q, k, v, out, lse, dout.to(torch.float16), dq=dq)
        with pytest.raises(cpc.UsageError, match="grad_dtype"):
            att.backward(q, k, v, out, lse, dout, grad_dtype="fp16")
        assert torch.all(dq == 7.0)
        g = att.backward(q, k, v, out, lse, dout, dq=dq)  # still usable
        assert g[0] is dq and not torch.all(dq == 7.0)


def test_check_predicts_the_backward():
    """cpc.check on a training plan: predicted adds the backward (SPEC section 3), as
    `cpc --check --format json` prints it."""
    import json
    import subprocess
    from conftest import cpc_tool
    p = {"version": 1, "model": {"heads": 4, "kv_heads": 2, "head_dim": 32, "dtype": "bf16"},
         "input": {"batch": 2, "tokens": 256, "mask": "causal", "mode": "training"},
         "cluster": {"world_size": 4, "device": "cpu"}, "parallel": {"variant": "ring"}}
    r = cpc.check(p)
    assert r.ok
    pr = r.predicted
    assert pr["ms_backward_per_layer"] > pr["ms_per_layer"] > 0
    # K/V 3 hops (bf16) + dK/dV 4 hops (fp32): B 2 x 64 tokens x Hkv 2 x D 32 per block
    blk = 2 * 64 * 2 * 32
    assert pr["backward_bytes_sent_per_rank"] == 3 * 2 * blk * 2 + 4 * 2 * blk * 4
    p["input"]["mode"] = "inference"
    assert "ms_backward_per_layer" not in cpc.check(p).predicted
    tool = cpc_tool("cpc")
    if tool:
        p["input"]["mode"] = "training"
        out = subprocess.run([tool, "--check", "--format", "json", "/dev/stdin"],
                             input=cpc.plan_to_yaml(p), capture_output=True, text=True)
        j = json.loads(out.stdout)["predicted"]
        for key in ("ms_backward_per_layer", "backward_bytes_sent_per_rank",
                    "backward_memory_bytes_per_rank"):
            assert j[key] == pytest.approx(pr[key], rel=1e-12), key


@pytest.mark.parametrize("axes,Hkv", [({"cfg_degree": 2}, 2), ({"tp_degree": 2}, 2), ({"tp_degree": 2}, 1)],
                         ids=["cfg2", "tp2", "tp2-replicated-kv"])
def test_autograd_outer_axes(axes, Hkv):
    """cfg_degree / tp_degree x ring 2 (4 rank threads): each rank trains its batch items or
    heads; with kv_heads < tp_degree the tp ranks' partial dK/dV of the shared K/V head
    are summed by gather."""
    p = {"version": 1, "model": {"heads": 4, "kv_heads": Hkv, "head_dim": 16, "dtype": "fp32"},
         "input": {"batch": 2, "tokens": 64, "mask": "causal", "mode": "training"},
         "cluster": {"world_size": 4, "device": "cpu"},
         "parallel": dict({"variant": "ring", "ring_degree": 2}, **axes)}
    a = cpc.compile(p)
    assert a.trains
    q, k, v, dout, _ = inputs(a, 5, torch.float32)
    rq, rk, rv = ref_grads(q, k, v, dout, None, True)
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    with cpc.LocalWorld(a) as w:
        (w(q, k, v) * dout).sum().backward()
    for got, ref in ((q.grad, rq), (k.grad, rk), (v.grad, rv)):
        assert rel_err(got.double().numpy(), ref.numpy()) < 1e-5


def test_backward_saved_lse_ulysses_numpy():
    """ulysses keeps the LSE in the head layout: backward with each rank's saved LSE
    (Attention.saved_lse, 1-D) or None (the last forward's) gives the same gradients."""
    a = train_plan("ulysses", 4, H=8, Hkv=2, mask="none")
    q, k, v, dout, _ = inputs(a, 9, torch.float32)
    rq, rk, rv = ref_grads(q, k, v, dout, None, False)
    nq, nk, nv, nd = (x.numpy() for x in (q, k, v, dout))
    with cpc.LocalWorld(a) as w:
        with pytest.raises(cpc.UnsupportedError):
            w(nq, nk, nv, return_lse=True)   # the forward cannot return a ulysses LSE
        out = w(nq, nk, nv)
        g1 = w.backward(nq, nk, nv, out, None, nd)
        saved = [w.rank(r).saved_lse() for r in range(a.world_size)]
        assert saved[0].ndim == 1 and saved[0].dtype == np.float32
        g2 = w.backward(nq, nk, nv, out, saved, nd)
    for x, y, ref in zip(g1, g2, (rq, rk, rv)):
        assert np.array_equal(x, y)
        assert rel_err(x, ref.numpy()) < 1e-5
