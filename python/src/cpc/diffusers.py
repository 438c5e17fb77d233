"""cpc.diffusers: run a diffusers transformer's attention through cpc, with one call.

    import cpc.diffusers
    cpc.diffusers.parallelize(transformer, ContextParallelConfig(ulysses_degree=2))
    out = transformer(**inputs)          # every rank: the full inputs in, the full output out

What `parallelize` does (the same contract as diffusers' `enable_parallelism`):

- The transformer's inputs are split over the ranks where the model's own `_cp_plan`
  says (diffusers' metadata: which module inputs/outputs carry the sequence, on which
  dimension; for classes diffusers gives none, or whose text cpc keeps whole, a plan of
  the same format in _MODELS), but into cpc's layout for the plan: each split tensor is
  cut at the global token positions of this rank's shard of its segment
  (`Artifact.shard_runs`), so text and image/video segments, uneven (`*_anything`) splits
  included, land where cpc expects them.
  The output named by `_cp_plan`'s ContextParallelOutput is gathered back (an all-gather
  over `comm`; its backward takes this rank's rows, as diffusers' does).
- Every attention processor of the model keeps its projections, norms and RoPE; only its
  call to diffusers' `dispatch_attention_fn` (or to torch's
  scaled_dot_product_attention, for processors that call it themselves: CogVideoX,
  CogView4, EasyAnimate, SD3, Mochi) is answered by `cpc.Attention` (joint or
  self-attention: the plan's main artifact; a cross-attention, Wan's
  `is_cross_attention` or a self-attention model's processor given
  encoder_hidden_states: a `kv:` plan whose K/V are the whole text, held by every rank).
  A text padding mask (QwenImage, Chroma, HunyuanVideo(-1.5), Mochi; LTX's and Cosmos'
  cross-attention) is read from the call's full inputs and given to cpc as `mask:
  key_padding` (this rank's shard).
- The plan is `cpc.from_diffusers(parallel_config, transformer.config, tokens=...,
  text_tokens=..., batch=..., dtype=..., mode=...)` for the shapes of the first call; it is
  compiled (proven) in a pre-hook of the transformer before any layer runs: a plan cpc
  refuses raises `cpc.PlanError` on every rank at the same point (no collective has
  started, so nothing hangs), its hints naming the ContextParallelConfig field.  Plans
  and their ranks are cached per (shapes, dtype, mode).  Every call first all-gathers the
  input shapes (a few bytes): ranks called with different shapes all raise
  `cpc.UsageError` instead of hanging.
- mode: "training" when autograd records the call (grad mode on and a parameter or an
  input requires grad), else "inference".  Training runs autograd through the whole
  model (cpc's backward is collective, run by every rank's own backward()); each rank's
  parameter gradients are then the sum over ITS tokens: `allreduce_grads(transformer)`
  sums them over `comm` (what DDP / FSDP over the context-parallel group does).

comm: an mpi4py communicator (libcpc's MPI transport on it), a torch.distributed process
group (torchrun), or None: torch.distributed's default group when it is initialised, else
mpi4py's COMM_WORLD when mpi4py is installed, else a world of one process.
"""

import contextvars
import functools
import inspect
import re
import sys
import time

from . import _diffusers as _D
from ._errors import PlanError, UnsupportedError, UsageError

__all__ = ["parallelize", "unparallelize", "allreduce_grads", "is_parallelized"]

# The attention module whose processor is running (set by the processor wrapper, read by
# the dispatch_attention_fn replacement).
_CURRENT = contextvars.ContextVar("cpc_diffusers_attention", default=None)
_WRAPPED_CLASSES = {}        # processor class -> its cpc subclass
_PATCHED_MODULES = {}        # module name -> (its dispatch_attention_fn, its F) originals


def _torch():
    import torch
    return torch


# ---- communicators ------------------------------------------------------------------

class _MPIComm:
    kind = "mpi"

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def allgather_obj(self, obj):
        return self.comm.allgather(obj)

    def allgather_rows(self, x, counts):
        """x: [n_r, ...] contiguous torch tensor on this rank; counts: every rank's n_r.
        Returns [sum(counts), ...] (rank order), on x's device (a device tensor goes
        through host memory: mpi4py sends numpy buffers here)."""
        torch = _torch()
        from mpi4py import MPI
        import numpy as np
        dev = x.device
        if dev.type != "cpu":
            return self.allgather_rows(x.cpu(), counts).to(dev)
        row = x[0].numel() * x.element_size() if x.shape[0] else \
            int(np.prod(x.shape[1:])) * x.element_size()
        send = x.contiguous().view(torch.uint8).reshape(-1).numpy() if x.numel() else \
            np.empty(0, np.uint8)
        total = sum(counts)
        recv = np.empty(total * row, np.uint8)
        cnt = [c * row for c in counts]
        displs = [sum(cnt[:i]) for i in range(len(cnt))]
        self.comm.Allgatherv([send, MPI.BYTE], [recv, (cnt, displs), MPI.BYTE])
        return torch.from_numpy(recv).view(x.dtype).reshape((total,) + tuple(x.shape[1:]))

    def allreduce_(self, t):
        from mpi4py import MPI
        torch = _torch()
        if t.dtype in (torch.float32, torch.float64):
            buf = t.detach().cpu().contiguous().numpy()
            self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            t.copy_(torch.from_numpy(buf))      # back (a copy: on a device, or strided)
        else:                                   # bf16 / fp16: sum in float32
            buf = t.detach().float().cpu().contiguous().numpy()
            self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            t.copy_(torch.from_numpy(buf).to(t.dtype))

    def attention(self, artifact, backend, timeout_s):
        from ._attention import Attention
        return Attention(artifact, comm=self.comm, backend=backend, timeout_s=timeout_s)


