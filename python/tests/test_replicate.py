"""Replicated segments (`split: replicate`, SPEC section 1; issue 24) from Python:
cpc.compile accepts them, Artifact.shard / gather / token_index give every rank the
whole replicated segment plus its shard of the others, and cpc.LocalWorld runs every
variant against the float64 reference on fresh random inputs (even and odd lengths,
batch 2, GQA, key padding), with the LSE of every row for the ring variants."""

import time

import numpy as np
import pytest

import cpc
from conftest import attention_ref, rel_err, run_ranks


def plan(variant, P, *, text=7, image=24, B=2, H=6, Hkv=None, dtype="fp32", mask="none",
         R=None, U=None, tail=0):
    segs = [{"name": "text", "tokens": text, "split": "replicate"},
            {"name": "image", "tokens": image}]
    if tail:
        segs.append({"name": "tail", "tokens": tail, "split": "replicate"})
    p = {"version": 1, "model": {"heads": H, "head_dim": 16, "dtype": dtype},
         "input": {"batch": B, "segments": segs, "mask": mask},
         "cluster": {"world_size": P}, "parallel": {"variant": variant}}
    if Hkv:
        p["model"]["kv_heads"] = Hkv
    if R:
        p["parallel"].update(ring_degree=R, ulysses_degree=U)
    return cpc.compile(p)


def qkv(a, rng):
    return tuple(rng.standard_normal((a.batch, a.tokens, h, a.head_dim)).astype(np.float32)
                 for h in (a.heads, a.kv_heads, a.kv_heads))


CASES = [("ring", 2, 8, 24, {}), ("ring", 3, 7, 24, {}), ("ring_anything", 3, 7, 25, {}),
         ("ulysses", 2, 7, 24, {}), ("ulysses", 3, 8, 24, {}), ("ulysses_anything", 3, 5, 25, {}),
         ("unified", 6, 226, 24, {"R": 2, "U": 3}), ("unified", 4, 9, 32, {"R": 2, "U": 2}),
         ("ring_anything", 2, 5, 25, {"tail": 3})]


@pytest.mark.parametrize("variant,P,text,image,kw", CASES,
                         ids=[f"{c[0]}{c[1]}-text{c[2]}" for c in CASES])
def test_every_variant_against_float64(variant, P, text, image, kw):
    a = plan(variant, P, text=text, image=image, **kw)
    rng = np.random.default_rng()  # fresh inputs every run
    q, k, v = qkv(a, rng)
    ref, _ = attention_ref(q, k, v)
    with cpc.LocalWorld(a) as w:
        out = w(q, k, v)
    assert np.abs(out).max() > 0.05
    assert rel_err(out, ref) < 1e-5, rel_err(out, ref)


def test_gqa_bf16_and_key_padding():
    rng = np.random.default_rng()
    a = plan("ulysses", 2, text=7, image=24, H=4, Hkv=2, dtype="bf16")
    q, k, v = (cpc.to_bf16(x) for x in qkv(a, rng))
    ref, _ = attention_ref(cpc.from_bf16(q), cpc.from_bf16(k), cpc.from_bf16(v))
    with cpc.LocalWorld(a) as w:
        out = cpc.from_bf16(w(q, k, v))
    assert rel_err(out, ref) < 1e-2
    a = plan("ulysses_anything", 3, text=7, image=25, mask="key_padding")
    q, k, v = qkv(a, rng)
    mask = np.ones((a.batch, a.tokens), np.uint8)
    mask[0, 3:7] = 0      # padded text keys
    mask[1, 20:22] = 0    # and image keys
    ref, _ = attention_ref(q, k, v, mask=mask)
    with cpc.LocalWorld(a) as w:
        out = w(q, k, v, mask=mask)
    assert rel_err(out, ref) < 1e-5


