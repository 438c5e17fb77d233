#!/usr/bin/env python3
"""A small FLUX-style diffusion transformer forward, distributed with cpc.

FLUX.1's structure at reduced width: joint "double-stream" blocks (text and image
tokens with their own weights, one joint attention over [text, image]) followed by
"single-stream" blocks (one stream, attention and MLP in parallel), AdaLN
modulation from a timestep embedding, RMS-normalised q/k, 3-axis RoPE on (t, h, w)
positions, GELU MLPs.  Random weights; the REAL token counts of a 512x512 image:
512 T5 text tokens + (512/16)^2 = 1024 image tokens.

Every rank holds only its shard of the tokens (cpc's layout: each segment split
separately, [text_r, image_r]); everything but attention is token-local, and
attention goes through cpc.Attention on the caller's MPI communicator.  Rank 0
gathers the image output and compares it with the same model run in one process
with plain attention:

    mpirun --allow-run-as-root --oversubscribe -np 4 python3 examples/flux_mini.py
    mpirun ... -np 2 python3 examples/flux_mini.py --dtype bf16
    python3 examples/flux_mini.py                  # one process (variant none)

Exit status 0 when the outputs match (relative error: fp32 1e-5, bf16 1e-2).
"""

import argparse
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import cpc


def parallel_config(P, variant):
    """A diffusers ContextParallelConfig (as a dict) for P processes."""
    if P == 1:
        return None
    if variant == "ring":
        return {"ring_degree": P}
    if variant == "ulysses":
        return {"ulysses_degree": P}
    if variant == "unified":
        u = 2 if P % 2 == 0 and P > 2 else P
        return {"ring_degree": P // u, "ulysses_degree": u} if P // u > 1 else {"ulysses_degree": P}
    if variant == "ulysses_anything":
        return {"ulysses_degree": P, "ulysses_anything": True}
    if variant == "ring_anything":
        return {"ring_degree": P, "ring_anything": True}
    raise SystemExit(f"unknown variant {variant}")


class Weights:
    """Random weights of a FLUX-style transformer (the same on every rank: seeded)."""

    def __init__(self, dim, heads, in_ch, txt_dim, n_double, n_single, seed=0):
        g = torch.Generator().manual_seed(seed)

        def lin(i, o, scale=1.0):
            return (torch.randn(o, i, generator=g) * scale / math.sqrt(i),
                    torch.randn(o, generator=g) * 0.02)

        self.dim, self.heads = dim, heads
        self.x_in = lin(in_ch, dim)
        self.ctx_in = lin(txt_dim, dim)
        self.double = []
        for _ in range(n_double):
            blk = {}
            for s in ("img", "txt"):
                blk[s] = {"mod": lin(dim, 6 * dim, 0.1), "qkv": lin(dim, 3 * dim),
                          "q_norm": 1 + 0.1 * torch.randn(dim // heads, generator=g),
                          "k_norm": 1 + 0.1 * torch.randn(dim // heads, generator=g),
                          "proj": lin(dim, dim), "mlp1": lin(dim, 4 * dim),
                          "mlp2": lin(4 * dim, dim)}
            self.double.append(blk)
        self.single = [{"mod": lin(dim, 3 * dim, 0.1), "lin1": lin(dim, 3 * dim + 4 * dim),
                        "q_norm": 1 + 0.1 * torch.randn(dim // heads, generator=g),
                        "k_norm": 1 + 0.1 * torch.randn(dim // heads, generator=g),
                        "lin2": lin(dim + 4 * dim, dim)} for _ in range(n_single)]
        self.out_mod = lin(dim, 2 * dim, 0.1)
        self.out = lin(dim, in_ch)


def linear(x, w):
    return F.linear(x, w[0], w[1])


def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def layer_norm(x):
    return F.layer_norm(x, x.shape[-1:], eps=1e-6)


def rope_tables(pos, head_dim, axes=None, theta=10000.0):
    """cos/sin [T, head_dim/2] for positions pos [T, 3] (t, h, w), FLUX's 3-axis RoPE."""
    if axes is None:
        a = head_dim // 4
        axes = [head_dim - 2 * a - (head_dim - 2 * a) % 2, a, a]
        axes = [x - x % 2 for x in axes]
        axes[0] = head_dim - axes[1] - axes[2]
    freqs = []
    for i, d in enumerate(axes):
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        freqs.append(pos[:, i:i + 1].double() * inv[None])
    f = torch.cat(freqs, dim=-1)
    return f.cos().float(), f.sin().float()


def apply_rope(x, cos, sin):
    """x [B, T, H, D]; rotates pairs (x0, x1)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


class Model:
    """The forward pass over whichever tokens this process holds.  `attend(q, k, v)`
    is the attention: cpc's (distributed) or a plain one (single process)."""

    def __init__(self, w, attend, n_text_local, rope):
        self.w, self.attend, self.nt, self.rope = w, attend, n_text_local, rope

    def heads(self, x):
        B, T, C = x.shape
        return x.view(B, T, self.w.heads, C // self.w.heads)

    def double_block(self, blk, img, txt, temb):
        mi = linear(F.silu(temb), blk["img"]["mod"]).chunk(6, dim=-1)
        mt = linear(F.silu(temb), blk["txt"]["mod"]).chunk(6, dim=-1)
        qkv = []
        for x, m, p in ((txt, mt, blk["txt"]), (img, mi, blk["img"])):
            h = layer_norm(x) * (1 + m[1][:, None]) + m[0][:, None]
            q, k, v = (self.heads(t) for t in linear(h, p["qkv"]).chunk(3, dim=-1))
            qkv.append((rms(q, p["q_norm"]), rms(k, p["k_norm"]), v))
        q, k, v = (torch.cat([qkv[0][i], qkv[1][i]], dim=1) for i in range(3))  # [text, image]
        q, k = apply_rope(q, *self.rope), apply_rope(k, *self.rope)
        a = self.attend(q, k, v).flatten(2)
        at, ai = a[:, :self.nt], a[:, self.nt:]
        out = []
        for x, m, p, att in ((txt, mt, blk["txt"], at), (img, mi, blk["img"], ai)):
            x = x + m[2][:, None] * linear(att, p["proj"])
            h = layer_norm(x) * (1 + m[4][:, None]) + m[3][:, None]
            x = x + m[5][:, None] * linear(F.gelu(linear(h, p["mlp1"]), approximate="tanh"),
                                           p["mlp2"])
            out.append(x)
        return out[1], out[0]

    def single_block(self, blk, x, temb):
        shift, scale, gate = linear(F.silu(temb), blk["mod"]).chunk(3, dim=-1)
        h = layer_norm(x) * (1 + scale[:, None]) + shift[:, None]
        qkv, mlp = linear(h, blk["lin1"]).split([3 * self.w.dim, 4 * self.w.dim], dim=-1)
        q, k, v = (self.heads(t) for t in qkv.chunk(3, dim=-1))
        q, k = rms(q, blk["q_norm"]), rms(k, blk["k_norm"])
        q, k = apply_rope(q, *self.rope), apply_rope(k, *self.rope)
        a = self.attend(q, k, v).flatten(2)
        return x + gate[:, None] * linear(torch.cat([a, F.gelu(mlp, approximate="tanh")], -1),
                                          blk["lin2"])

    def forward(self, img_tokens, txt_emb, temb):
        img = linear(img_tokens, self.w.x_in)
        txt = linear(txt_emb, self.w.ctx_in)
        for blk in self.w.double:
            img, txt = self.double_block(blk, img, txt, temb)
        x = torch.cat([txt, img], dim=1)
        for blk in self.w.single:
            x = self.single_block(blk, x, temb)
        img = x[:, self.nt:]
        shift, scale = linear(F.silu(temb), self.w.out_mod).chunk(2, dim=-1)
        return linear(layer_norm(img) * (1 + scale[:, None]) + shift[:, None], self.w.out)


def plain_attention(dtype):
    """Single-process attention: the inputs rounded to the plan's dtype, fp32 math,
    the output rounded to the plan's dtype (what cpc computes)."""
    def attend(q, k, v):
        if dtype is not torch.float32:
            q, k, v = (x.to(dtype).float() for x in (q, k, v))
        s = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(q.shape[-1])
        o = torch.einsum("bhst,bthd->bshd", s.softmax(dim=-1), v)
        return o.to(dtype).float()
    return attend


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--variant", default="unified",
                    help="ring, ulysses, unified (R x U with U=2), ulysses_anything, "
                         "ring_anything (default unified; 2 processes: ulysses; an odd number: "
                         "ulysses_anything)")
    ap.add_argument("--height", type=int, default=512)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--double", type=int, default=2, help="double-stream blocks")
    ap.add_argument("--single", type=int, default=2, help="single-stream blocks")
    ap.add_argument("--text", type=int, default=512, help="text tokens (FLUX.1-dev: 512)")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)

    try:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    except ImportError:
        comm = None
    P = comm.Get_size() if comm is not None else 1
    rank = comm.Get_rank() if comm is not None else 0

    # The model's config.json at reduced width, as diffusers would give it.
    transformer_config = {"_class_name": "FluxTransformer2DModel", "patch_size": 1,
                          "in_channels": 64, "num_layers": args.double,
                          "num_single_layers": args.single,
                          "attention_head_dim": args.head_dim,
                          "num_attention_heads": args.heads, "joint_attention_dim": 256,
                          "pooled_projection_dim": 128, "guidance_embeds": False}
    variant = args.variant
    if variant == "unified" and (P == 2 or P % 2):
        # unified needs R x U with U = 2 and R >= 2: with 2 processes use ulysses, with an
        # odd count the variant that lifts the divisibility rules
        variant = "ulysses" if P == 2 else "ulysses_anything"
    plan = cpc.from_diffusers(parallel_config(P, variant), transformer_config,
                              height=args.height, width=args.width, text_tokens=args.text,
                              dtype=args.dtype, device="cpu")
    artifact = cpc.compile(plan)
    att = cpc.Attention(artifact, comm=comm if P > 1 else None)
    tdtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16

    dim = args.heads * args.head_dim
    w = Weights(dim, args.heads, 64, 256, args.double, args.single)
    g = torch.Generator().manual_seed(1)
    hp, wp = args.height // 16, args.width // 16
    S_img = hp * wp
    img = torch.randn(1, S_img, 64, generator=g)      # packed 2x2 latents
    txt = torch.randn(1, args.text, 256, generator=g)
    temb = torch.randn(1, dim, generator=g)
    pos = torch.zeros(args.text + S_img, 3)
    ii = torch.arange(S_img)
    pos[args.text:, 1], pos[args.text:, 2] = (ii // wp).float(), (ii % wp).float()

    # This rank's tokens: one run of text, one of image (shard order = [text_r, image_r]).
    idx = torch.tensor(artifact.token_index(rank))
    is_txt = idx < args.text
    nt = int(is_txt.sum())
    rope = rope_tables(pos[idx], args.head_dim)

    def cpc_attend(q, k, v):
        return att(q.to(tdtype).contiguous(), k.to(tdtype).contiguous(),
                   v.to(tdtype).contiguous()).float()

    model = Model(w, cpc_attend, nt, rope)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.forward(img[:, idx[~is_txt] - args.text], txt[:, idx[is_txt]], temb)
    dt = time.perf_counter() - t0
    my_img = (idx[~is_txt] - args.text).numpy()
    parts = comm.gather((my_img, out.numpy()), root=0) if P > 1 else [(my_img, out.numpy())]
    times = comm.gather(dt, root=0) if P > 1 else [dt]
    ok = True
    if rank == 0:
        full = np.zeros((1, S_img, 64), np.float32)
        for ids, o in parts:
            full[:, ids] = o
        msg = (f"flux_mini: {P} process(es), {artifact.variant} {artifact.ring_degree}x"
               f"{artifact.ulysses_degree}, {args.dtype}, {args.text}+{S_img} tokens, "
               f"{args.double}+{args.single} blocks, {args.heads}x{args.head_dim} heads: "
               f"{1e3 * max(times):.1f} ms per forward")
        if not args.no_check:
            ref_model = Model(w, plain_attention(tdtype), args.text,
                              rope_tables(pos, args.head_dim))
            with torch.no_grad():
                ref = ref_model.forward(img, txt, temb).numpy().astype(np.float64)
            err = float(np.linalg.norm(full - ref) / np.linalg.norm(ref))
            tol = 1e-5 if args.dtype == "fp32" else 1e-2
            ok = bool(np.isfinite(full).all() and err < tol)
            msg += f"; vs single process: rel_err {err:.2e} (tol {tol:g}) " + \
                ("PASS" if ok else "FAIL")
        print(msg, flush=True)
    if P > 1:
        ok = comm.bcast(ok, root=0)
    att.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
