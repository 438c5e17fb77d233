"""cpc.Attention(..., comm=..., backend="cuda") over NCCL, bootstrapped from the launcher's
group (python/src/cpc/_nccl.py), on the CPU emulator of CUDA with the fake NCCL.

Run by tests/cli/nccl_emu.sh under `mpirun -np P` with the fakes first on
LD_LIBRARY_PATH (tests/emu/fake_cudart.c, fake_nccl.c), one emulated GPU per process
(device = OMPI_COMM_WORLD_LOCAL_RANK, what cpc picks when no device is given),
CPC_LIBRARY the build's libcpc.so, PYTHONPATH the package's sources:

    nccl_py_emu.py PLAN.cplan STORE_FILE

Device arrays are cai_emu.DevArray (__cuda_array_interface__ over the fake's
cudaMalloc), standing in for torch CUDA tensors, which this machine cannot have.  With
comm an mpi4py communicator and then a torch.distributed gloo group (init from
STORE_FILE; skipped loudly when torch.distributed is missing), each rank:
  - makes cpc.Attention(a, comm=..., backend="cuda"): .transport must be "nccl" (rank 0's
    unique id broadcast by that group);
  - runs a forward on its device shards; rank 0 gathers the shards (mpi4py) and checks
    the whole output against a float64 numpy reference of the same rounded inputs
    (SPEC tolerances: bf16 2e-2, fp16 2e-3, fp32 1e-5 relative L2);
and the refusals, on every rank alike, before NCCL is touched:
  - cpc._nccl.device_problem replaced to say rank 1 has no GPU: every rank raises
    cpc.UnsupportedError "NCCL cannot run on rank 1 of P: ..." with a hint naming
    backend='cpu';
  - a plan of another world size: cpc.UsageError naming both sizes, hint "mpirun -np".
Rank 0 prints "nccl_py_emu: ok" when every rank passed."""
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cai_emu import DevArray, reference, rel  # noqa: E402 - after the path

import cpc  # noqa: E402
from cpc import _nccl  # noqa: E402
from cpc._bf16 import from_bf16, to_bf16  # noqa: E402

comm = MPI.COMM_WORLD
me, P = comm.Get_rank(), comm.Get_size()
fails = []


def expect_raise(exc, fn, *needles):
    try:
        fn()
    except exc as e:
        text = str(e) + " " + str(getattr(e, "hint", "") or "")
        for n in needles:
            if n not in text:
                fails.append(f"{exc.__name__} lacks {n!r}: {text}")
        return
    except BaseException as e:  # noqa: BLE001
        fails.append(f"expected {exc.__name__}, got {e!r}")
        return
    fails.append(f"expected {exc.__name__}, nothing raised")


def main():
    a = cpc.load(sys.argv[1])
    store = sys.argv[2]
    seed = comm.bcast(int(np.random.SeedSequence().entropy % 2**32) if me == 0 else None)
    rng = np.random.default_rng(seed)
    B, S, H, Hkv, D = a.batch, a.tokens, a.heads, a.kv_heads, a.head_dim
    f32 = [rng.standard_normal(s).astype(np.float32) for s in
           ((B, S, H, D), (B, S, Hkv, D), (B, S, Hkv, D))]
    if a.dtype == "bf16":
        host = [to_bf16(x) for x in f32]
        exact = [from_bf16(x) for x in host]
        tol = 2e-2
    else:
        dt = np.float16 if a.dtype == "fp16" else np.float32
        host = [x.astype(dt) for x in f32]
        exact = [x.astype(np.float32) for x in host]
        tol = 2e-3 if a.dtype == "fp16" else 1e-5
    ref = reference(*exact, np.zeros((B, S, H, D)), causal=False)[0] if me == 0 else None

    groups = [("mpi4py", lambda: comm)]
    try:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=me, world_size=P)
        groups.append(("torch.distributed gloo", lambda: dist.group.WORLD))
    except Exception as e:  # noqa: BLE001 - reported, the mpi4py half still runs
        if me == 0:
            print(f"nccl_py_emu: SKIP the torch.distributed half: {e!r}")

    for name, group in groups:
        try:
            att = cpc.Attention(a, comm=group(), backend="cuda")
            if att.transport != "nccl" or att.rank != me:
                fails.append(f"{name}: transport {att.transport}, rank {att.rank}")
            dq, dk, dv = (DevArray.of(a.shard(x, me, role)) for x, role in
                          zip(host, ("q", "k", "v")))
            o = DevArray(att.shard_shape("out"), host[0].dtype)
            att(dq, dk, dv, out=o)
            shard = o.get()
            att.close()
        except BaseException as e:  # noqa: BLE001
            fails.append(f"{name}: {e!r}")
            shard = None
        shards = comm.gather(shard)
        if me == 0 and all(s is not None for s in shards):
            out = a.gather(shards)
            out = from_bf16(out) if a.dtype == "bf16" else out.astype(np.float32)
            err = rel(out, ref)
            print(f"nccl_py_emu: {name}: {P} NCCL ranks ({a.variant}, {a.dtype}): out rel_err "
                  f"{err:.3g} (tolerance {tol:g}, seed {seed})")
            if not err < tol:
                fails.append(f"{name}: rel_err {err:.3g} > {tol:g}")

    # refusals: a rank without a GPU makes every rank raise, before NCCL is touched
    real = _nccl.device_problem
    _nccl.device_problem = (lambda dev: "no CUDA device (test)") if me == 1 else (lambda dev: None)
    expect_raise(cpc.UnsupportedError, lambda: cpc.Attention(a, comm=comm, backend="cuda"),
                 f"NCCL cannot run on rank 1 of {P}", "no CUDA device (test)", "backend='cpu'")
    _nccl.device_problem = real
    other = cpc.compile({"version": 1, "name": "other", "model": {"heads": 4, "head_dim": 64},
                         "input": {"tokens": 64}, "cluster": {"world_size": 2 * P, "device": "cpu"},
                         "parallel": {"variant": "ring"}}, kernels=False)
    expect_raise(cpc.UsageError, lambda: cpc.Attention(other, comm=comm, backend="cuda"),
                 f"has {P} processes but the plan's world_size is {2 * P}", f"mpirun -np {2 * P}")
    expect_raise(cpc.UsageError, lambda: cpc.Attention(a, comm=comm, backend="cpu",
                                                       transport="nccl"), "backend='cuda'")

    for f in fails:
        print(f"FAIL: nccl_py_emu: rank {me}: {f}", file=sys.stderr)
    bad = comm.allreduce(len(fails))
    if me == 0 and not bad:
        print("nccl_py_emu: ok")
    if len(groups) > 1:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    rc = main()
    # End without the interpreter's finalisation (as python/tests/nccl_worker.py): a gloo
    # worker thread may still release a Python object then, and torch aborts the process
    # after the test passed.  MPI is finalised by hand first.
    sys.stdout.flush()
    sys.stderr.flush()
    MPI.Finalize()
    os._exit(rc)