def test_shard_gather_token_index():
    a = plan("ring_anything", 3, text=7, image=25, tail=3)
    # every rank: the whole text [0, 7), its image chunk, the whole tail [32, 35)
    chunks = [(7, 9), (16, 8), (24, 8)]
    for r, (s, n) in enumerate(chunks):
        idx = a.token_index(r)
        assert idx == list(range(7)) + list(range(s, s + n)) + [32, 33, 34], (r, idx)
        assert a.shard_shape(r, "q") == (2, 7 + n + 3, 6, 16)
    rng = np.random.default_rng()
    q = rng.standard_normal((2, a.tokens, 6, 16)).astype(np.float32)
    shards = [a.shard(q, r) for r in range(3)]
    assert all(np.array_equal(s[:, :7], q[:, :7]) for s in shards)
    assert np.array_equal(a.gather(shards, "q"), q)
    # the replicated rows of a gathered output are rank 0's
    shards[1][:, 0] += 1.0
    shards[0][:, 1] += 2.0
    g = a.gather(shards, "q")
    assert np.array_equal(g[:, 0], q[:, 0]) and np.array_equal(g[:, 1], q[:, 1] + 2.0)


def test_lse_of_every_row():
    """ring variants: the LSE of the rank's own rows (replicated ones included), as
    out; ulysses keeps its LSE in the head layout: refused with the reason."""
    rng = np.random.default_rng()
    for variant, P, text, image in (("ring", 2, 8, 24), ("ring_anything", 3, 7, 25)):
        a = plan(variant, P, text=text, image=image, tail=2)
        q, k, v = qkv(a, rng)
        ref, lse_ref = attention_ref(q, k, v)
        with cpc.LocalWorld(a) as w:
            out, lse = w(q, k, v, return_lse=True)
        assert rel_err(out, ref) < 1e-5
        assert lse.shape == lse_ref.shape and np.abs(lse - lse_ref).max() < 1e-4
    a = plan("ulysses", 2)
    q, k, v = qkv(a, rng)
    with cpc.LocalWorld(a) as w:
        with pytest.raises(cpc.Error, match="LSE"):
            w(q, k, v, return_lse=True)


def test_refusals_name_the_rule():
    with pytest.raises(cpc.PlanError, match="CP027"):
        cpc.compile({"version": 1, "model": {"heads": 4, "head_dim": 16},
                     "input": {"segments": [{"name": "text", "tokens": 8, "split": "replicate"},
                                            {"name": "image", "tokens": 24,
                                             "split": "replicate"}]},
                     "cluster": {"world_size": 2}, "parallel": {"variant": "ring"}})
    def training(P):
        return {"version": 1, "model": {"heads": 4, "head_dim": 16},
                "input": {"mode": "training",
                          "segments": [{"name": "text", "tokens": 8, "split": "replicate"},
                                       {"name": "image", "tokens": 2 * P}]},
                "cluster": {"world_size": P}, "parallel": {"variant": "ring"}}
    assert cpc.compile(training(2)).trains  # was CP018: training runs (SPEC section 10)
    # the backward prover's symmetric domain proves a replicated plan at any
    # world size (it enumerated every rank, 256 at most, before): 512 compiles,
    # and 65536 ranks are checked (forward and backward proofs) in well under
    # the bound given here (about 0.3 s on a loaded 2-core machine)
    assert cpc.compile(training(512)).trains
    t0 = time.perf_counter()
    r = cpc.check(training(65536))
    elapsed = time.perf_counter() - t0
    assert r.ok, r.diagnostics
    assert elapsed < 10.0, elapsed
    r = cpc.check({"version": 1, "model": {"heads": 48, "head_dim": 64},
                   "input": {"segments": [{"name": "text", "tokens": 226, "split": "replicate"},
                                          {"name": "video", "tokens": 17550}]},
                   "cluster": {"world_size": 6},
                   "parallel": {"variant": "unified", "ring_degree": 2, "ulysses_degree": 3}})
    assert r.ok, r.diagnostics


