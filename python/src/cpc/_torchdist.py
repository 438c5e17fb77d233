"""cpc ranks whose traffic a torch.distributed process group carries (torchrun, gloo).

libcpc's callback transport (cpc_rank_new_callbacks, include/cpc/rank.h) builds every
message cpc sends (ring rotations, all-to-alls, all-gathers, barriers) from three
functions given here: isend / irecv / wait on torch.distributed's point-to-point ops over
the group, on tensors that view libcpc's own buffers (torch.frombuffer: no copies).
"""

import ctypes

from . import _native as N
from ._errors import UsageError


class TorchP2P:
    """The callbacks for one rank: torch.distributed isend/irecv over `group` (None: the
    default group).  Errors in a callback are kept (.error) and returned as nonzero."""

    def __init__(self, group):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.group = torch, dist, group
        self.works = {}
        self.next = 1
        self.error = None
        self._ranks = None
        size = dist.get_world_size(group)
        if group is None or group == dist.group.WORLD:
            self._ranks = list(range(size))
        else:
            self._ranks = [dist.get_global_rank(group, r) for r in range(size)]
        self.cb = N.P2PCallbacks()
        self._keep = (N.P2P_SEND(self._isend), N.P2P_RECV(self._irecv), N.P2P_WAIT(self._wait))
        self.cb.user = None
        self.cb.isend, self.cb.irecv, self.cb.wait = self._keep

    def _tensor(self, buf, nbytes):
        arr = (ctypes.c_uint8 * nbytes).from_address(buf)
        return self.torch.frombuffer(arr, dtype=self.torch.uint8)

    def _post(self, send, peer, buf, nbytes, tag, handle):
        try:
            t = self._tensor(buf, nbytes)
            dst = self._ranks[peer]
            w = (self.dist.isend(t, dst=dst, group=self.group, tag=tag) if send else
                 self.dist.irecv(t, src=dst, group=self.group, tag=tag))
            h = self.next
            self.next += 1
            self.works[h] = (w, t)
            handle[0] = h
            return 0
        except BaseException as e:  # noqa: BLE001 - reported through libcpc's status
            self.error = e
            return 1

    def _isend(self, user, peer, buf, nbytes, tag, handle):
        return self._post(True, peer, buf, nbytes, tag, handle)

    def _irecv(self, user, peer, buf, nbytes, tag, handle):
        return self._post(False, peer, buf, nbytes, tag, handle)

    def _wait(self, user, h):
        try:
            w, _ = self.works.pop(h)
            w.wait()
            return 0
        except BaseException as e:  # noqa: BLE001
            self.error = e
            return 2


def create_rank(artifact, group, opts):
    """(rank pointer, TorchP2P, this process's rank) for `group`."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise UsageError("a torch.distributed group was given but torch.distributed is not "
                         "initialised (dist.init_process_group('gloo') under torchrun)",
                         code="usage")
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if size != artifact.world_size:
        raise UsageError(f"the process group has {size} processes but the plan's world_size "
                         f"is {artifact.world_size}", code="usage",
                         hint=f"torchrun --nproc-per-node {artifact.world_size} ...")
    if artifact.cfg_degree * artifact.tp_degree != 1:
        raise UsageError("cfg_degree / tp_degree plans run over MPI or cpc.LocalWorld, not a "
                         "torch.distributed group", code="usage")
    p2p = TorchP2P(group)
    L = N.lib()
    from ._errors import check as _check
    out = ctypes.c_void_p()
    _check(L, L.cpc_rank_new_callbacks(artifact._ptr, rank, ctypes.byref(p2p.cb),
                                          ctypes.byref(opts), ctypes.byref(out)))
    return out.value, p2p, rank
