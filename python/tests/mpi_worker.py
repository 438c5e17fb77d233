"""Run under mpirun by test_mpi.py: cpc.Attention on the caller's communicator."""
import sys

import numpy as np
from mpi4py import MPI

import cpc

comm = MPI.COMM_WORLD
P, me = comm.Get_size(), comm.Get_rank()
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)


for variant, image in (("ring", 64), ("ulysses", 64), ("ulysses_anything", 61),
                       ("ring_anything", 61)):
    plan = {"version": 1, "model": {"heads": 4, "head_dim": 16, "dtype": "fp32"},
            "input": {"batch": 2, "segments": [{"name": "text", "tokens": 24},
                                               {"name": "image", "tokens": image}]},
            "cluster": {"world_size": P}, "parallel": {"variant": variant}}
    a = cpc.compile(plan)
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, a.tokens, 4, 16)).astype(np.float32) for _ in range(3))
    with cpc.Attention(a, comm=comm) as att:
        expect(att.rank == me and att.transport == "mpi", "rank/transport")
        # a wrong shape is refused on this rank before anything runs; the rank stays usable
        try:
            att(q, k, v)
            failures.append("global tensors accepted")
        except cpc.UsageError:
            pass
        out = att(a.shard(q, me), a.shard(k, me, "k"), a.shard(v, me, "v"))
        expect(att.last_copies == [], "copies")
        outs = comm.gather(out, root=0)
        if me == 0:
            with cpc.LocalWorld(a) as w:
                expect(np.array_equal(a.gather(outs), w(q, k, v)), f"{variant}: mpi != local")

# replicated text (`split: replicate`): every process holds the whole text and its
# image shard; the MPI job equals the local world bit for bit
for variant in ("ring", "ulysses"):
    plan = {"version": 1, "model": {"heads": 4, "head_dim": 16, "dtype": "fp32"},
            "input": {"segments": [{"name": "text", "tokens": 7, "split": "replicate"},
                                   {"name": "image", "tokens": 8 * P}]},
            "cluster": {"world_size": P}, "parallel": {"variant": variant}}
    a = cpc.compile(plan)
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, a.tokens, 4, 16)).astype(np.float32) for _ in range(3))
    expect(a.token_index(me)[:7] == list(range(7)), f"replicated {variant}: token_index")
    with cpc.Attention(a, comm=comm) as att:
        out = att(a.shard(q, me), a.shard(k, me, "k"), a.shard(v, me, "v"))
        outs = comm.gather(out, root=0)
        if me == 0:
            with cpc.LocalWorld(a) as w:
                expect(np.array_equal(a.gather(outs), w(q, k, v)), f"replicated {variant}: mpi != local")

# training (cpc_rank_backward over the MPI transport): torch autograd on this rank's
# shards; the gathered gradients equal the local world's (rank threads), bit for bit
try:
    import torch
except ImportError:
    torch = None
a = cpc.compile({"version": 1, "model": {"heads": 4, "kv_heads": 2, "head_dim": 16,
                                         "dtype": "bf16"},
                 "input": {"batch": 2, "tokens": 32 * P, "mask": "causal", "mode": "training"},
                 "cluster": {"world_size": P}, "parallel": {"variant": "ring"}})
rng = np.random.default_rng(11)
q, k, v = (cpc.to_bf16(rng.standard_normal((2, a.tokens, h, 16)).astype(np.float32))
           for h in (4, 2, 2))
dout = cpc.to_bf16(rng.standard_normal((2, a.tokens, 4, 16)).astype(np.float32))
with cpc.Attention(a, comm=comm) as att:
    sh = [a.shard(x, me, r) for x, r in ((q, "q"), (k, "k"), (v, "v"))]
    if torch is not None:
        ts = [torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).requires_grad_()
              for x in sh]
        out = att(*ts)
        expect(out.grad_fn is not None, "no grad_fn on a training rank's output")
        dsh = torch.from_numpy(a.shard(dout, me, "dout").view(np.int16)).view(torch.bfloat16)
        out.backward(dsh)
        grads = [t.grad.view(torch.int16).numpy().view(np.uint16) for t in ts]
    else:
        out, lse = att(*sh, return_lse=True)
        grads = list(att.backward(*sh, out, lse, a.shard(dout, me, "dout")))
    allg = comm.gather(grads, root=0)
    if me == 0:
        with cpc.LocalWorld(a) as w:
            o, lse = w(q, k, v, return_lse=True)
            ref = w.backward(q, k, v, o, lse, dout)
        for i, n in enumerate(("dq", "dk", "dv")):
            expect(np.array_equal(a.gather([g[i] for g in allg], n), ref[i]),
                   f"training: {n} over MPI != local world")