class _TorchComm:
    kind = "torch"

    def __init__(self, group):
        import torch.distributed as dist
        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def allgather_obj(self, obj):
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def allgather_rows(self, x, counts):
        torch = _torch()
        m = max(counts)
        pad = torch.zeros((m,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        pad[:x.shape[0]] = x
        outs = [torch.empty_like(pad) for _ in range(self.size)]
        self.dist.all_gather(outs, pad, group=self.group)
        return torch.cat([o[:c] for o, c in zip(outs, counts)], 0)

    def allreduce_(self, t):
        self.dist.all_reduce(t, op=self.dist.ReduceOp.SUM, group=self.group)

    def attention(self, artifact, backend, timeout_s):
        from ._attention import Attention
        group = self.group if self.group is not None else self.dist.group.WORLD
        return Attention(artifact, comm=group, backend=backend, timeout_s=timeout_s)


class _SelfComm:
    kind = "self"
    rank, size = 0, 1

    def allgather_obj(self, obj):
        return [obj]

    def allgather_rows(self, x, counts):
        return x

    def allreduce_(self, t):
        pass

    def attention(self, artifact, backend, timeout_s):
        from ._attention import Attention
        return Attention(artifact, backend=backend, timeout_s=timeout_s)


def _make_comm(comm):
    if comm is None:
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                return _TorchComm(None)
        except ImportError:
            pass
        import os
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and "TORCHELASTIC_RUN_ID" in \
                os.environ or "LOCAL_WORLD_SIZE" in os.environ and \
                "OMPI_COMM_WORLD_SIZE" not in os.environ:
            raise UsageError("launched by torchrun but torch.distributed is not initialised",
                             code="usage", hint="call torch.distributed.init_process_group("
                             "'gloo') (CPU) before cpc.diffusers.parallelize, or pass comm=")
        try:
            from mpi4py import MPI
            return _MPIComm(MPI.COMM_WORLD)
        except ImportError:
            return _SelfComm()
    try:
        from mpi4py import MPI
        if isinstance(comm, MPI.Comm):
            return _MPIComm(comm)
    except ImportError:
        pass
    try:
        import torch.distributed as dist
        if isinstance(comm, dist.ProcessGroup):
            return _TorchComm(comm)
    except (ImportError, AttributeError):
        pass
    raise UsageError(f"comm must be an mpi4py communicator, a torch.distributed "
                     f"ProcessGroup or None, not {type(comm).__name__}", code="usage")


# ---- the model's facts: segments and their token counts from the inputs ----------------

def _shape(x):
    return tuple(x.shape) if hasattr(x, "shape") else None


def _arg(sig, name, args, kwargs):
    if name in kwargs:
        return kwargs[name]
    params = list(sig.parameters)[1:] if list(sig.parameters)[:1] == ["self"] else \
        list(sig.parameters)
    if name in params:
        i = params.index(name)
        if i < len(args):
            return args[i]
    return None


def _tokens_flux(model, cfg, get):
    hs, ehs = get("hidden_states"), get("encoder_hidden_states")
    if hs is None or hs.dim() != 3:
        raise UsageError(f"{type(model).__name__}: hidden_states must be [B, tokens, C] (the "
                         "pipeline's packed latents)", code="usage")
    text = ehs.shape[1] if ehs is not None else None
    return hs.shape[0], hs.shape[1], text


def _tokens_flux2(model, cfg, get):
    if get("kv_cache") is not None or (get("num_ref_tokens") or 0) > 0 or \
            get("kv_cache_mode") is not None:
        raise UnsupportedError("Flux2Transformer2DModel with kv_cache_mode / num_ref_tokens / "
                               "kv_cache (Flux2KleinKVPipeline): its reference tokens attend "
                               "only to themselves while text and image attend to all (a "
                               "block mask over [text, reference, image], or cached reference "
                               "K/V injected between text and image), which neither cpc's key "
                               "padding mask nor its segments express", code="unsupported",
                               hint="pass the reference images as image tokens without the KV "
                                    "cache (Flux2Pipeline / Flux2KleinPipeline: concatenated "
                                    "to hidden_states and img_ids, joint attention): "
                                    "parallelize runs those")
    return _tokens_flux(model, cfg, get)


def _tokens_wan(model, cfg, get):
    hs, ehs = get("hidden_states"), get("encoder_hidden_states")
    name = type(model).__name__
    if hs is None or hs.dim() != 5:
        raise UsageError(f"{name}: hidden_states must be [B, C, F, H, W]", code="usage")
    pt, ph, pw = cfg["patch_size"]
    B, _, F, H, W = hs.shape
    if F % pt or H % ph or W % pw:
        raise UsageError(f"{name}: latent {F}x{H}x{W} is not a multiple of "
                         f"patch_size {pt}x{ph}x{pw}", code="usage")
    text = ehs.shape[1] if ehs is not None else None
    return B, (F // pt) * (H // ph) * (W // pw), text


def _tokens_skyreels(model, cfg, get):
    if (cfg.get("num_frame_per_block") or 1) > 1:
        raise UnsupportedError("SkyReelsV2Transformer3DModel with num_frame_per_block "
                               f"{cfg.get('num_frame_per_block')} (causal_block_size > 1: the "
                               "diffusion-forcing pipelines' asynchronous mode): its "
                               "self-attention is block-causal over frames (an [S, S] mask: "
                               "neither cpc's key padding mask nor its token-causal mask)",
                               code="unsupported",
                               hint="causal_block_size=1 (synchronous diffusion forcing, "
                                    "ar_step=0) or the non-forcing pipelines run through "
                                    "parallelize")
    ts = get("timestep")
    if get("enable_diffusion_forcing") and (ts is None or ts.dim() != 2):
        raise UsageError("SkyReelsV2Transformer3DModel with enable_diffusion_forcing: timestep "
                         "must be [B, latent frames]", code="usage")
    return _tokens_wan(model, cfg, get)


def _install_skyreels(par, model):
    """SkyReels-V2 diffusion forcing (enable_diffusion_forcing, synchronous): the timestep is
    per frame, so every modulation is per token.  The blocks' (timestep_proj [B, 6, S, D])
    is split with the video (_plan_skyreels); the output norm's is built from the whole
    video's per-token embedding outside any module, so the video is gathered before
    norm_out and the output norm and projection run whole on every rank (proj_out's gather
    then has nothing to do).  Training: each rank passes 1/P of the output's gradient back
    and the gather's backward sums the ranks' parts (the parameter gradients summed over
    the ranks are then the single-process ones)."""
    def forcing():
        return par.current is not None and par.comm.size > 1 and par.get is not None and \
            bool(par.get("enable_diffusion_forcing"))

    def video(st):
        return [n for n, _ in st.segments if n != "text"][0]

    def pre(mod, args):
        if not forcing():
            return None
        st = par.current
        x = args[0]
        return (_gather_fn().apply(x, st, video(st), 1, True),) + tuple(args[1:])

    def post(mod, args, out):
        if not forcing() or par.current.mode != "training":
            return out
        return _scale_grad(out, 1.0 / par.comm.size)
    par.handles.append(model.norm_out.register_forward_pre_hook(pre))
    par.handles.append(model.proj_out.register_forward_hook(post))


def _plan_skyreels():
    # as diffusers' Wan _cp_plan (SkyReels-V2 is Wan's architecture; diffusers 0.42.1 gives
    # it none): the video and its RoPE split, the text whole for the cross-attention
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput
    c = ContextParallelInput(split_dim=1, expected_dims=4, split_output=True)
    return {"rope": {0: c, 1: c},
            "blocks.0": {"hidden_states": ContextParallelInput(split_dim=1, expected_dims=3,
                                                               split_output=False)},
            # diffusion forcing: the per-token modulation [B, 6, S, D] (else [B, 6, D])
            "blocks.*": {"temb": ContextParallelInput(split_dim=2, expected_dims=4,
                                                      split_output=False)},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def _plan_chroma():
    # FLUX's _cp_plan (Chroma is FLUX's architecture; diffusers 0.42.1 gives it none)
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    def c(dims, dim):
        return ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=False)
    return {"": {"hidden_states": c(3, 1), "encoder_hidden_states": c(3, 1),
                 "img_ids": c(2, 0), "txt_ids": c(2, 0)},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def _mask_chroma(get, B, tokens, text):
    """ChromaTransformer2DModel: attention_mask [B, text + image] (ChromaPipeline: the T5
    padding but one token masked, the image all valid), in the plan's [text, image] order;
    its processors mask the padding as keys and queries, cpc as keys (a padded text row is
    seen by no other token)."""
    m = get("attention_mask")
    if m is None:
        return None, None
    if m.dim() != 2 or m.shape[1] != text + tokens:
        raise UsageError(f"ChromaTransformer2DModel: attention_mask must be [B, {text} + "
                         f"{tokens}] (text, then image), got {tuple(m.shape)}", code="usage")
    return m != 0, None


def _tokens_cosmos(model, cfg, get):
    hs, ehs = get("hidden_states"), get("encoder_hidden_states")
    if isinstance(ehs, tuple):
        # Cosmos 2.5: (text, image context); the image context is a second cross-attention
        # per block (its own K/V, whole on every rank: a kv plan of its length)
        if len(ehs) != 2 or ehs[0] is None:
            raise UsageError("CosmosTransformer3DModel: encoder_hidden_states as a tuple must "
                             "be (text, image context)", code="usage")
        if get("attention_mask") is not None:
            raise UnsupportedError("CosmosTransformer3DModel with an image context and an "
                                   "attention_mask: its processor takes the mask as a (text "
                                   "mask, image mask) pair, which cpc.diffusers does not map",
                                   code="unsupported", hint="pass attention_mask=None (as "
                                   "the Cosmos 2.5 pipelines do)")
        ehs = ehs[0]
    if get("block_controlnet_hidden_states") is not None:
        raise UnsupportedError("CosmosTransformer3DModel with controlnet residuals is not "
                               "split by cpc.diffusers", code="unsupported")
    if hs is None or hs.dim() != 5:
        raise UsageError("CosmosTransformer3DModel: hidden_states must be [B, C, F, H, W]",
                         code="usage")
    pt, ph, pw = cfg["patch_size"]
    B, _, F, H, W = hs.shape
    if F % pt or H % ph or W % pw:
        raise UsageError(f"CosmosTransformer3DModel: latent {F}x{H}x{W} is not a multiple of "
                         f"patch_size {pt}x{ph}x{pw}", code="usage")
    return B, (F // pt) * (H // ph) * (W // pw), ehs.shape[1] if ehs is not None else None


def _mask_cosmos(get, B, tokens, text):
    """CosmosTransformer3DModel: attention_mask [B, T] (1 = the text token takes part) for
    the cross-attention's keys."""
    m = get("attention_mask")
    if m is None or m.dim() != 2:
        return None, None
    return None, m != 0


def _plan_cosmos():
    # the video, its RoPE ([S, D]) and the per-token inputs of every block (the learnable
    # positional embedding; temb / embedded_timestep when the timestep is per frame)
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    def c(dims, dim=1, out=False):
        return ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=out)
    return {"transformer_blocks.0": {"hidden_states": c(3)},
            "transformer_blocks.*": {"extra_pos_emb": c(3), "temb": c(3),
                                     "embedded_timestep": c(3)},
            "rope": {0: c(2, 0, True), 1: c(2, 0, True)},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def _tokens_easyanimate(model, cfg, get):
    hs, ehs, t5 = get("hidden_states"), get("encoder_hidden_states"), \
        get("encoder_hidden_states_t5")
    if hs is None or hs.dim() != 5 or ehs is None:
        raise UsageError("EasyAnimateTransformer3DModel: hidden_states [B, C, F, H, W] and "
                         "encoder_hidden_states are required", code="usage")
    p = cfg["patch_size"]
    B, _, F, H, W = hs.shape
    if H % p or W % p:
        raise UsageError(f"EasyAnimateTransformer3DModel: latent {H}x{W} is not a multiple "
                         f"of patch_size {p}", code="usage")
    return B, F * (H // p) * (W // p), ehs.shape[1] + (t5.shape[1] if t5 is not None else 0)


def _plan_easyanimate():
    return _plan_blocks("transformer_blocks.0", rope="rope_embedding")


def _tokens_allegro(model, cfg, get):
    hs, ehs = get("hidden_states"), get("encoder_hidden_states")
    if get("attention_mask") is not None:
        raise UnsupportedError("AllegroTransformer3DModel with a video attention_mask: not "
                               "routed through cpc.diffusers (AllegroPipeline passes none)",
                               code="unsupported")
    if get("image_rotary_emb") is None:
        raise UsageError("AllegroTransformer3DModel: image_rotary_emb is required (as "
                         "AllegroPipeline passes it)", code="usage")
    if hs is None or hs.dim() != 5:
        raise UsageError("AllegroTransformer3DModel: hidden_states must be [B, C, F, H, W]",
                         code="usage")
    pt, p = cfg["patch_size_t"], cfg["patch_size"]
    B, _, F, H, W = hs.shape
    if F % pt or H % p or W % p:
        raise UsageError(f"AllegroTransformer3DModel: latent {F}x{H}x{W} is not a multiple "
                         f"of the patch {pt}x{p}x{p}", code="usage")
    return B, (F // pt) * (H // p) * (W // p), ehs.shape[1] if ehs is not None else None


def _plan_allegro():
    # image_rotary_emb = ((freqs_t, freqs_h, freqs_w): tables, kept), (grid_t, grid_h,
    # grid_w): each token's positions [1, S], split) as AllegroPipeline makes it
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput
    g = ContextParallelInput(split_dim=1, expected_dims=2, split_output=False)
    return {"": {"image_rotary_emb": [None, [g, g, g]]},
            "transformer_blocks.0": {"hidden_states": ContextParallelInput(
                split_dim=1, expected_dims=3, split_output=False)},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def _tokens_qwen(model, cfg, get):
    hs, ehs = get("hidden_states"), get("encoder_hidden_states")
    if hs is None or hs.dim() != 3:
        raise UsageError("QwenImageTransformer2DModel: hidden_states must be [B, tokens, C] "
                         "(the pipeline's packed latents)", code="usage")
    if ehs is None:
        raise UsageError("QwenImageTransformer2DModel: encoder_hidden_states is required",
                         code="usage")
    return hs.shape[0], hs.shape[1], ehs.shape[1]


def _tokens_image_bchw(model, cfg, get):
    """SD3: hidden_states [B, C, H, W] latents, patchified by the model (patch_size)."""
    hs, ehs = get("hidden_states"), get("encoder_hidden_states")
    if hs is None or hs.dim() != 4:
        raise UsageError(f"{type(model).__name__}: hidden_states must be [B, C, H, W]",
                         code="usage")
    p = cfg["patch_size"]
    B, _, H, W = hs.shape
    if H % p or W % p:
        raise UsageError(f"{type(model).__name__}: latent {H}x{W} is not a multiple of "
                         f"patch_size {p}", code="usage")
    return B, (H // p) * (W // p), ehs.shape[1] if ehs is not None else None


def _tokens_hunyuan(model, cfg, get):
    hs, ehs = get("hidden_states"), get("encoder_hidden_states")
    if hs is None or hs.dim() != 5:
        raise UsageError("HunyuanVideoTransformer3DModel: hidden_states must be "
                         "[B, C, F, H, W]", code="usage")
    pt, p = cfg["patch_size_t"], cfg["patch_size"]
    B, _, F, H, W = hs.shape
    if F % pt or H % p or W % p:
        raise UsageError(f"HunyuanVideoTransformer3DModel: latent {F}x{H}x{W} is not a "
                         f"multiple of the patch {pt}x{p}x{p}", code="usage")
    return B, (F // pt) * (H // p) * (W // p), ehs.shape[1] if ehs is not None else None


def _tokens_cogvideox(model, cfg, get):
    hs, ehs = get("hidden_states"), get("encoder_hidden_states")
    if hs is None or hs.dim() != 5:
        raise UsageError("CogVideoXTransformer3DModel: hidden_states must be "
                         "[B, F, C, H, W]", code="usage")
    p, pt = cfg["patch_size"], cfg.get("patch_size_t") or 1
    B, F, _, H, W = hs.shape
    if H % p or W % p:
        raise UsageError(f"CogVideoXTransformer3DModel: latent {H}x{W} is not a multiple of "
                         f"patch_size {p}", code="usage")
    if ehs is None:
        raise UsageError("CogVideoXTransformer3DModel: encoder_hidden_states is required",
                         code="usage")
    return B, -(-F // pt) * (H // p) * (W // p), ehs.shape[1]


def _tokens_ltx(model, cfg, get):
    hs, ehs = get("hidden_states"), get("encoder_hidden_states")
    if hs is None or hs.dim() != 3:
        raise UsageError("LTXVideoTransformer3DModel: hidden_states must be [B, tokens, C] "
                         "(the pipeline's packed latents)", code="usage")
    return hs.shape[0], hs.shape[1], ehs.shape[1] if ehs is not None else None


def _mask_qwen(get, B, tokens, text):
    """QwenDoubleStreamAttnProcessor2_0: keys = [text (encoder_hidden_states_mask), image
    (all)]; the mask's True/nonzero = the key takes part (compute_text_seq_len_from_mask)."""
    m = get("encoder_hidden_states_mask")
    if m is None:
        return None, None
    torch = _torch()
    return torch.cat([m.to(torch.bool), torch.ones(B, tokens, dtype=torch.bool,
                                                   device=m.device)], 1), None


def _mask_hunyuan(get, B, tokens, text):
    """HunyuanVideoTransformer3DModel.forward: keys = [video (all), text]; text key j takes
    part iff j < encoder_attention_mask[b].sum() (the model counts the valid tokens and
    masks every position after video + that count)."""
    m = get("encoder_attention_mask")
    if m is None:
        return None, None
    torch = _torch()
    n = m.sum(dim=1, dtype=torch.int)
    txt = torch.arange(text, device=m.device)[None, :] < n[:, None]
    return torch.cat([torch.ones(B, tokens, dtype=torch.bool, device=m.device), txt], 1), None


def _mask_ltx(get, B, tokens, text):
    """LTXVideoTransformer3DModel: the cross-attention's keys are the whole text,
    encoder_attention_mask [B, T] (1 = valid; the model turns it into a -10000 bias)."""
    m = get("encoder_attention_mask")
    if m is None or m.dim() != 2:
        return None, None
    return None, m != 0


def _plan_blocks(text_first_block, rope=None, rope_dim=0, root=None):
    """A _cp_plan for a model diffusers gives none (or whose text cpc places otherwise):
    the image/video and text hidden states split at the first block's inputs, RoPE
    split where given, proj_out gathered."""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    def cpi(dims, dim=1, out=False):
        return ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=out)
    plan = {text_first_block: {"hidden_states": cpi(3), "encoder_hidden_states": cpi(3)},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}
    if rope is not None:
        plan[rope] = {0: cpi(2, rope_dim, True), 1: cpi(2, rope_dim, True)}
    if root:
        plan[""] = root()
    return plan


def _plan_hunyuan():
    # the token refiner (context_embedder) runs on the whole text before the blocks
    return _plan_blocks("transformer_blocks.0", rope="rope")


def _plan_cogvideox():
    from diffusers.models._modeling_parallel import ContextParallelInput

    def root():
        c = ContextParallelInput(split_dim=0, expected_dims=2, split_output=False)
        return {"image_rotary_emb": [c, c]}
    return _plan_blocks("transformer_blocks.0", root=root)


def _plan_cogview4():
    # the RoPE of the image (cos, sin [S, D]): from its rope module, or an input
    from diffusers.models._modeling_parallel import ContextParallelInput

    def root():
        c = ContextParallelInput(split_dim=0, expected_dims=2, split_output=False)
        return {"image_rotary_emb": [c, c]}
    return _plan_blocks("transformer_blocks.0", rope="rope", root=root)


def _plan_sd3():
    return _plan_blocks("transformer_blocks.0")


def _plan_ltx():
    # diffusers' own LTX _cp_plan also splits the text (its cross-attention gathers it
    # again); cpc keeps the text whole on every rank (a `kv:` plan): only the video and
    # its RoPE are split
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    def cpi(out=False):
        return ContextParallelInput(split_dim=1, expected_dims=3, split_output=out)
    return {"": {"hidden_states": cpi()}, "rope": {0: cpi(True), 1: cpi(True)},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def _tokens_hunyuan15(model, cfg, get):
    hs, ehs = get("hidden_states"), get("encoder_hidden_states")
    if hs is None or hs.dim() != 5:
        raise UsageError("HunyuanVideo15Transformer3DModel: hidden_states must be "
                         "[B, C, F, H, W]", code="usage")
    pt, p = cfg["patch_size_t"], cfg["patch_size"]
    B, _, F, H, W = hs.shape
    if F % pt or H % p or W % p:
        raise UsageError(f"HunyuanVideo15Transformer3DModel: latent {F}x{H}x{W} is not a "
                         f"multiple of the patch {pt}x{p}x{p}", code="usage")
    parts = [get("encoder_hidden_states"), get("encoder_hidden_states_2"),
             get("image_embeds")]
    if any(x is None for x in parts):
        raise UsageError("HunyuanVideo15Transformer3DModel: encoder_hidden_states, "
                         "encoder_hidden_states_2 and image_embeds are required",
                         code="usage")
    return B, (F // pt) * (H // p) * (W // p), sum(x.shape[1] for x in parts)


def _mask_hunyuan15(get, B, tokens, text):
    """HunyuanVideo15Transformer3DModel.forward puts each sample's valid text first (SigLIP
    image tokens: all valid, or none when image_embeds are all zero (text-to-video); byT5;
    Qwen), the padding after; its processor masks the padded tokens as keys AND queries.
    cpc masks them as keys: a padded row's own output differs, but no other token sees it
    (masked keys in every layer; the output is the video's)."""
    torch = _torch()
    m1, m2 = get("encoder_attention_mask"), get("encoder_attention_mask_2")
    img = get("image_embeds")
    n = m1.to(torch.bool).sum(1) + m2.to(torch.bool).sum(1)
    if not bool(torch.all(img == 0)):
        n = n + img.shape[1]
    txt = torch.arange(text, device=m1.device)[None, :] < n[:, None]
    return torch.cat([torch.ones(B, tokens, dtype=torch.bool, device=m1.device), txt], 1), None


def _plan_hunyuan15():
    from diffusers.models._modeling_parallel import ContextParallelInput
    plan = _plan_blocks("transformer_blocks.0", rope="rope")
    # the processor builds its (local) mask from it; cpc's key mask replaces that mask
    plan["transformer_blocks.*"] = {"encoder_attention_mask": ContextParallelInput(
        split_dim=1, expected_dims=2, split_output=False)}
    return plan


def _tokens_mochi(model, cfg, get):
    hs, ehs = get("hidden_states"), get("encoder_hidden_states")
    if hs is None or hs.dim() != 5:
        raise UsageError("MochiTransformer3DModel: hidden_states must be [B, C, F, H, W]",
                         code="usage")
    p = cfg["patch_size"]
    B, _, F, H, W = hs.shape
    if H % p or W % p:
        raise UsageError(f"MochiTransformer3DModel: latent {H}x{W} is not a multiple of "
                         f"patch_size {p}", code="usage")
    if ehs is None:
        raise UsageError("MochiTransformer3DModel: encoder_hidden_states is required",
                         code="usage")
    return B, F * (H // p) * (W // p), ehs.shape[1]


def _mask_mochi(get, B, tokens, text):
    """MochiAttnProcessor2_0 attends, per batch element, over [video, the valid text
    tokens] and gives the padded text rows zeros.  With the valid tokens first (the
    tokenizer pads on the right) that is [video, text] with the padding as masked keys:
    the padded rows' outputs then differ, but no other token ever sees them (masked keys
    in every layer; the output is the video's), so the model's output and gradients are
    the same.  A mask with a hole (valid tokens after padding) would reorder the text
    stream in diffusers' processor: refused."""
    m = get("encoder_attention_mask")
    if m is None:
        raise UsageError("MochiTransformer3DModel: encoder_attention_mask is required",
                         code="usage")
    torch = _torch()
    m = m.to(torch.bool)
    n = m.sum(dim=1)
    if bool((m != (torch.arange(text, device=m.device)[None, :] < n[:, None])).any()):
        raise UnsupportedError("MochiTransformer3DModel: an encoder_attention_mask whose "
                               "valid tokens are not all first (its processor would move "
                               "them): cpc.diffusers needs right-padded text",
                               code="unsupported")
    return torch.cat([torch.ones(B, tokens, dtype=torch.bool, device=m.device), m], 1), None


def _args_mochi(args, kwargs):
    """The processor's own selection of the valid text is disabled (every local text token
    is kept): cpc masks the padding as keys instead (_mask_mochi)."""
    torch = _torch()
    ehs = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
    ones = torch.ones(ehs.shape[:2], dtype=torch.bool, device=ehs.device)
    if "attention_mask" in kwargs or len(args) < 3:
        kwargs["attention_mask"] = ones
    else:
        args = args[:2] + (ones,) + args[3:]
    return args, kwargs


def _plan_mochi():
    from diffusers.models._modeling_parallel import ContextParallelInput
    c = ContextParallelInput(split_dim=0, expected_dims=3, split_output=True)
    plan = _plan_blocks("transformer_blocks.0")
    plan["rope"] = {0: c, 1: c}
    return plan


def _blocks_only(name):
    """The attention modules of the transformer blocks (not a text refiner's)."""
    return name.startswith(("transformer_blocks.", "single_transformer_blocks."))


def _install_hunyuan(par, model):
    """HunyuanVideo-I2V (image_condition_type 'token_replace'): every block modulates the
    first latent frame's tokens apart, as the first num_tokens rows of its hidden states
    (the model passes first_frame_num_tokens, a count over the whole video).  On a rank
    they are the first rows of its video shard (each rank holds one run of the video):
    the blocks are given this rank's count of them."""
    if model.config.get("image_condition_type") != "token_replace":
        return
    counts = {}                               # (shape key, n) -> this rank's count

    def pre(mod, args, kwargs):
        st = par.current
        if st is None:
            return None
        i = 6                                 # (hidden, ehs, temb, mask, rope, tr_emb, n)
        n = kwargs.get("num_tokens", args[i] if len(args) > i else None)
        if n is None:
            return None
        k = counts.get((st.key, n))
        if k is None:
            seg = [s for s, _ in st.segments if s != "text"][0]
            pos = st.layout.pos[(seg, par.comm.rank)]
            k = sum(1 for t in pos if t < n)
            if any(t >= n for t in pos[:k]):
                raise UnsupportedError("HunyuanVideoTransformer3DModel token_replace: this "
                                       "rank's first-frame tokens are not the first rows of "
                                       "its video shard (a layout with several runs)",
                                       code="unsupported")
            counts[(st.key, n)] = k
        if "num_tokens" in kwargs:
            kwargs = dict(kwargs, num_tokens=k)
        else:
            args = args[:i] + (k,) + args[i + 1:]
        return args, kwargs
    for m in list(model.transformer_blocks) + list(model.single_transformer_blocks):
        par.handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))


# ---- models that assemble their joint sequence themselves (Lumina2, Z-Image), HiDream,
# LTX-2 ----------------------------------------------------------------------------------

def _packed(name):
    return UnsupportedError(
        f"{name} with replicate_text=True: the model packs each sample's caption and image "
        "into one sequence itself (per-sample lengths), which cpc.diffusers splits as one "
        "sequence; a replicated text segment is not available for it", code="unsupported",
        hint="drop replicate_text (its token counts are multiples of 32 for Z-Image; "
             "ring_anything / ulysses_anything take any Lumina2 length)")


def _ceil32(n):
    # Z-Image pads the image and the caption each to a multiple of SEQ_MULTI_OF = 32
    return -(-n // 32) * 32


def _zimage_lengths(get):
    """(image tokens X, [caption tokens of each sample]) of ZImageTransformer2DModel's basic
    mode, both padded to multiples of 32 as patchify_and_embed pads them (the padding
    rows are x_pad_token / cap_pad_token: real keys, not masked)."""
    name = "ZImageTransformer2DModel"
    x, cap = get("x"), get("cap_feats")
    if not isinstance(x, (list, tuple)) or not x or not isinstance(cap, (list, tuple)) or \
            len(cap) != len(x):
        raise UsageError(f"{name}: x and cap_feats must be lists of one tensor per sample (as "
                         "ZImagePipeline passes them)", code="usage")
    if isinstance(x[0], (list, tuple)) or get("siglip_feats") is not None or \
            get("image_noise_mask") is not None:
        raise UnsupportedError(f"{name} in omni mode (x as a list of images per sample, "
                               "siglip_feats, image_noise_mask): its [caption, images, SigLIP] "
                               "sequence with per-token modulation is not routed through "
                               "cpc.diffusers; the basic mode (one image per sample, "
                               "ZImagePipeline) is", code="unsupported",
                               hint="call the model in its basic mode (x and cap_feats one tensor "
                                    "per sample), or run the omni mode without parallelize "
                                    "(cpc.diffusers.unparallelize)")
    if get("controlnet_block_samples") is not None:
        raise UnsupportedError(f"{name} with controlnet_block_samples: residuals over the whole "
                               "unified sequence added between layers, which cpc.diffusers "
                               "does not split", code="unsupported")
    p, pf = get("patch_size") or 2, get("f_patch_size") or 1
    xl = []
    for xi in x:
        if xi.dim() != 4:
            raise UsageError(f"{name}: each x[i] must be [C, F, H, W], got {tuple(xi.shape)}",
                             code="usage")
        _, F, H, W = xi.shape
        if F % pf or H % p or W % p:
            raise UsageError(f"{name}: latent {F}x{H}x{W} is not a multiple of the patch "
                             f"{pf}x{p}x{p}", code="usage")
        xl.append(_ceil32((F // pf) * (H // p) * (W // p)))
    if len(set(xl)) > 1:
        raise UnsupportedError(f"{name}: samples of different image sizes in one call (image "
                               f"tokens {xl} after padding to 32): each sample's caption would "
                               "start at another position; cpc.diffusers needs one image token "
                               "count per call (ZImagePipeline makes one)", code="unsupported",
                               hint="call the transformer once per image size")
    return xl[0], [_ceil32(int(c.shape[0])) for c in cap]


def _tokens_zimage(model, cfg, get):
    X, cl = _zimage_lengths(get)
    return len(cl), X, max(cl)


def _mask_zimage(get, B, tokens, text):
    """ZImageTransformer2DModel._build_unified_sequence: sample i is [image X, its caption
    C_i], zero-padded to the batch's longest with attn_mask[i, :X + C_i] = True (keys only):
    the plan's [image, text] segments with the text padding of shorter captions masked."""
    torch = _torch()
    _, cl = _zimage_lengths(get)
    n = torch.tensor([tokens + c for c in cl])
    return torch.arange(tokens + text)[None, :] < n[:, None], None


def _plan_zimage():
    # the unified [image, caption] sequence the model builds (its refiners attend within
    # the image or the caption alone, in one process): split at the first joint layer,
    # its RoPE at every layer, the final layer's output gathered (all over _Spec.whole)
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    def c(dims):
        return ContextParallelInput(split_dim=1, expected_dims=dims, split_output=False)
    return {"layers.0": {"x": c(3)}, "layers.*": {"freqs_cis": c(3)},
            "all_final_layer.*": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def _lumina2_caption(get):
    """Each sample's caption length as Lumina2Transformer2DModel counts it
    (encoder_attention_mask.sum(1): the valid tokens, taken as the first ones)."""
    torch = _torch()
    hs, ehs, m = get("hidden_states"), get("encoder_hidden_states"), \
        get("encoder_attention_mask")
    if hs is None or hs.dim() != 4 or ehs is None or m is None or m.dim() != 2:
        raise UsageError("Lumina2Transformer2DModel: hidden_states [B, C, H, W], "
                         "encoder_hidden_states and encoder_attention_mask [B, T] are required",
                         code="usage")
    return [int(v) for v in m.to(torch.bool).sum(1).tolist()]


def _tokens_lumina2(model, cfg, get):
    hs = get("hidden_states")
    L = _lumina2_caption(get)
    p = cfg["patch_size"]
    B, _, H, W = hs.shape
    if H % p or W % p:
        raise UsageError(f"Lumina2Transformer2DModel: latent {H}x{W} is not a multiple of "
                         f"patch_size {p}", code="usage")
    return B, (H // p) * (W // p), max(L)


def _mask_lumina2(get, B, tokens, text):
    """Lumina2Transformer2DModel.forward packs sample i as [its L_i caption tokens, the
    image], zero-padded to the batch's longest (attention_mask[i, :L_i + N], keys only).
    The plan's segments are [text max L_i, image N]: a shorter caption's image starts
    earlier, inside the nominal text segment; every segment is split alike (no replicated
    one), so the attention is the key mask's alone."""
    torch = _torch()
    n = torch.tensor([c + tokens for c in _lumina2_caption(get)])
    return torch.arange(tokens + text)[None, :] < n[:, None], None


def _plan_lumina2():
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    def c(dims):
        return ContextParallelInput(split_dim=1, expected_dims=dims, split_output=False)
    return {"layers.0": {"hidden_states": c(3)}, "layers.*": {"image_rotary_emb": c(3)},
            "norm_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def _joint_layers(name):
    """Lumina2 / Z-Image: the joint layers (not the caption / image refiners)."""
    return name.startswith("layers.")


def _tokens_hidream(model, cfg, get):
    name = "HiDreamImageTransformer2DModel"
    hs = get("hidden_states")
    if get("hidden_states_masks") is not None or hs is None or hs.dim() != 4:
        raise UsageError(f"{name}: hidden_states must be [B, C, H, W] latents, as "
                         "HiDreamImagePipeline passes them (pre-patchified hidden_states with "
                         "hidden_states_masks / img_ids / img_sizes are not routed)",
                         code="usage")
    t5, ll = get("encoder_hidden_states_t5"), get("encoder_hidden_states_llama3")
    if t5 is None or ll is None:
        raise UsageError(f"{name}: encoder_hidden_states_t5 and encoder_hidden_states_llama3 "
                         "are required", code="usage")
    p = cfg["patch_size"]
    B, _, H, W = hs.shape
    if H % p or W % p:
        raise UsageError(f"{name}: latent {H}x{W} is not a multiple of patch_size {p}",
                         code="usage")
    # a non-square image is padded to max_seq tokens (patchify)
    N = (H // p) * (W // p) if H == W else model.max_seq
    # every block's text: T5 + the last Llama layer (carried) + the block's own Llama layer
    return B, N, t5.shape[1] + 2 * ll[0].shape[1]


def _plan_hidream():
    # the text (T5 + Llama layers, re-assembled in every block) is whole on every rank
    # (replicate_text, forced): only the image is split, at the first double-stream block;
    # its zeroed-key mask (non-square images) per block; the RoPE over [image, text] and
    # the single-stream blocks' [image, text] mask as this rank's rows of the whole
    # sequence ([image_r, text]: the order the model's own concatenations give)
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    def c(dims, out=False):
        return ContextParallelInput(split_dim=1, expected_dims=dims, split_output=out)
    return {"double_stream_blocks.0": {"hidden_states": c(3)},
            "double_stream_blocks.*": {"hidden_states_masks": c(2)},
            "single_stream_blocks.*": {"hidden_states_masks": c(2)},
            "pe_embedder": {0: c(None, True)},
            "final_layer": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def _tokens_ltx2(model, cfg, get):
    name = "LTX2VideoTransformer3DModel"
    if get("video_self_attention_mask") is not None:
        raise UnsupportedError(f"{name} with video_self_attention_mask (IC-LoRA: a weight per "
                               "video token pair, [B, S, S]): not a key padding mask; not "
                               "routed through cpc.diffusers", code="unsupported",
                               hint="drop video_self_attention_mask (the IC-LoRA conditioning), "
                                    "or run this call without parallelize "
                                    "(cpc.diffusers.unparallelize)")
    hs, ehs, ts = get("hidden_states"), get("encoder_hidden_states"), get("timestep")
    if hs is None or hs.dim() != 3 or ehs is None:
        raise UsageError(f"{name}: hidden_states [B, tokens, C] (the pipeline's packed video "
                         "latents) and encoder_hidden_states are required", code="usage")
    if ts is not None and ts.dim() == 2 and ts.shape[1] != hs.shape[1]:
        raise UsageError(f"{name}: a per-token timestep must be [B, {hs.shape[1]}] (one per "
                         f"video token), got {tuple(ts.shape)}", code="usage")
    return hs.shape[0], hs.shape[1], ehs.shape[1]


def _plan_ltx2(cfg):
    # the video split (its per-token timestep too: image-to-video), the video RoPE of the
    # self-attention and of the audio<->video attentions split; the text and the audio
    # stream whole on every rank; the video output gathered
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput
    split = cfg.get("rope_type", "interleaved") == "split"     # [B, H, S, D/2] then
    r = ContextParallelInput(split_dim=2 if split else 1, expected_dims=4 if split else 3,
                             split_output=True)

    def c(dims):
        return ContextParallelInput(split_dim=1, expected_dims=dims, split_output=False)
    return {"": {"hidden_states": c(3), "timestep": c(2)},
            "rope": {0: r, 1: r}, "cross_attn_rope": {0: r, 1: r},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def _sites_ltx2(name):
    """LTX-2's attentions: the video self-attention (attn1) and its text cross-attention
    (attn2) through cpc; video-to-audio (queries the audio, whole on every rank; keys the
    video) over the all-gathered video K/V; the audio self- and text attentions and
    audio-to-video (queries this rank's video tokens, keys the whole audio) are exact
    locally (torch), every rank holding the whole audio stream."""
    if not name.startswith("transformer_blocks."):
        return False
    return {"attn1": "main", "attn2": "cross",
            "video_to_audio_attn": "gather_kv"}.get(name.rsplit(".", 1)[-1], False)


def _install_ltx2(par, model):
    """The audio output: computed whole on every rank, so in training each rank passes
    1/P of its gradient back (the parameter gradients summed over the ranks are then the
    single-process ones, as for the video rows each rank owns)."""
    def post(mod, args, output):
        st = par.current
        if st is None or st.mode != "training" or par.comm.size == 1:
            return output
        return _scale_grad(output, 1.0 / par.comm.size)
    par.handles.append(model.audio_proj_out.register_forward_hook(post))


def _tokens_cogview4(model, cfg, get):
    if get("attention_mask") is not None:
        raise UnsupportedError("CogView4Transformer2DModel with attention_mask: its processor "
                               "adds the 0/1 outer product of the [text, image] validity to "
                               "the logits (a bias of +1 between valid tokens, not a mask), "
                               "which cpc's key padding mask (-inf) does not express",
                               code="unsupported",
                               hint="pass no attention_mask, as CogView4Pipeline does (its "
                                    "prompt padding tokens take part as keys)")
    return _tokens_image_bchw(model, cfg, get)


class _Spec:
    """What parallelize needs to know of one transformer class.

    tokens(model, cfg, get) -> (batch, image/video tokens, text tokens or None);
    kind: "joint" (text and image in one attention) or "self" (video self-attention, the
    text in a cross-attention: the processor is given encoder_hidden_states);
    cp_plan: None (the class's own _cp_plan) or a function returning one (same format);
    text_outputs: split outputs {(module id, index)} that are text (QwenImage's pos_embed
    output 1: the text RoPE); key_mask(get, batch, tokens, text) -> (joint/self key mask
    [B, S] in the plan's segment order, cross key mask [B, T]), bool, None where all keys
    take part: the model's own masks at the attention are then replaced by it (cpc's
    `mask: key_padding`); sites(name): which attention modules run through cpc (default
    all); check(model): refuses configurations not routed; per_sample: the processor
    attends each batch element in its own call (Mochi): the plan's batch is 1 and the
    b-th call of one processor call is element b; proc_args(args, kwargs) -> (args,
    kwargs): the processor's arguments while cpc answers (Mochi: no text selection);
    image_self: a joint model's processor called without encoder_hidden_states is an
    image-only self-attention (SD3.5 Medium's attn2): a plan of the image segment alone,
    used where it holds every rank's image tokens where the joint plan does.
    sites(name) may also name the site's kind: "main", "cross", "gather_kv" (queries
    whole on every rank, K/V this rank's tokens: all-gathered, then torch's attention;
    LTX-2's video-to-audio) or False (stays local).  whole: cp_plan module ids whose
    splits and gather cover the whole joint sequence (the model assembles it itself:
    Lumina2, Z-Image; HiDream's RoPE), this rank's rows of every segment.
    replicate: True = the text is always whole on every rank (replicate_text forced:
    HiDream), False = replicate_text refused (a callable giving the error), None = the
    user's choice.  install(par, model): model-specific hooks (LTX-2's audio output)."""

    def __init__(self, tokens, kind, cp_plan=None, text_outputs=(), key_mask=None,
                 sites=None, check=None, per_sample=False, proc_args=None,
                 image_self=False, whole=(), replicate=None, install=None):
        self.tokens, self.kind, self.cp_plan = tokens, kind, cp_plan
        self.text_outputs = set(text_outputs)
        self.key_mask, self.sites, self.check = key_mask, sites, check
        self.per_sample, self.proc_args = per_sample, proc_args
        self.image_self = image_self
        self.whole, self.replicate, self.install = set(whole), replicate, install


_MODELS = {
    "FluxTransformer2DModel": _Spec(_tokens_flux, "joint"),
    "Flux2Transformer2DModel": _Spec(_tokens_flux2, "joint"),
    "ChromaTransformer2DModel": _Spec(_tokens_flux, "joint", cp_plan=_plan_chroma,
                                      key_mask=_mask_chroma),
    "WanTransformer3DModel": _Spec(_tokens_wan, "self"),
    "SkyReelsV2Transformer3DModel": _Spec(_tokens_skyreels, "self", cp_plan=_plan_skyreels,
                                          install=_install_skyreels),
    "ChronoEditTransformer3DModel": _Spec(_tokens_wan, "self"),   # Wan's, its own _cp_plan
    "AllegroTransformer3DModel": _Spec(_tokens_allegro, "self", cp_plan=_plan_allegro,
                                       key_mask=_mask_ltx),
    "CosmosTransformer3DModel": _Spec(_tokens_cosmos, "self", cp_plan=_plan_cosmos,
                                      key_mask=_mask_cosmos),
    "QwenImageTransformer2DModel": _Spec(_tokens_qwen, "joint",
                                         text_outputs={("pos_embed", 1)},
                                         key_mask=_mask_qwen),
    "HunyuanVideoTransformer3DModel": _Spec(_tokens_hunyuan, "joint", cp_plan=_plan_hunyuan,
                                            key_mask=_mask_hunyuan, sites=_blocks_only,
                                            install=_install_hunyuan),
    "CogVideoXTransformer3DModel": _Spec(_tokens_cogvideox, "joint", cp_plan=_plan_cogvideox),
    "EasyAnimateTransformer3DModel": _Spec(_tokens_easyanimate, "joint",
                                           cp_plan=_plan_easyanimate),
    "CogView4Transformer2DModel": _Spec(_tokens_cogview4, "joint", cp_plan=_plan_cogview4),
    "ZImageTransformer2DModel": _Spec(_tokens_zimage, "joint", cp_plan=_plan_zimage,
                                      key_mask=_mask_zimage, sites=_joint_layers,
                                      whole=("layers.0", "layers.*", "all_final_layer.*"),
                                      replicate=lambda: _packed("ZImageTransformer2DModel")),
    "Lumina2Transformer2DModel": _Spec(_tokens_lumina2, "joint", cp_plan=_plan_lumina2,
                                       key_mask=_mask_lumina2, sites=_joint_layers,
                                       whole=("layers.0", "layers.*", "norm_out"),
                                       replicate=lambda: _packed("Lumina2Transformer2DModel")),
    "HiDreamImageTransformer2DModel": _Spec(_tokens_hidream, "joint", cp_plan=_plan_hidream,
                                            whole=("single_stream_blocks.*", "pe_embedder"),
                                            replicate=True),
    "LTX2VideoTransformer3DModel": _Spec(_tokens_ltx2, "self", cp_plan=_plan_ltx2,
                                         key_mask=_mask_ltx, sites=_sites_ltx2,
                                         install=_install_ltx2),
    "SD3Transformer2DModel": _Spec(_tokens_image_bchw, "joint", cp_plan=_plan_sd3,
                                   image_self=True),
    "LTXVideoTransformer3DModel": _Spec(_tokens_ltx, "self", cp_plan=_plan_ltx,
                                        key_mask=_mask_ltx),
    "HunyuanVideo15Transformer3DModel": _Spec(_tokens_hunyuan15, "joint",
                                              cp_plan=_plan_hunyuan15,
                                              key_mask=_mask_hunyuan15, sites=_blocks_only),
    "MochiTransformer3DModel": _Spec(_tokens_mochi, "joint", cp_plan=_plan_mochi,
                                     key_mask=_mask_mochi, per_sample=True,
                                     proc_args=_args_mochi),
}
# classes parallelize refuses: (why, what to do)
_REFUSED = {
    "SanaTransformer2DModel": (
        "its self-attention is linear (ReLU) attention (SanaLinearAttnProcessor2_0: no "
        "softmax over the keys), which cpc prices (cpc.from_diffusers gives model.attention: "
        "linear) but does not run: cpc's kernels compute softmax attention",
        "run Sana without context parallelism; cpc.from_diffusers + cpc.check still price "
        "its plans"),
    "SanaVideoTransformer3DModel": (
        "its self-attention is linear (ReLU) attention (SanaLinearAttnProcessor3_0: no "
        "softmax over the keys), which cpc's kernels (softmax attention) do not run",
        "run Sana-Video without context parallelism"),
}
_TEXT_NAMES = ("encoder_hidden_states", "txt_ids", "encoder_attention_mask",
               "encoder_hidden_states_mask")


# ---- the per-shape state ------------------------------------------------------------

class _Layout:
    """Where this rank's tokens of each segment are: index tensors into the segment."""

    def __init__(self, artifact, segments, P, rank):
        torch = _torch()
        self.P = P
        self.pos = {}        # (segment, rank) -> list of positions inside the segment
        off = 0
        bounds = []
        for name, n in segments:
            bounds.append((name, off, n))
            off += n
        for r in range(P):
            runs = artifact.shard_runs(r)
            for name, o, n in bounds:
                ps = []
                for s, ln in runs:
                    a, b = max(s, o), min(s + ln, o + n)
                    if a < b:
                        ps.extend(range(a - o, b - o))
                self.pos[(name, r)] = ps
        # "*": this rank's rows of the whole sequence, every segment (a replicated one
        # whole), in the order of its q/out shard: for models that assemble the joint
        # sequence themselves (Lumina2, Z-Image) or whose RoPE covers [image, text]
        # (HiDream)
        for r in range(P):
            self.pos[("*", r)] = [t for s, ln in artifact.shard_runs(r)
                                 for t in range(s, s + ln)]
        bounds.append(("*", 0, off))
        self.rank = rank
        self.index = {name: torch.tensor(self.pos[(name, rank)], dtype=torch.long)
                      for name, _, _ in bounds}
        self.counts = {name: [len(self.pos[(name, r)]) for r in range(P)]
                       for name, _, _ in bounds}
        self.order = {name: torch.tensor([p for r in range(P) for p in self.pos[(name, r)]],
                                         dtype=torch.long) for name, _, _ in bounds}
        self.total = {name: n for name, _, n in bounds}

    def split(self, x, seg, dim):
        idx = self.index[seg]
        if x.shape[dim] != self.total[seg]:
            raise UsageError(f"cannot split a tensor of shape {tuple(x.shape)} on dim {dim}: "
                             f"the {seg} segment has {self.total[seg]} tokens", code="usage")
        n = len(idx)
        if n and int(idx[-1]) - int(idx[0]) == n - 1:      # one run: a view
            return x.narrow(dim, int(idx[0]), n)
        return x.index_select(dim, idx.to(x.device))


_GATHER = None


def _gather_fn():
    global _GATHER
    if _GATHER is not None:
        return _GATHER
    torch = _torch()

    class Gather(torch.autograd.Function):
        """x: this rank's rows of segment seg (dim `dim`) -> the whole segment, global
        order.  Backward: this rank's rows of the incoming gradient, which is the same on
        every rank (a gathered output: every rank's loss sees it whole); with summed=True
        the incoming gradients are each rank's part (a gathered K/V every rank attends
        with its own queries) and are summed over the ranks first."""
        @staticmethod
        def forward(ctx, x, state, seg, dim, summed=False):
            ctx.state, ctx.seg, ctx.dim, ctx.summed = state, seg, dim, summed
            lay = state.layout
            xm = x.detach().movedim(dim, 0).contiguous()
            allrows = state.comm.allgather_rows(xm, lay.counts[seg])
            full = torch.empty_like(allrows)
            full[lay.order[seg].to(full.device)] = allrows
            return full.movedim(0, dim).contiguous()

        @staticmethod
        def backward(ctx, g):
            lay = ctx.state.layout
            if ctx.summed:
                g = g.contiguous().clone()
                ctx.state.comm.allreduce_(g)
                return g.index_select(ctx.dim, lay.index[ctx.seg].to(g.device)), \
                    None, None, None, None
            gi = g.index_select(ctx.dim, lay.index[ctx.seg].to(g.device))
            if lay.P > 1 and all(c == lay.total[ctx.seg] for c in lay.counts[ctx.seg]):
                # a replicated segment: every rank holds it whole, so each keeps 1/P of
                # its gradient (see _cpc_attention)
                gi = gi * (1.0 / lay.P)
            return gi, None, None, None, None

    _GATHER = Gather
    return Gather


class _Shape:
    """One (shapes, dtype, mode) of the model: its plans, artifacts, ranks, layout."""

    def __init__(self, par, key, tokens, text, batch, dtype, mode):
        self.key, self.tokens, self.text, self.batch = key, tokens, text, batch
        self.dtype, self.mode = dtype, mode
        self.main = None           # (artifact, attention)
        self.cross = {}            # kv tokens -> (artifact, attention)
        self.image_self = None     # (artifact, attention): a joint model's image-only one
        self.plan = None
        self.layout = None
        self.comm = par.comm


_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


class _Parallel:
    """The state parallelize() attaches to a transformer (transformer._cpc)."""

    def __init__(self, model, parallel_config, comm, backend, timeout_s, plan_kw):
        self.model = model
        self.cls = type(model).__name__
        self.cfg = dict(model.config)
        self.cfg.setdefault("_class_name", self.cls)
        self.parallel_config = parallel_config
        self.comm = comm
        # a model on a GPU: device tensors through cpc, NCCL between the GPUs (cpc/_nccl.py)
        p0 = next(model.parameters(), None)
        if backend == "auto" and p0 is not None and p0.is_cuda:
            backend = "cuda"
        self.backend, self.timeout_s, self.plan_kw = backend, timeout_s, plan_kw
        self.shapes = {}
        self.current = None
        self.handles = []
        self.sites = {}             # id(attention module) -> "main" | "cross"
        self.sig = inspect.signature(type(model).forward)
        self.spec = _MODELS[self.cls]
        self.tokens_fn, self.kind = self.spec.tokens, self.spec.kind
        self.masks = (None, None)   # this call's key masks (joint/self, cross), global
        self.get = None             # this call's argument getter, inside a forward
        self._mask_shards = {}      # this call's key masks as this rank's shards
        self.last_plan = None
        self.calls = 0              # attention calls answered by cpc (all shapes)
        self.gathered_calls = 0     # "gather_kv" sites' calls (LTX-2's video-to-audio)
        self.attention_s = 0.0      # wall seconds inside those calls (forward)

    # -- plans --------------------------------------------------------------------
    def _plan(self, attention, tokens, text, batch, dtype, mode, mask="none"):
        return _D.from_diffusers(self.parallel_config, self.cfg, tokens=tokens,
                                 text_tokens=text, batch=batch, dtype=dtype,
                                 attention=attention, mode=mode, mask=mask,
                                 name=f"{self.cls}-{attention}", **self.plan_kw)

    def _compile(self, plan):
        from ._plan import compile as cpc_compile
        try:
            return cpc_compile(plan)
        except PlanError as e:
            raise _diffusers_hints(e, plan, self.parallel_config,
                                   replicate_ok=not callable(self.spec.replicate)) from None

    def _state(self, tokens, text, batch, dtype, mode, masked=(False, False)):
        key = (tokens, text, batch, dtype, mode, masked)
        st = self.shapes.get(key)
        if st is not None:
            return st
        st = _Shape(self, key, tokens, text, batch, dtype, mode)
        st.cross_mask = "key_padding" if masked[1] else "none"
        mask = "key_padding" if masked[0] else "none"
        if self.kind == "joint":
            if text is None:
                raise UsageError(f"{self.cls}: encoder_hidden_states is required (joint "
                                 "attention over text and image tokens)", code="usage")
            plan = self._plan("joint", tokens, text, batch, dtype, mode, mask)
        else:
            plan = self._plan("self", tokens, None, batch, dtype, mode, mask)
        self.last_plan = st.plan = plan
        art = self._compile(plan)
        if art.world_size != self.comm.size:
            raise UsageError(
                f"the plan needs {art.world_size} processes (ring_degree x ulysses_degree) "
                f"but the communicator has {self.comm.size}", code="usage",
                hint=f"launch {art.world_size} processes (mpirun -np {art.world_size} ... or "
                     f"torchrun --nproc-per-node {art.world_size} ...), or change the "
                     "ContextParallelConfig's ring_degree / ulysses_degree")
        segs = [(s["name"], _seg_tokens(s, tokens)) for s in plan["input"]["segments"]]
        st.layout = _Layout(art, segs, self.comm.size, self.comm.rank)
        st.segments = segs
        # replicated segments (replicate_text=True): their rows among this rank's own
        # tokens (the attention's q/k/v/out rows), for the training scaling in
        # _cpc_attention
        st.rep_rows = None
        rep = [(o, n) for (o, n), sd in zip(_bounds(segs), plan["input"]["segments"])
               if sd.get("split") == "replicate"]
        if rep and self.comm.size > 1:
            rows, t = [], 0
            for s0, n in art.shard_runs(self.comm.rank):
                for g in range(s0, s0 + n):
                    if any(o <= g < o + m for o, m in rep):
                        rows.append(t)
                    t += 1
            st.rep_rows = torch_long(rows)
        st.main = (art, self.comm.attention(art, self.backend, self.timeout_s))
        if self.kind == "self" and text is not None and any(
                v == "cross" for v in self.sites.values()):
            st.cross[text] = self._cross(tokens, text, batch, dtype, mode, st.cross_mask)
        self.shapes[key] = st
        return st

    def image_self(self, st):
        """(artifact, attention) of the image-only self-attention of a joint model at
        shape st: the joint plan without its text segment.  Its layout must put every
        rank's image tokens where the joint plan does (the hidden states are split once,
        for the joint plan): else UnsupportedError."""
        if st.image_self is not None:
            return st.image_self
        import copy
        p = copy.deepcopy(dict(st.plan))
        p["input"]["segments"] = [s for s in p["input"]["segments"] if s["name"] != "text"]
        p["input"]["mask"] = "none"
        p["name"] = p["name"] + "-image-self"
        p = _D.DiffusersPlan(p, parallel_fields=getattr(st.plan, "parallel_fields", None))
        art = self._compile(p)
        seg = p["input"]["segments"][0]["name"]
        for r in range(self.comm.size):
            mine = [t for a, n in art.shard_runs(r) for t in range(a, a + n)]
            if mine != st.layout.pos[(seg, r)]:
                raise UnsupportedError(
                    f"{self.cls}: its image-only attention (dual attention) needs the "
                    f"{seg} tokens of each rank to be the same in the joint and the "
                    f"image-only plan; at this shape ({st.tokens} {seg} + {st.text} text "
                    f"tokens, variant {art.variant}) rank {r} differs", code="unsupported",
                    hint="a token count that divides by the degrees (no *_anything)")
        st.image_self = (art, self.comm.attention(art, self.backend, self.timeout_s))
        return st.image_self

    def _cross(self, tokens, kv, batch, dtype, mode, mask="none"):
        plan = self._plan("cross", tokens, kv, batch, dtype, mode, mask)
        art = self._compile(plan)
        return art, self.comm.attention(art, self.backend, self.timeout_s)

    # -- hooks ----------------------------------------------------------------------
    def pre_forward(self, module, args, kwargs):
        torch = _torch()

        def get(name):
            return _arg(self.sig, name, args, kwargs)

        batch, tokens, text = self.tokens_fn(module, self.cfg, get)
        dtype = _DTYPES.get(str(module.dtype))
        if dtype is None:
            raise UsageError(f"{self.cls} is {module.dtype}: cpc runs bf16, fp16 or fp32 "
                             "(transformer.to(torch.bfloat16))", code="usage")
        records = torch.is_grad_enabled() and (
            any(p.requires_grad for p in module.parameters()) or
            any(isinstance(a, torch.Tensor) and a.requires_grad
                for a in list(args) + list(kwargs.values())))
        mode = "training" if records else "inference"
        masks = (None, None)
        if self.spec.key_mask is not None:
            masks = self.spec.key_mask(get, batch, tokens, text)
            # a mask where every key takes part is no mask (so ring_anything, CP019, runs)
            masks = tuple(None if m is None or bool(m.all()) else m for m in masks)
        masked = (masks[0] is not None, masks[1] is not None)
        if self.spec.per_sample:
            batch = 1               # one attention call per batch element
        key = (tokens, text, batch, dtype, mode, masked)
        keys = self.comm.allgather_obj(key)
        if any(k != key for k in keys):
            raise UsageError(f"ranks called {self.cls} with different shapes/modes: "
                             + "; ".join(f"rank {r}: tokens {k[0]}, text {k[1]}, batch "
                                         f"{k[2]}, {k[3]}, {k[4]}"
                                         for r, k in enumerate(keys)),
                             code="usage", hint="every rank passes the full, same-shaped "
                             "inputs (as with diffusers' enable_parallelism)")
        self.current = self._state(tokens, text, batch, dtype, mode, masked)
        self.masks, self._mask_shards = masks, {}
        self.get = get             # this call's arguments (for _Spec.install hooks)
        return None

    def post_forward(self, module, args, kwargs, output):
        self.current = None
        self.get = None
        self.masks, self._mask_shards = (None, None), {}
        return None

    def mask_shard(self, which, art, row=None):
        """This call's key mask (which: 0 joint/self, 1 cross; row: one batch element, for
        per_sample models) as this rank's shard for `art` (uint8 [B, S_r]), or None when
        the plan has no key mask."""
        if not art.key_padding:
            return None
        m = self._mask_shards.get((which, row))
        if m is None:
            torch = _torch()
            g = self.masks[which]
            if g is None:
                raise UsageError(f"{self.cls}: the plan has a key mask but this call has none",
                                 code="usage")
            if row is not None:
                g = g[row:row + 1]
            m = art.shard(g.to(torch.uint8).cpu().contiguous(), self.comm.rank, "mask")
            self._mask_shards[(which, row)] = m
        return m


def _bounds(segs):
    """(offset, tokens) of each (name, tokens) segment in global order."""
    out, off = [], 0
    for _, n in segs:
        out.append((off, n))
        off += n
    return out


def torch_long(xs):
    return _torch().tensor(xs, dtype=_torch().long)


def _seg_tokens(seg, tokens):
    if "tokens" in seg:
        return seg["tokens"]
    return tokens


# ---- _cp_plan: split / gather hooks ----------------------------------------------------

def _segment_of(name):
    return "text" if isinstance(name, str) and name in _TEXT_NAMES else "main"


def _install_cp_plan(par, model):
    torch = _torch()
    fn = par.spec.cp_plan
    plan = getattr(type(model), "_cp_plan", None) if fn is None else \
        fn(par.cfg) if inspect.signature(fn).parameters else fn()
    if not plan:
        raise UnsupportedError(f"{par.cls} has no _cp_plan (diffusers' context-parallel "
                               "metadata): cpc.diffusers cannot tell which inputs carry the "
                               "sequence", code="unsupported")
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput
    Gather = _gather_fn()

    def seg_name(state, which):
        if which in ("text", "*"):
            return which
        return [n for n, _ in state.segments if n != "text"][0]

    def do_split(x, cpi, which):
        st = par.current
        if st is None or not isinstance(x, torch.Tensor):
            return x
        if cpi.expected_dims is not None and x.dim() != cpi.expected_dims:
            return x
        seg = seg_name(st, which)
        if seg not in st.layout.index:
            return x
        return st.layout.split(x, seg, cpi.split_dim)

    def split_nested(v, cpi, which):
        """do_split over a (nested) list/tuple of inputs and their ContextParallelInputs
        (None: kept as is)."""
        if cpi is None:
            return v
        if isinstance(cpi, (list, tuple)):
            if not isinstance(v, (list, tuple)):
                return v
            return type(v)(split_nested(x, c, which) for x, c in zip(v, cpi))
        return do_split(v, cpi, which)

    def do_gather(x, cpo, whole=False):
        st = par.current
        if st is None or not isinstance(x, torch.Tensor):
            return x
        if cpo.expected_dims is not None and x.dim() != cpo.expected_dims:
            return x
        if st.layout.P == 1:
            return x
        seg = "*" if whole else seg_name(st, "main")
        lay = st.layout
        if x.shape[cpo.gather_dim] == lay.total[seg] != lay.counts[seg][lay.rank]:
            return x               # whole already (SkyReels' diffusion forcing: _install)
        return Gather.apply(x, st, seg, cpo.gather_dim)

    for module_id, entry in plan.items():
        mods = _find_modules(model, module_id)
        # a module whose splits / gather cover the whole joint sequence (_Spec.whole)
        whole = module_id in par.spec.whole
        for m in mods:
            if isinstance(entry, dict):
                ins = {k: v for k, v in entry.items()
                       if isinstance(v, ContextParallelInput) and not v.split_output
                       or isinstance(v, (list, tuple))}
                outs = {k: v for k, v in entry.items()
                        if isinstance(v, ContextParallelInput) and v.split_output}
                if ins:
                    sig = inspect.signature(type(m).forward)
                    params = [p for p in sig.parameters][1:]

                    def pre(mod, args, kwargs, ins=ins, params=params, whole=whole):
                        args = list(args)
                        for name, cpi in ins.items():
                            if name in kwargs:
                                v = kwargs[name]
                            elif isinstance(name, str) and name in params and \
                                    params.index(name) < len(args):
                                v = args[params.index(name)]
                            else:
                                continue
                            v = split_nested(v, cpi, "*" if whole else _segment_of(name))
                            if name in kwargs:
                                kwargs[name] = v
                            else:
                                args[params.index(name)] = v
                        return tuple(args), kwargs
                    h = m.register_forward_pre_hook(pre, with_kwargs=True)
                    par.handles.append(h)
                if outs:
                    def post(mod, args, output, outs=outs, module_id=module_id,
                             whole=whole):
                        single = isinstance(output, torch.Tensor)
                        lst = [output] if single else list(output)
                        for i, cpi in outs.items():
                            lst[i] = do_split(lst[i], cpi,
                                              "*" if whole else
                                              "text" if (module_id, i) in
                                              par.spec.text_outputs else "main")
                        return lst[0] if single else type(output)(lst)
                    par.handles.append(m.register_forward_hook(post))
            else:
                cpos = [entry] if isinstance(entry, ContextParallelOutput) else list(entry)

                def gpost(mod, args, output, cpos=cpos, whole=whole):
                    single = isinstance(output, torch.Tensor)
                    lst = [output] if single else list(output)
                    for i, cpo in enumerate(cpos):
                        if cpo is not None:
                            lst[i] = do_gather(lst[i], cpo, whole)
                    return lst[0] if single else type(output)(lst)
                par.handles.append(m.register_forward_hook(gpost))


def _find_modules(model, name):
    if name == "":
        return [model]
    mods = [model]
    for atom in name.split("."):
        nxt = []
        for m in mods:
            if atom == "*":
                nxt.extend(list(m.values()) if hasattr(m, "values") else list(m))
            else:
                nxt.append(getattr(m, atom) if not atom.isdigit() else m[int(atom)])
        mods = nxt
    return mods


# ---- attention: processors and dispatch_attention_fn ------------------------------------

def _wrapped_class(cls):
    sub = _WRAPPED_CLASSES.get(cls)
    if sub is not None:
        return sub
    orig = cls.__call__
    params = list(inspect.signature(orig).parameters)[2:]   # after self, attn

    @functools.wraps(orig)
    def __call__(self, attn, *args, **kwargs):
        # a self-attention model's processor given encoder_hidden_states is its text
        # cross-attention (Wan attn2, LTX attn2)
        ehs = kwargs.get("encoder_hidden_states")
        if ehs is None and "encoder_hidden_states" in params and \
                params.index("encoder_hidden_states") < len(args):
            ehs = args[params.index("encoder_hidden_states")]
        par = getattr(attn, "_cpc_parallel", None)
        if par is not None and par.current is not None and par.spec.proc_args is not None:
            args, kwargs = par.spec.proc_args(args, kwargs)
        tok = _CURRENT.set((attn, ehs is not None, [0]))
        try:
            return orig(self, attn, *args, **kwargs)
        finally:
            _CURRENT.reset(tok)

    sub = type(cls.__name__, (cls,), {"__call__": __call__, "_cpc_original_class": cls,
                                      "__module__": cls.__module__})
    _WRAPPED_CLASSES[cls] = sub
    return sub


def _running():
    """(attention module, par, is the processor's text cross-attention) of the processor
    running now, when its model is parallelized and inside a forward; else None."""
    cur = _CURRENT.get()
    if cur is None:
        return None
    attn, has_ehs, count = cur
    par = getattr(attn, "_cpc_parallel", None)
    if par is None or par.current is None:
        return None
    if par.spec.per_sample:
        row = count[0]
        count[0] += 1
        return attn, par, (has_ehs, row)
    return attn, par, (has_ehs, None)


class _FunctionalProxy:
    """torch.nn.functional as a processor module sees it (its `F`): every name is
    torch's, except scaled_dot_product_attention, which a parallelized model's processor
    (CogVideoX, SD3, ... in diffusers' attention_processor.py call torch's SDPA directly)
    gets answered by cpc; every other caller gets torch's."""

    def __init__(self, F):
        self._F = F

    def __getattr__(self, name):
        return getattr(self._F, name)

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, **kw):
        run = _running()
        if run is None:
            return self._F.scaled_dot_product_attention(
                query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=is_causal, scale=scale, **kw)
        if kw.get("enable_gqa"):
            raise UnsupportedError("SDPA with enable_gqa through cpc.diffusers",
                                   code="unsupported")
        attn, par, has_ehs = run
        # SDPA's [B, H, S, D] <-> cpc's [B, S, H, D] (views: cpc takes strided tensors)
        out = _cpc_attention(par, attn, query.transpose(1, 2), key.transpose(1, 2),
                             value.transpose(1, 2), attn_mask, dropout_p, is_causal, scale,
                             has_ehs)
        return out.transpose(1, 2)


def _patch_dispatch(modname):
    """Routes the attention of processor module `modname` through cpc: its
    dispatch_attention_fn and (where it calls torch's SDPA itself) its `F`."""
    if modname in _PATCHED_MODULES:
        return
    mod = sys.modules[modname]
    orig = getattr(mod, "dispatch_attention_fn", None)
    F = getattr(mod, "F", None)
    torch = _torch()
    has_f = F is torch.nn.functional
    if orig is None and not has_f:
        raise UnsupportedError(f"{modname} calls neither diffusers' dispatch_attention_fn "
                               "nor torch's scaled_dot_product_attention (as F): its "
                               "attention cannot be routed through cpc", code="unsupported")
    if orig is not None:
        @functools.wraps(orig)
        def dispatch(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                     scale=None, enable_gqa=False, attention_kwargs=None, *, backend=None,
                     parallel_config=None):
            run = _running()
            if run is None:
                return orig(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                            attention_kwargs=attention_kwargs, backend=backend,
                            parallel_config=parallel_config)
            attn, par, has_ehs = run
            return _cpc_attention(par, attn, query, key, value, attn_mask, dropout_p,
                                  is_causal, scale, has_ehs)
        mod.dispatch_attention_fn = dispatch
    if has_f:
        mod.F = _FunctionalProxy(F)
    _PATCHED_MODULES[modname] = (orig, F if has_f else None)


def _cpc_attention(par, attn, q, k, v, attn_mask, dropout_p, is_causal, scale,
                   has_ehs=(False, None)):
    has_ehs, row = has_ehs
    st = par.current
    if par.sites.get(id(attn)) == "gather_kv":
        return _gathered_kv_attention(par, st, q, k, v, attn_mask, dropout_p, is_causal,
                                      scale)
    par.calls += 1
    if attn_mask is not None and par.spec.key_mask is None:
        raise UnsupportedError(f"{par.cls}: an attention mask reached the attention; cpc's "
                               "plan for this model has none", code="unsupported")
    # a model with key_mask: its own mask at the attention (built from this rank's tokens,
    # or a bias) is replaced by the call's key mask, sharded as cpc's plan holds the keys
    if dropout_p or is_causal:
        raise UnsupportedError("dropout / causal attention through cpc.diffusers is not "
                               "supported", code="unsupported")
    D = q.shape[-1]
    if scale is not None and abs(scale - D ** -0.5) > 1e-12 * D ** -0.5:
        raise UnsupportedError(f"softmax scale {scale} (cpc.diffusers runs 1/sqrt(head_dim))",
                               code="unsupported")
    cross = par.sites.get(id(attn)) == "cross" or (par.kind == "self" and has_ehs)
    rep = False
    if cross:
        n = k.shape[1]
        if n not in st.cross:
            # another K/V than the text (Cosmos 2.5's image context): no key mask
            st.cross[n] = par._cross(st.tokens, n, st.batch, st.dtype, st.mode,
                                     st.cross_mask if n == st.text else "none")
        art, att = st.cross[n]
        mask = par.mask_shard(1, art, row)
        if st.mode == "training" and par.comm.size > 1:
            # cpc returns the whole dK/dV of the replicated text on every rank (the sum
            # over all ranks' queries, docs/BACKWARD.md 3.7); the text's projections ran
            # on every rank, so each rank keeps 1/P of it: the parameter gradients summed
            # over the ranks (allreduce_grads) are then the single-process ones.  P is a
            # power of two or not: the scaling is one rounding at most.
            k, v = _scale_grad(k, 1.0 / par.comm.size), _scale_grad(v, 1.0 / par.comm.size)
    elif par.kind == "joint" and not has_ehs and par.spec.image_self:
        art, att = par.image_self(st)
        mask = None
    else:
        art, att = st.main
        mask = par.mask_shard(0, art, row)
        rep = st.mode == "training" and par.comm.size > 1 and \
            getattr(st, "rep_rows", None) is not None
    if rep:
        # replicated text (SPEC section 10): every rank holds the text and ran its
        # projections, so each rank's text gradients are 1/P of the single-process ones
        # (allreduce_grads sums them back).  cpc's backward takes the text's dout equal
        # on every rank and returns the whole text gradient on every rank: the incoming
        # dout of the text rows is multiplied by P (1/P of it on every rank -> the whole),
        # and the text rows' dq/dk/dv by 1/P on the way out.
        P = par.comm.size
        q, k, v = (_scale_rows(x, st.rep_rows, 1.0 / P) for x in (q, k, v))
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise UsageError(f"q/k/v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})",
                         code="usage")
    if art.kv_heads < art.heads and art.tp_degree == 1 and k.shape[2] == art.heads:
        # GQA the processor expanded (Lumina2: each K/V head repeated heads/kv_heads
        # times, head h = g * n + j): cpc takes the plan's K/V heads (one of each group;
        # the repeat's backward sums the group's gradients back)
        n = art.heads // art.kv_heads
        k, v = k[:, :, ::n], v[:, :, ::n]
    t0 = time.perf_counter()
    if _DTYPES.get(str(q.dtype)) != st.dtype:
        torch = _torch()
        want = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[st.dtype]
        out = att(q.to(want), k.to(want), v.to(want), mask=mask).to(q.dtype)
    else:
        out = att(q, k, v, mask=mask)
    par.attention_s += time.perf_counter() - t0
    if rep:
        out = _scale_rows(out, st.rep_rows, float(P))
    return out


def _gathered_kv_attention(par, st, q, k, v, attn_mask, dropout_p, is_causal, scale):
    """A "gather_kv" site (LTX-2's video-to-audio attention): queries whole on every rank
    (the audio), keys/values this rank's video tokens.  The video K/V are all-gathered into
    global order and torch's attention runs locally: exact; its backward sums each rank's
    K/V gradient over the ranks and keeps this rank's rows (every rank's audio queries
    attend every video key).  Costs an all-gather of this attention's video K/V per layer
    (its heads x head_dim: the audio's)."""
    torch = _torch()
    par.gathered_calls += 1
    if is_causal or dropout_p:
        raise UnsupportedError("dropout / causal attention through cpc.diffusers is not "
                               "supported", code="unsupported")
    if st.layout.P > 1:
        seg = [n for n, _ in st.segments if n != "text"][0]
        G = _gather_fn()
        k, v = G.apply(k, st, seg, 1, True), G.apply(v, st, seg, 1, True)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask,
        scale=scale)
    return out.transpose(1, 2)


_SCALE = None


def _scale_grad(x, f):
    """x in the forward; the incoming gradient times f in the backward."""
    global _SCALE
    if _SCALE is None:
        torch = _torch()

        class Scale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, f):
                ctx.f = f
                return x.view_as(x)

            @staticmethod
            def backward(ctx, g):
                return g * ctx.f, None
        _SCALE = Scale
    return _SCALE.apply(x, f) if x.requires_grad else x


_SCALE_ROWS = None


def _scale_rows(x, rows, f):
    """x ([B, T, ...]) in the forward; in the backward the incoming gradient with its
    rows `rows` (dim 1) times f."""
    global _SCALE_ROWS
    if _SCALE_ROWS is None:
        torch = _torch()

        class ScaleRows(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, rows, f):
                ctx.rows, ctx.f = rows, f
                return x.view_as(x)

            @staticmethod
            def backward(ctx, g):
                g = g.clone()
                idx = ctx.rows.to(g.device)
                g.index_copy_(1, idx, g.index_select(1, idx) * ctx.f)
                return g, None, None
        _SCALE_ROWS = ScaleRows
    return _SCALE_ROWS.apply(x, rows, f) if x.requires_grad else x


def _install_attention(par, model):
    n = 0
    for name, m in model.named_modules():
        proc = getattr(m, "processor", None)
        if proc is None or not callable(proc):
            continue
        site = par.spec.sites(name) if par.spec.sites is not None else True
        if not site:
            continue
        cls = type(proc)
        if getattr(cls, "_cpc_original_class", None) is None:
            _patch_dispatch(cls.__module__)
            proc.__class__ = _wrapped_class(cls)
        m._cpc_parallel = par
        par.sites[id(m)] = site if isinstance(site, str) else \
            "cross" if getattr(m, "is_cross_attention", False) else "main"
        n += 1
    if n == 0:
        raise UnsupportedError(f"{par.cls} has no attention module with a processor",
                               code="unsupported")
    return n


def _diffusers_hints(e, plan, parallel_config, replicate_ok=True):
    """A PlanError of a from_diffusers plan (its diagnostics already name the
    ContextParallelConfig fields, cpc.compile does that); keeps the plan on it.  For a
    model that refuses replicate_text (Lumina2, Z-Image) the hint offering it is dropped."""
    e.plan = plan
    if not replicate_ok:
        for d in e.diagnostics:
            if d.hint and "replicate_text=True" in d.hint:
                d.hint = re.sub(r";? ?or keep the text whole on every rank.*?cpc\.from_diffusers\)",
                                "", d.hint) or None
    first = next((d for d in e.diagnostics if d.severity == "error"), None)
    if first is not None:
        e.hint = first.hint    # .hint as the first error's, in the same words
    return e


# ---- public API ---------------------------------------------------------------------------

def parallelize(transformer, parallel_config, comm=None, *, backend="auto", timeout_s=None,
                **plan_kw):
    """Parallelize a diffusers transformer's attention with cpc (see the module doc).

    transformer: FluxTransformer2DModel, Flux2Transformer2DModel, ChromaTransformer2DModel,
      WanTransformer3DModel, SkyReelsV2Transformer3DModel (synchronous diffusion forcing
      too), ChronoEditTransformer3DModel, CosmosTransformer3DModel (Cosmos 2.5's image
      context too), QwenImageTransformer2DModel, HunyuanVideoTransformer3DModel
      (text-to-video and I2V token_replace), CogVideoXTransformer3DModel,
      CogView4Transformer2DModel, SD3Transformer2DModel, EasyAnimateTransformer3DModel,
      AllegroTransformer3DModel, LTXVideoTransformer3DModel, LTX2VideoTransformer3DModel
      (video through cpc, audio whole on every rank), MochiTransformer3DModel,
      HunyuanVideo15Transformer3DModel, ZImageTransformer2DModel, Lumina2Transformer2DModel
      (per-sample packing: a key mask), HiDreamImageTransformer2DModel (text always whole)
      (_MODELS: how each is split and routed; _REFUSED: SanaTransformer2DModel, linear
      attention).  parallel_config: diffusers' ContextParallelConfig (or
      ParallelConfig, or a dict of its fields), as for cpc.from_diffusers.  comm: an mpi4py
      communicator, a torch.distributed ProcessGroup, or None (the launcher's world).
      backend / timeout_s: for cpc.Attention ("auto": "cuda" for a model on a CUDA device,
      whose ranks then talk over NCCL bootstrapped from comm).  plan_kw: more from_diffusers keywords
      (device=, steps=, replicate_text=True: the joint text whole on every rank, as
      xDiT runs it, inference only; ...).

    Afterwards every rank calls transformer(**inputs) with the full inputs and gets the
    full output.  Errors: cpc.UnsupportedError (another class, Sana, or a configuration
    of these that is not routed, naming the diffusers field and, in .hint, what runs:
    FLUX.2's reference-token KV cache, SkyReels' asynchronous diffusion forcing, CogView4's
    attention_mask, LTX-2's video_self_attention_mask, Z-Image's omni mode,
    replicate_text for Lumina2 / Z-Image or False for HiDream, SD3.5 Medium's image-only
    attention at a shape whose image split differs from the joint one's), ValueError (a
    ContextParallelConfig cpc cannot honour, at once); at the first call: cpc.PlanError /
    cpc.UsageError on every rank before any layer runs.  Returns the transformer."""
    cls = type(transformer).__name__
    if cls in _REFUSED:
        raise UnsupportedError(f"cpc.diffusers.parallelize: {cls}: {_REFUSED[cls][0]}",
                               code="unsupported", hint=_REFUSED[cls][1])
    if cls not in _MODELS:
        raise UnsupportedError(f"cpc.diffusers.parallelize: {cls} is not supported yet; "
                               f"supported: {', '.join(sorted(_MODELS))}", code="unsupported")
    if getattr(transformer, "_cpc", None) is not None:
        raise UsageError("this transformer is already parallelized (unparallelize first)",
                         code="usage")
    # plan_kw goes to from_diffusers at the first call: a misspelt keyword fails now, as
    # a Python call's would, not at the first forward (new-user trial)
    known = [k for k in inspect.signature(_D.from_diffusers).parameters
             if k not in ("parallel_config", "transformer_config")]
    for k in plan_kw:
        if k not in known:
            import difflib
            near = difflib.get_close_matches(k, known, n=1)
            raise TypeError(f"parallelize() got an unexpected keyword argument {k!r}"
                            + (f" (did you mean {near[0]!r}?)" if near else
                               f"; from_diffusers keywords: {', '.join(known)}"))
    _D.parallel_section(parallel_config)        # refuse what cpc cannot honour, now
    spec = _MODELS[cls]
    if spec.check is not None:
        spec.check(transformer)
    if spec.replicate is True:
        if plan_kw.get("replicate_text", True) is not True:
            raise UnsupportedError(
                f"{cls} with replicate_text=False: its blocks re-assemble the text from "
                "per-layer Llama states ([T5 + last Llama layer, the block's own layer]) in "
                "every block, so cpc.diffusers holds the text whole on every rank",
                code="unsupported", hint="drop replicate_text=False")
        plan_kw = dict(plan_kw, replicate_text=True)
    elif callable(spec.replicate) and plan_kw.get("replicate_text"):
        raise spec.replicate()
    c = _make_comm(comm)
    par = _Parallel(transformer, parallel_config, c, backend, timeout_s, plan_kw)
    # the shape pre-hook first: torch runs a module's pre-hooks in registration order and
    # _cp_plan's root entry (FLUX) splits the inputs in another pre-hook of the model
    par.handles.append(transformer.register_forward_pre_hook(par.pre_forward,
                                                             with_kwargs=True))
    try:
        _install_attention(par, transformer)
        _install_cp_plan(par, transformer)
        if spec.install is not None:
            spec.install(par, transformer)
    except BaseException:
        transformer._cpc = par
        unparallelize(transformer)
        raise
    par.handles.append(transformer.register_forward_hook(par.post_forward, with_kwargs=True))
    transformer._cpc = par
    return transformer


def is_parallelized(transformer):
    return getattr(transformer, "_cpc", None) is not None


def unparallelize(transformer):
    """Removes parallelize's hooks and closes its cpc ranks (collective)."""
    par = getattr(transformer, "_cpc", None)
    if par is None:
        return transformer
    for h in par.handles:
        h.remove()
    for m in transformer.modules():
        proc = getattr(m, "processor", None)
        orig = getattr(type(proc), "_cpc_original_class", None)
        if orig is not None:
            proc.__class__ = orig
        if hasattr(m, "_cpc_parallel"):
            del m._cpc_parallel
    for st in par.shapes.values():
        for _, att in [st.main] + list(st.cross.values()) + \
                ([st.image_self] if st.image_self else []):
            att.close()
    transformer._cpc = None
    return transformer


def allreduce_grads(transformer, comm=None):
    """Sums every parameter's .grad over the parallelized transformer's communicator
    (each rank's gradient covers its own tokens; the sum is the single-process gradient).
    Collective."""
    par = getattr(transformer, "_cpc", None)
    c = par.comm if par is not None and comm is None else _make_comm(comm)
    for p in transformer.parameters():
        if p.grad is not None:
            c.allreduce_(p.grad)
