#!/usr/bin/env python3
"""The overhead of one cpc.Attention call against cprun's time for the same rank on
the same shapes (CPU backend).

    python bench_overhead.py PLAN.yaml [--set K=V ...] [--iters N]
    mpirun -np P python bench_overhead.py PLAN.yaml --cprun build/cprun   # MPI ranks

Times `iters` calls after one warm-up (median over iterations of the maximum over
ranks, cprun's definition), compare with `cprun PLAN --set ... --no-check --format json --warmup 1
--iters N` run the same way (README of python/ gives the commands).  Also times a tiny plan to show the fixed
cost of a call (argument checks, ctypes)."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import cpc


def timed(fn, iters, comm):
    fn()
    ts = []
    for _ in range(iters):
        if comm is not None:
            comm.Barrier()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        if comm is not None:
            dt = comm.allreduce(dt, op=__import__("mpi4py").MPI.MAX)
        ts.append(dt)
    return statistics.median(ts) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--torch", action="store_true", help="torch tensors instead of numpy")
    args = ap.parse_args()
    sets = dict(s.split("=", 1) for s in args.set)
    comm = None
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    me = comm.Get_rank() if comm else 0
    a = cpc.compile(args.plan, set=sets)
    rng = np.random.default_rng(0)
    shapes = {r: a.shard_shape(me, r) for r in ("q", "k", "v")}
    arrs = [rng.standard_normal(shapes[r]).astype(np.float32) for r in ("q", "k", "v")]
    if a.dtype == "bf16":
        arrs = [cpc.to_bf16(x) for x in arrs]
    elif a.dtype == "fp16":
        arrs = [x.astype(np.float16) for x in arrs]
    if args.torch:
        import torch
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
        arrs = [torch.from_numpy(rng.standard_normal(shapes[r]).astype(np.float32)).to(dt)
                for r in ("q", "k", "v")]
    if comm is None and a.world_size > 1:
        sys.exit("a plan with world_size > 1 needs mpirun")
    att = cpc.Attention(a, comm=comm)
    out = att(*arrs)
    ms = timed(lambda: att(*arrs, out=out), args.iters, comm)
    copies = att.last_copies
    att.close()
    # The fixed cost of a call: a tiny plan on one rank.
    tiny = cpc.compile({"version": 1, "model": {"heads": 1, "head_dim": 8, "dtype": "fp32"},
                        "input": {"tokens": 8}, "cluster": {"world_size": 1},
                        "parallel": {"variant": "none"}})
    with cpc.Attention(tiny) as t:
        x = np.zeros((1, 8, 1, 8), np.float32)
        o = np.empty_like(x)
        t(x, x, x, out=o)
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            t(x, x, x, out=o)
        call_us = (time.perf_counter() - t0) / n * 1e6
    if me != 0:
        return
    print(json.dumps({"plan": args.plan, "sets": sets, "variant": a.variant,
                      "world_size": a.world_size, "dtype": a.dtype,
                      "tensors": "torch" if args.torch else "numpy",
                      "python_ms_per_call": ms, "copies": copies,
                      "tiny_call_us": call_us}), flush=True)


if __name__ == "__main__":
    main()
