"""Run under mpirun by test_nccl.py: the NCCL bootstrap's id broadcast (cpc/_nccl.py)
over the caller's mpi4py communicator and over a torch.distributed gloo group (when
torch has it), with the device check replaced (this machine has no GPU): every rank
must get rank 0's 128 bytes.  argv[1]: a file for gloo's FileStore."""
import os
import sys

from mpi4py import MPI

import cpc
from cpc import _nccl

comm = MPI.COMM_WORLD
P, me = comm.Get_size(), comm.Get_rank()
failures = []
a = cpc.compile({"version": 1, "model": {"heads": 4, "head_dim": 16},
                 "input": {"tokens": 32}, "cluster": {"world_size": P, "device": "cpu"},
                 "parallel": {"variant": "ring_anything"}})

_nccl.device_problem = lambda device: None       # stands for a GPU on every rank
groups = [("mpi4py", comm, "mpi")]
try:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=me, world_size=P)
    groups.append(("gloo", dist.group.WORLD, "torch"))
except Exception as e:  # noqa: BLE001 - the mpi4py half still runs
    print(f"nccl_worker: no torch.distributed gloo here ({e!r})")
for name, group, kind in groups:
    g, uid = _nccl.bootstrap_id(a, group, kind)
    ids = comm.allgather(uid)
    if not (len(uid) == _nccl.ID_BYTES and all(i == ids[0] for i in ids) and any(uid)):
        failures.append(f"{name}: the ranks' ids differ or are empty")
    if g.rank != me or g.size != P:
        failures.append(f"{name}: group rank {g.rank} size {g.size}")
    # a fresh id per bootstrap
    g2, uid2 = _nccl.bootstrap_id(a, group, kind)
    if uid2 == uid:
        failures.append(f"{name}: the same id twice")
    if me == 0:
        print(f"nccl_worker: {name}: {P} ranks share rank 0's {len(uid)}-byte id")
for f in failures:
    print(f"FAIL: rank {me}: {f}", file=sys.stderr)
if comm.allreduce(len(failures)) == 0 and me == 0:
    print("nccl_worker: ok")
# End without the interpreter's finalisation: a gloo worker thread may still
# release a Python object then, and torch aborts the process ("terminate called
# without an active exception", SIGABRT after the test passed; 4 runs in 5 here,
# even after destroy_process_group).  MPI is finalised by hand first.
if len(groups) > 1:
    dist.barrier()
    dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
MPI.Finalize()
os._exit(1 if failures else 0)
