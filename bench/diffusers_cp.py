"""cpc.diffusers.parallelize vs diffusers' own enable_parallelism, in one run.

    mpirun --allow-run-as-root --oversubscribe -np 2 -x OPENBLAS_NUM_THREADS=1 \\
        -x PYTHONPATH=python/src -x CPC_LIBRARY=build/libcpc.so.0.2 \\
        ~/.cache/cpc/torch-venv/bin/python bench/diffusers_cp.py --model flux --ulysses 2

Every process builds the same random model (seeded) three times: one stays as is (the
single-process reference, timed on every rank), one gets diffusers'
`enable_parallelism(config=ContextParallelConfig(...))` (torch.distributed over gloo,
initialised from Open MPI's environment; `torch.accelerator.device_count` patched to 1,
as diffusers' mesh code divides the rank by it), one gets `cpc.diffusers.parallelize`
with the same ContextParallelConfig, twice: over mpi4py's COMM_WORLD (libcpc's MPI
transport) and over the same gloo process group (libcpc's callback transport).  Same
inputs, same processes.  Rank 0 prints, per path: the median time per forward (the
maximum over ranks of each iteration), the relative error of its output against the
single-process model, and the error between diffusers' and cpc's outputs.  Only Ulysses
compares with diffusers here: its ring and unified need an attention backend that returns
the LSE, which diffusers has on CUDA only.  --ring / --anything run cpc alone.
"""

import argparse
import json
import os
import statistics
import sys
import time


def build(model, heads, head_dim, layers, dtype, torch):
    torch.manual_seed(0)
    if model == "flux":
        from diffusers import FluxTransformer2DModel
        d = head_dim
        m = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=layers,
                                   num_single_layers=2 * layers, attention_head_dim=d,
                                   num_attention_heads=heads, joint_attention_dim=256,
                                   pooled_projection_dim=256, guidance_embeds=False,
                                   axes_dims_rope=(d // 4, 3 * d // 8, 3 * d // 8))
    else:
        from diffusers import WanTransformer3DModel
        m = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=heads,
                                  attention_head_dim=head_dim, in_channels=16,
                                  out_channels=16, text_dim=256, freq_dim=256,
                                  ffn_dim=4 * heads * head_dim, num_layers=layers,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                  rope_max_seq_len=1024)
    return m.to(dtype).eval()


def make_inputs(a, torch, dtype):
    g = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    if a.model == "flux":
        side = a.side // 16                     # pixels -> packed latent tokens per side
        N = side * side
        ids = torch.zeros(N, 3)
        ids[:, 1] = torch.arange(N) // side
        ids[:, 2] = torch.arange(N) % side
        return dict(hidden_states=r(1, N, 64), encoder_hidden_states=r(1, a.text, 256),
                    pooled_projections=r(1, 256), timestep=torch.full((1,), 0.5).to(dtype),
                    img_ids=ids, txt_ids=torch.zeros(a.text, 3), return_dict=False)
    lat = a.side // 8
    return dict(hidden_states=r(1, 16, a.frames, lat, lat),
                encoder_hidden_states=r(1, a.text, 256), timestep=torch.full((1,), 500.0),
                return_dict=False)


def timed(model, x, iters, torch, barrier, gather_max):
    with torch.no_grad():
        out = model(**x)[0]                       # warm-up (plans, caches)
        ts = []
        for _ in range(iters):
            barrier()
            t0 = time.perf_counter()
            model(**x)
            ts.append(gather_max(time.perf_counter() - t0))
    return out, statistics.median(ts) * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["flux", "wan"], default="flux")
    p.add_argument("--ulysses", type=int, default=None)
    p.add_argument("--ring", type=int, default=1)
    p.add_argument("--anything", action="store_true")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--side", type=int, default=512, help="image/frame side in pixels")
    p.add_argument("--frames", type=int, default=5, help="Wan latent frames")
    p.add_argument("--text", type=int, default=128)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--iters", type=int, default=3)
    a = p.parse_args()

    import torch
    torch.set_num_threads(1)
    import torch.distributed as dist
    from mpi4py import MPI
    import diffusers
    from diffusers import ContextParallelConfig
    diffusers.utils.logging.set_verbosity_error()
    import cpc
    import cpc.diffusers

    comm = MPI.COMM_WORLD
    rank, P = comm.Get_rank(), comm.Get_size()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=rank, world_size=P)
    torch.accelerator.device_count = lambda: 1  # diffusers' mesh: rank % device_count
    # diffusers 0.42.1's split hook calls logger.warning_once, which its logger lacks, for
    # any _cp_plan input whose rank differs from expected_dims (Wan's 1-D timestep)
    import logging
    if not hasattr(logging.Logger, "warning_once"):
        logging.Logger.warning_once = logging.Logger.warning
    U = a.ulysses if a.ulysses is not None else (1 if a.ring > 1 else P)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    x = make_inputs(a, torch, dtype)

    def gmax(v):
        return comm.allreduce(v, op=MPI.MAX)

    res = {"model": a.model, "processes": P, "ring": a.ring, "ulysses": U, "dtype": a.dtype,
           "heads": a.heads, "head_dim": a.head_dim, "side": a.side, "text": a.text,
           "torch": torch.__version__, "diffusers": diffusers.__version__}
    ref_model = build(a.model, a.heads, a.head_dim, a.layers, dtype, torch)
    ref, res["single_ms"] = timed(ref_model, x, a.iters, torch, comm.Barrier, gmax)
    res["shape"] = list(ref.shape)
    del ref_model

    def rel(o, r):
        o, r = o.double(), r.double()
        return float((o - r).norm() / r.norm())

    kw = {"ring_degree": a.ring, "ulysses_degree": U}
    if a.anything:
        kw["ulysses_anything" if U > 1 else "ring_anything"] = True
    outs = {}
    if a.ring == 1 and not a.anything:
        m = build(a.model, a.heads, a.head_dim, a.layers, dtype, torch)
        m.enable_parallelism(config=ContextParallelConfig(**kw))
        outs["diffusers"], res["diffusers_ms"] = timed(m, x, a.iters, torch, comm.Barrier, gmax)
        res["diffusers_err"] = rel(outs["diffusers"], ref)
        del m
    for name, c in (("cpc_mpi", comm), ("cpc_gloo", dist.group.WORLD)):
        m = build(a.model, a.heads, a.head_dim, a.layers, dtype, torch)
        cpc.diffusers.parallelize(m, ContextParallelConfig(**kw), comm=c)
        outs[name], res[name + "_ms"] = timed(m, x, a.iters, torch, comm.Barrier, gmax)
        # cpc's share: wall time inside cpc.Attention calls, per forward (mean, max over ranks)
        res[name + "_attention_ms"] = gmax(m._cpc.attention_s / (a.iters + 1) * 1e3)
        res[name + "_err"] = rel(outs[name], ref)
        res[name + "_variant"] = next(iter(m._cpc.shapes.values())).main[0].variant
        cpc.diffusers.unparallelize(m)
        del m
    if "diffusers" in outs:
        res["cpc_vs_diffusers"] = rel(outs["cpc_mpi"], outs["diffusers"])
    if rank == 0:
        print(json.dumps(res), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