def test_from_diffusers_replicate_text_cogvideox_world_6():
    """The issue's case: CogVideoX's 226 text tokens on ring 2 x ulysses 3 (world 6) were
    CP010; with replicate_text=True (xDiT's layout) the plan checks and runs."""
    from conftest import config
    cfg = config("cogvideox-5b")
    pc = {"ring_degree": 2, "ulysses_degree": 3}
    r = cpc.check(cpc.from_diffusers(pc, cfg, height=480, width=720, num_frames=49))
    assert not r.ok and r.diagnostics[0].code == "CP010"
    assert "replicate_text=True" in r.diagnostics[0].hint
    p = cpc.from_diffusers(pc, cfg, height=480, width=720, num_frames=49, replicate_text=True)
    assert p["input"]["segments"][0] == {"name": "text", "tokens": 226, "split": "replicate"}
    r = cpc.check(p)
    assert r.ok, r.diagnostics
    assert (r.selected["variant"], r.selected["ring_degree"], r.selected["ulysses_degree"]) == \
        ("unified", 2, 3)
    # the same layout, small enough to run here: 226 text + 24 video tokens, 48 heads
    a = cpc.compile(cpc.from_diffusers(pc, cfg, tokens=24, text_tokens=226, dtype="fp32",
                                       replicate_text=True))
    assert a.world_size == 6 and a.shard_shape(5, "q")[1] == 226 + 4
    rng = np.random.default_rng()
    q, k, v = qkv(a, rng)
    with cpc.LocalWorld(a) as w:
        out = w(q, k, v)
    assert rel_err(out, attention_ref(q, k, v)[0]) < 1e-5


def test_from_diffusers_replicate_text_arguments():
    from conftest import config
    with pytest.raises(ValueError, match="replicate_text"):
        cpc.from_diffusers({"ring_degree": 2}, config("flux1-dev"), height=256, width=256,
                           replicate_text="yes")
    # Wan: no joint text (self-attention) or the text already whole (cross): no effect
    for att in ("self", "cross"):
        p = cpc.from_diffusers({"ulysses_degree": 2}, config("wan2.1-t2v-1.3b"), height=480,
                               width=832, num_frames=81, attention=att, replicate_text=True)
        assert all("split" not in s for s in p["input"]["segments"])


def test_random_layouts_against_float64():
    """Random segment lists (each replicated or not, at least one sharded), random
    lengths, heads and variant: every plan the rules accept matches float64."""
    rng = np.random.default_rng()
    ran = 0
    for _ in range(12):
        nseg = int(rng.integers(2, 5))
        reps = [bool(rng.integers(0, 2)) for _ in range(nseg)]
        if all(reps):
            reps[int(rng.integers(0, nseg))] = False
        segs = [{"name": f"s{i}", "tokens": int(rng.integers(1, 30)),
                 **({"split": "replicate"} if r else {})} for i, r in enumerate(reps)]
        variant, P = [("ring_anything", 3), ("ulysses_anything", 2), ("ring_anything", 2),
                      ("ulysses_anything", 4)][int(rng.integers(0, 4))]
        H = int(rng.integers(P if "ulysses" in variant else 1, 7))
        plan = {"version": 1, "model": {"heads": H, "head_dim": 8, "dtype": "fp32"},
                "input": {"segments": segs}, "cluster": {"world_size": P},
                "parallel": {"variant": variant}}
        if not cpc.check(plan).ok:
            continue
        a = cpc.compile(plan)
        q, k, v = qkv(a, rng)
        with cpc.LocalWorld(a) as w:
            out = w(q, k, v)
        assert rel_err(out, attention_ref(q, k, v)[0]) < 1e-5, plan
        ran += 1
    assert ran >= 3


# ---- training (SPEC section 10): the replicated rows' gradients ------------------------

TRAIN_CASES = [("ring", 2, 7, 24, {}), ("ring_anything", 3, 5, 25, {}), ("ulysses", 2, 7, 24, {}),
               ("ulysses_anything", 3, 6, 25, {}), ("unified", 4, 9, 24, {"R": 2, "U": 2})]


def train_plan(variant, P, *, text, image, R=None, U=None, dtype="fp32", H=4, Hkv=2, mask="none"):
    p = {"version": 1, "model": {"heads": H, "kv_heads": Hkv, "head_dim": 16, "dtype": dtype},
         "input": {"batch": 2, "mode": "training", "mask": mask,
                   "segments": [{"name": "text", "tokens": text, "split": "replicate"},
                                {"name": "image", "tokens": image}]},
         "cluster": {"world_size": P}, "parallel": {"variant": variant}}
    if R:
        p["parallel"].update(ring_degree=R, ulysses_degree=U)
    return cpc.compile(p)


