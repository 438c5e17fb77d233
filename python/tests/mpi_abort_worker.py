"""Run under mpirun by test_mpi.py: one process fails before the forward while its
peer is inside it.  argv[1]: "abort" (the failing process calls cpc.abort: the job
ends at once) or "stall" (it just returns without calling: the peer's forward ends
at the stall limit, timeout_s 2 s, and the job is aborted)."""
import sys

import numpy as np
from mpi4py import MPI

import cpc

comm = MPI.COMM_WORLD
P, me = comm.Get_size(), comm.Get_rank()
mode = sys.argv[1]
a = cpc.compile({"version": 1, "model": {"heads": 4, "head_dim": 16, "dtype": "fp32"},
                 "input": {"segments": [{"name": "text", "tokens": 64}]},
                 "cluster": {"world_size": P}, "parallel": {"variant": "ring"}})
q = np.zeros((1, 64, 4, 16), np.float32)
att = cpc.Attention(a, comm=comm, timeout_s=2.0)
if me == P - 1:
    try:
        att(q, q, q)  # the global tensor: a wrong shape on this rank
    except cpc.UsageError as e:
        if mode == "abort":
            cpc.abort(f"rank {me}: {e}")
        print(f"mpi_abort_worker: rank {me} gives up: {e}", flush=True)
        sys.exit(5)
else:
    att(a.shard(q, me), a.shard(q, me, "k"), a.shard(q, me, "v"))
    print(f"mpi_abort_worker: rank {me}: the forward returned", flush=True)
