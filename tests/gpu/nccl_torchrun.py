"""tests/gpu/nccl_torchrun.py PLAN.cplan - on the GPU machine, under
`torchrun --nproc_per_node 1` (tests/gpu/run.sh): cpc.Attention on torch CUDA tensors with
comm = torch.distributed's group, which makes an NCCL rank bootstrapped from that group
(python/src/cpc/_nccl.py: rank 0's NCCL unique id, broadcast_object_list on the group,
cpc_rank_new_nccl_id).  World size 1: the device machine has one GPU and NCCL refuses two
ranks on one GPU; the whole bootstrap runs, the attention's traffic is local.

Both group backends torch offers: gloo (the bootstrap's objects through host memory) and
nccl (through the GPU).  Each forward's output is checked against a float64 reference of
the same bf16/fp16/fp32 inputs computed by torch on the CPU (tolerance: bf16 2e-2, fp16
2e-3, fp32 1e-5 relative L2, the SPEC's); a second forward must give the same bits.
Prints "nccl_torchrun: ok" and exits 0 when all passed."""
import os
import sys

import torch
import torch.distributed as dist

import cpc


def reference(q, k, v):
    q, k, v = (x.double().cpu() for x in (q, k, v))
    H, Hkv = q.shape[2], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=2)
    v = v.repeat_interleave(H // Hkv, dim=2)
    s = torch.einsum("bshd,bthd->bhst", q, k) / q.shape[-1] ** 0.5
    return torch.einsum("bhst,bthd->bshd", torch.softmax(s, -1), v)


def main():
    a = cpc.load(sys.argv[1])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    tol = {"bf16": 2e-2, "fp16": 2e-3, "fp32": 1e-5}[a.dtype]
    fails = []
    backends = ["gloo"] + (["nccl"] if dist.is_nccl_available() else [])
    for i, backend in enumerate(backends):
        kw = {"device_id": torch.device("cuda", local)} if backend == "nccl" else {}
        dist.init_process_group(backend, **kw)
        try:
            g = torch.Generator(device="cpu").manual_seed(1234 + i)
            B, S, H, Hkv, D = a.batch, a.tokens, a.heads, a.kv_heads, a.head_dim
            me = dist.get_rank()
            q = torch.randn(B, S, H, D, generator=g).to(dt)
            k, v = (torch.randn(B, S, Hkv, D, generator=g).to(dt) for _ in range(2))
            att = cpc.Attention(a, comm=dist.group.WORLD, backend="cuda")
            if att.transport != "nccl":
                fails.append(f"{backend}: transport {att.transport}, not nccl")
            qs, ks, vs = (torch.from_numpy(a.shard(x.float().numpy(), me, role)).to(dt).cuda()
                          for x, role in ((q, "q"), (k, "k"), (v, "v")))
            out = att(qs, ks, vs)
            out2 = att(qs, ks, vs)
            torch.cuda.synchronize()
            if not out.is_cuda:
                fails.append(f"{backend}: the output is not a CUDA tensor")
            if not torch.equal(out, out2):
                fails.append(f"{backend}: the second forward differs")
            ref = reference(q, k, v)
            got = out.double().cpu()
            err = float((got - ref).norm() / ref.norm())
            print(f"nccl_torchrun: {backend} group: world {dist.get_world_size()}, "
                  f"{a.variant} {a.dtype} {B}x{S}x{H}x{D}: out rel_err {err:.3g} "
                  f"(tolerance {tol:g})")
            if not err <= tol:
                fails.append(f"{backend}: rel_err {err:.3g} > {tol:g}")
            att.close()
        except Exception as e:  # noqa: BLE001 - reported, the next backend still runs
            fails.append(f"{backend}: {e!r}")
        dist.destroy_process_group()
    for f in fails:
        print(f"FAIL: nccl_torchrun: {f}", file=sys.stderr)
    if not fails:
        print("nccl_torchrun: ok")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