# training with a replicated text over MPI: every process gives the same dout rows of
# the text and gets the whole text gradient; the gathered gradients equal the local
# world's (lse None: the last forward's, in any variant's layout) bit for bit with
# ulysses, to rounding with ring steps (LocalWorld.backward gives every rank the
# gathered `out`, rank 0's copy of the text rows: another delta by rounding)
for variant in ("ring", "ulysses"):
    a = cpc.compile({"version": 1, "model": {"heads": 4, "head_dim": 16, "dtype": "fp32"},
                     "input": {"mode": "training",
                               "segments": [{"name": "text", "tokens": 7, "split": "replicate"},
                                            {"name": "image", "tokens": 8 * P}]},
                     "cluster": {"world_size": P}, "parallel": {"variant": variant}})
    rng = np.random.default_rng(13)
    q, k, v, dout = (rng.standard_normal((1, a.tokens, 4, 16)).astype(np.float32)
                     for _ in range(4))
    with cpc.Attention(a, comm=comm) as att:
        sh = [a.shard(x, me, r) for x, r in ((q, "q"), (k, "k"), (v, "v"))]
        out = att(*sh)
        grads = list(att.backward(*sh, out, None, a.shard(dout, me, "dout")))
        allg = comm.gather(grads, root=0)
        if me == 0:
            with cpc.LocalWorld(a) as w:
                o = w(q, k, v)
                ref = w.backward(q, k, v, o, None, dout)  # each rank's own LSE, as above
            for i, n in enumerate(("dq", "dk", "dv")):
                got = a.gather([g[i] for g in allg], n)
                err = float(np.linalg.norm(got - ref[i]) / np.linalg.norm(ref[i]))
                expect(err == 0.0 if variant == "ulysses" else err < 1e-6,
                       f"replicated training {variant}: {n} over MPI != local world ({err})")
# the outer axes (cfg_degree / tp_degree = P, variant none): each process its batch
# items or heads; each group's communicator is split from the caller's
for axis, batch in (("cfg_degree", P), ("tp_degree", 1)):
    a = cpc.compile({"version": 1, "model": {"heads": 4, "head_dim": 16, "dtype": "fp32"},
                     "input": {"batch": batch, "tokens": 40, "mask": "causal"},
                     "cluster": {"world_size": P}, "parallel": {"variant": "none", axis: P}})
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((batch, 40, 4, 16)).astype(np.float32) for _ in range(3))
    with cpc.Attention(a, comm=comm) as att:
        out = att(a.shard(q, me), a.shard(k, me, "k"), a.shard(v, me, "v"))
        outs = comm.gather(out, root=0)
        if me == 0:
            with cpc.LocalWorld(a) as w:
                expect(np.array_equal(a.gather(outs), w(q, k, v)), f"{axis}: mpi != local")

# a communicator of the wrong size: every process gets the same exception
a = cpc.compile({"version": 1, "model": {"heads": 4, "head_dim": 16},
                 "input": {"tokens": 16 * (P + 1)}, "cluster": {"world_size": P + 1},
                 "parallel": {"variant": "ring"}})
try:
    cpc.Attention(a, comm=comm)
    failures.append("size mismatch accepted")
except cpc.UsageError as e:
    expect("world_size" in str(e), "size message")

# an MPI rank left open is destroyed (collectively) at exit, before MPI_Finalize
keep = cpc.Attention(cpc.compile({"version": 1, "model": {"heads": 4, "head_dim": 16},
                                  "input": {"tokens": 64}, "cluster": {"world_size": P},
                                  "parallel": {"variant": "ulysses"}}), comm=comm)

all_failures = comm.gather(failures, root=0)
if me == 0:
    bad = [f"rank {r}: {f}" for r, fs in enumerate(all_failures) for f in fs]
    print("mpi_worker:", "FAIL " + "; ".join(bad) if bad else "ok", flush=True)
    sys.exit(1 if bad else 0)