def torch_ref_grads(torch, q, k, v, dout):
    """dq, dk, dv of float64 attention (GQA by repeat) by torch autograd."""
    q, k, v = (x.double().clone().requires_grad_() for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    s = torch.einsum("bshd,bthd->bhst", q, kk) / np.sqrt(q.shape[-1])
    out = torch.einsum("bhst,bthd->bshd", torch.softmax(s, dim=-1), vv)
    (out * dout.double()).sum().backward()
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("variant,P,text,image,kw", TRAIN_CASES,
                         ids=[f"{c[0]}{c[1]}-text{c[2]}" for c in TRAIN_CASES])
def test_autograd_with_replicated_text_matches_float64(variant, P, text, image, kw):
    """Per-rank threads: each rank's out = att(q, k, v) on its own tokens (its shard and
    the whole text) that require grad, (out * dout).sum().backward() with the same dout
    rows for the text on every rank; every rank's .grad of the text is the whole
    (world-summed) gradient: each rank's gathered copy against float64 autograd; and the
    global LocalWorld autograd Function."""
    torch = pytest.importorskip("torch")
    a = train_plan(variant, P, text=text, image=image, **kw)
    assert a.trains
    g = torch.Generator().manual_seed(int(np.random.default_rng().integers(1 << 30)))
    B, S, H, Hkv, D = a.batch, a.tokens, a.heads, a.kv_heads, a.head_dim
    q, dout = (torch.randn(B, S, H, D, generator=g) for _ in range(2))
    k, v = (torch.randn(B, S, Hkv, D, generator=g) for _ in range(2))
    refs = torch_ref_grads(torch, q, k, v, dout)
    grads = [None] * P
    with cpc.LocalWorld(a) as w:
        def run(r):
            qs, ks, vs = (a.shard(x, r, n).requires_grad_() for x, n in
                          ((q, "q"), (k, "k"), (v, "v")))
            out = w.rank(r)(qs, ks, vs)
            (out * a.shard(dout, r, "dout")).sum().backward()
            grads[r] = (qs.grad, ks.grad, vs.grad)
        run_ranks(P, run)
        for i, name in enumerate(("dq", "dk", "dv")):
            got = a.gather([gr[i] for gr in grads], name)  # text rows: rank 0's copy
            e = rel_err(got.double().numpy(), refs[i].numpy())
            assert 0 < e < 1e-5, (name, e)
            for r in range(P):  # every rank's copy of the text (its first rows)
                assert a.shard_runs(r)[0][0] == 0
                e = rel_err(grads[r][i][:, :text].double().numpy(), refs[i][:, :text].numpy())
                assert 0 < e < 1e-5, (name, r, e)
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        out = w(qg, kg, vg)
        assert out.grad_fn is not None
        (out * dout).sum().backward()
    for got, ref in ((qg.grad, refs[0]), (kg.grad, refs[1]), (vg.grad, refs[2])):
        assert 0 < rel_err(got.double().numpy(), ref.numpy()) < 1e-5


def test_autograd_replicated_text_tp_shared_kv_head():
    """tp 2 with one K/V head (each tp rank holds a partial dK/dV of it) and the text
    replicated over the ulysses group: gather adds the text rows once per group."""
    torch = pytest.importorskip("torch")
    p = {"version": 1, "model": {"heads": 8, "kv_heads": 1, "head_dim": 16, "dtype": "fp32"},
         "input": {"batch": 1, "mode": "training",
                   "segments": [{"name": "text", "tokens": 7, "split": "replicate"},
                                {"name": "image", "tokens": 24}]},
         "cluster": {"world_size": 4}, "parallel": {"variant": "ulysses", "tp_degree": 2}}
    a = cpc.compile(p)
    g = torch.Generator().manual_seed(int(np.random.default_rng().integers(1 << 30)))
    q, dout = (torch.randn(1, 31, 8, 16, generator=g) for _ in range(2))
    k, v = (torch.randn(1, 31, 1, 16, generator=g) for _ in range(2))
    refs = torch_ref_grads(torch, q, k, v, dout)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    with cpc.LocalWorld(a) as w:
        out = w(qg, kg, vg)
        (out * dout).sum().backward()
    for got, ref in ((qg.grad, refs[0]), (kg.grad, refs[1]), (vg.grad, refs[2])):
        assert 0 < rel_err(got.double().numpy(), ref.numpy()) < 1e-5
