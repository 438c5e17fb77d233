"""NCCL ranks bootstrapped from the launcher's group (include/cpc/rank.h, NCCL RANKS).

With device tensors (backend="cuda") and a communicator, cpc's traffic runs over NCCL
between the GPUs: world rank 0 of the group makes an NCCL unique id (cpc_nccl_unique_id),
the group broadcasts it (torch.distributed.broadcast_object_list on a ProcessGroup,
comm.bcast on an mpi4py communicator), and every rank makes its NCCL rank
(cpc_rank_new_nccl_id).  The group only carries these 128 bytes and a few small objects
(the ranks' agreement that all of them can run NCCL, so that a rank without a GPU makes
every rank raise instead of leaving its peers inside NCCL's init).

Where it cannot work, every rank raises alike before NCCL is touched:
  - the group's size is not the plan's world size: cpc.UsageError (the hint says how many
    processes to start);
  - cfg_degree / tp_degree > 1: cpc.UsageError (those run over MPI or cpc.LocalWorld);
  - a rank without NCCL or a CUDA device (this libcpc built without NCCL, no GPU or no
    driver, the device index out of range): cpc.UnsupportedError naming the rank and
    what to do (CPU tensors then go over the group's own collectives: gloo / MPI).
"""

import ctypes
import os
import sys

from . import _native as N
from ._errors import RuntimeError as CpcRuntimeError
from ._errors import UnsupportedError, UsageError, check, take_status

ID_BYTES = 128          # CPC_NCCL_UNIQUE_ID_BYTES


class _TorchGroup:
    def __init__(self, group):
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise UsageError("a torch.distributed group was given but torch.distributed is "
                             "not initialised (dist.init_process_group(...) under torchrun)",
                             code="usage")
        self.dist, self.group = dist, group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        if group is None or group == dist.group.WORLD:
            self.root = 0
        else:
            self.root = dist.get_global_rank(group, 0)
        self.launcher = "torchrun --nproc-per-node {n} ..."

    def bcast(self, obj):
        box = [obj]
        self.dist.broadcast_object_list(box, src=self.root, group=self.group)
        return box[0]

    def allgather(self, obj):
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out


class _MpiGroup:
    def __init__(self, comm):
        self.comm = comm
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self.launcher = "mpirun -np {n} ..."

    def bcast(self, obj):
        return self.comm.bcast(obj, root=0)

    def allgather(self, obj):
        return self.comm.allgather(obj)


def group_of(comm, kind):
    """The bootstrap's view of `comm`: kind "torch" (a ProcessGroup) or "mpi"."""
    return _TorchGroup(comm) if kind == "torch" else _MpiGroup(comm)


def default_device():
    """The CUDA device of this rank when none is given: torch's current device when torch
    has CUDA, else the launcher's local rank (LOCAL_RANK under torchrun,
    OMPI_COMM_WORLD_LOCAL_RANK / MPI_LOCALRANKID / SLURM_LOCALID under MPI launchers),
    else None (libcpc then uses the current device)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return torch.cuda.current_device()
        except Exception:  # noqa: BLE001 - a torch without CUDA support
            pass
    for var in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"):
        v = os.environ.get(var)
        if v is not None and v.strip().isdigit():
            return int(v)
    return None


def _cuda_devices():
    """(count, error text) from the CUDA runtime libcpc is linked against
    (libcudart.so.13, already loaded with libcpc: the same instance)."""
    try:
        rt = ctypes.CDLL("libcudart.so.13")
    except OSError as e:
        return 0, f"the CUDA runtime cannot be loaded ({e})"
    n = ctypes.c_int(0)
    err = rt.cudaGetDeviceCount(ctypes.byref(n))
    if err != 0:
        rt.cudaGetErrorString.restype = ctypes.c_char_p
        rt.cudaGetLastError()
        return 0, f"cudaGetDeviceCount: {rt.cudaGetErrorString(err).decode()} (error {err})"
    return n.value, None


def device_problem(device):
    """None when this process can run an NCCL rank on `device` (None: the current one),
    else why not (a sentence).  Asked on every rank before anything else; tests replace
    it to stand for a machine without a GPU."""
    L = N.lib()
    if not L.cpc_have_nccl():
        return (f"this libcpc ({N.library_path()}) was built without NCCL (libnccl was not "
                "found under the CUDA root when it was built)")
    n, err = _cuda_devices()
    if err:
        return f"no CUDA device: {err}"
    if n == 0:
        return "no CUDA device: cudaGetDeviceCount found none"
    if device is not None and not 0 <= device < n:
        return f"CUDA device {device} requested, {n} visible"
    return None


def _id_from_rank0(g):
    """Rank 0 makes the unique id; the group broadcasts it (or rank 0's error)."""
    payload = None
    if g.rank == 0:
        L = N.lib()
        buf = (ctypes.c_ubyte * ID_BYTES)()
        e = take_status(L, L.cpc_nccl_unique_id(buf, ID_BYTES))
        payload = ("ok", bytes(buf)) if e is None else ("error", str(e))
    payload = g.bcast(payload)
    if not isinstance(payload, tuple) or payload[0] != "ok" or len(payload[1]) != ID_BYTES:
        why = payload[1] if isinstance(payload, tuple) else repr(payload)
        raise CpcRuntimeError(f"rank 0 could not make the NCCL unique id: {why}",
                              code="runtime")
    return payload[1]


def bootstrap_id(artifact, comm, kind, rank=None, device=None):
    """Every check, then the unique id every rank of `comm` shares: (group, id bytes).
    Collective over comm (after the local checks, which fail alike on every rank)."""
    g = group_of(comm, kind)
    n = artifact.world_size
    if g.size != n:
        raise UsageError(f"the {'process group' if kind == 'torch' else 'communicator'} has "
                         f"{g.size} processes but the plan's world_size is {n}",
                         code="usage", hint="start one process per rank and GPU: "
                         + g.launcher.format(n=n))
    if artifact.cfg_degree * artifact.tp_degree != 1:
        raise UsageError("cfg_degree / tp_degree plans run over MPI or cpc.LocalWorld with "
                         "CPU tensors, not over NCCL", code="usage")
    if rank is not None and rank != g.rank:
        raise UsageError(f"rank {rank} given, but this process is rank {g.rank} of the group",
                         code="usage")
    why = device_problem(device)
    whys = g.allgather(why)
    bad = [(r, w) for r, w in enumerate(whys) if w]
    if bad:
        r, w = bad[0]
        more = f" (and {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
        raise UnsupportedError(
            f"NCCL cannot run on rank {r} of {g.size}{more}: {w}", code="unsupported",
            hint="run one process per GPU on CUDA tensors (backend='cuda'), or pass CPU "
                 "tensors with backend='cpu': cpc's traffic then goes over the group's own "
                 "collectives (gloo / MPI)")
    return g, _id_from_rank0(g)


def create_rank(artifact, comm, kind, rank, opts, device):
    """(rank pointer, this process's rank) of an NCCL rank over `comm`."""
    if device is None:
        device = default_device()
    if device is not None:
        opts.device = int(device)
    g, uid = bootstrap_id(artifact, comm, kind, rank, device)
    L = N.lib()
    out = ctypes.c_void_p()
    buf = (ctypes.c_ubyte * ID_BYTES).from_buffer_copy(uid)
    check(L, L.cpc_rank_new_nccl_id(artifact._ptr, buf, ID_BYTES, g.rank, ctypes.byref(opts),
                                    ctypes.byref(out)))
    return out.value, g.rank
