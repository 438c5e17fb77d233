"""cpc.from_diffusers: a diffusers ContextParallelConfig and a transformer's
config.json -> a cpc plan dict.  Pure Python (no libcpc needed).

Model facts (token arithmetic, text length and position, masks) follow the models'
diffusers pipelines and attention processors; see python/README.md for the table and
its sources."""

import math
import warnings

from . import _validate

_CP_FIELDS = ("ring_degree", "ulysses_degree", "convert_to_fp32", "rotate_method",
              "ulysses_anything", "ring_anything", "mesh")


class _Model:
    def __init__(self, family, kind, heads, head_dim, layers, patch, vae, vae_t, text,
                 text_pos, mask, cross_text=None):
        self.family, self.kind = family, kind            # kind: image | video
        self.heads, self.head_dim, self.layers = heads, head_dim, layers
        self.patch, self.vae, self.vae_t = patch, vae, vae_t
        self.text, self.text_pos, self.mask = text, text_pos, mask  # text_pos: first|last|cross
        self.cross_text = cross_text


def _get(cfg, key, default=None, required=True):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if required and default is None:
        raise ValueError(f"transformer_config has no {key!r} (is this the model's "
                         "transformer/config.json?)")
    return default


def _int(v, what):
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise ValueError(f"{what} must be an integer, got {v!r}")
    return v


def _patch3(cfg):
    p = _get(cfg, "patch_size")
    if isinstance(p, (list, tuple)):
        if len(p) != 3:
            raise ValueError(f"patch_size {p!r}: expected [pt, ph, pw]")
        return [int(x) for x in p]
    pt = cfg.get("patch_size_t") or 1
    return [int(pt), int(p), int(p)]


def _class_of(cfg):
    name = cfg.get("_class_name")
    if name:
        return name
    # No _class_name (a config dict written by hand): recognise the families by keys.
    keys = set(cfg)
    if {"num_single_layers", "joint_attention_dim"} <= keys and "guidance_embeds" in keys:
        return "FluxTransformer2DModel"
    if {"num_single_layers", "num_refiner_layers"} <= keys:
        return "HunyuanVideoTransformer3DModel"
    if "max_text_seq_length" in keys:
        return "CogVideoXTransformer3DModel"
    if "caption_projection_dim" in keys:
        return "SD3Transformer2DModel"
    if "ffn_dim" in keys and "text_dim" in keys:
        return "WanTransformer3DModel"
    if "caption_channels" in keys and "cross_attention_dim" in keys:
        return "LTXVideoTransformer3DModel"
    raise ValueError("transformer_config has no _class_name and its keys match no known "
                     "model; supported: " + ", ".join(sorted(_FAMILIES)))


def _flux(cfg):
    # The pipeline packs 2x2 latent patches before the transformer (whose patch_size is
    # 1): tokens = (H / 8 / 2) x (W / 8 / 2).  T5 text (max_sequence_length 512) first.
    p = _int(_get(cfg, "patch_size", 1), "patch_size")
    return _Model("flux", "image", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"),
                  _get(cfg, "num_layers") + _get(cfg, "num_single_layers", 0), 2 * p, 8, None,
                  512, "first", "none")


def _qwen(cfg):
    # Packed 2x2 like FLUX (patch_size 2); Qwen2.5-VL text first, padded, with a key mask.
    return _Model("qwenimage", "image", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"),
                  _int(_get(cfg, "patch_size", 2), "patch_size"), 8, None, 512, "first",
                  "key_padding")


def _sd3(cfg):
    # JointAttnProcessor2_0 concatenates [image, text]: text (77 CLIP + 256 T5) last.
    return _Model("sd3", "image", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"),
                  _int(_get(cfg, "patch_size", 2), "patch_size"), 8, None, 77 + 256, "last",
                  "none")


def _cogvideox(cfg):
    # CogVideoXAttnProcessor2_0: [text, video]; text = max_text_seq_length (226).
    pt, ph, pw = _patch3(cfg)
    return _Model("cogvideox", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"), [pt, ph, pw], 8,
                  _get(cfg, "temporal_compression_ratio", 4),
                  _get(cfg, "max_text_seq_length", 226), "first", "none")


def _hunyuan(cfg):
    # HunyuanVideoAttnProcessor2_0: [video, text]; text 256 tokens with a key mask.
    return _Model("hunyuanvideo", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"),
                  _get(cfg, "num_layers") + _get(cfg, "num_single_layers", 0), _patch3(cfg), 8, 4,
                  256, "last", "key_padding")


def _wan(cfg):
    # Self-attention over the video; umT5 text (512) only in the cross-attention.
    # Wan2.2-TI2V-5B (48 latent channels) has a 16x spatial VAE.
    vae = 16 if cfg.get("in_channels") == 48 else 8
    return _Model("wan", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"), _patch3(cfg), vae, 4,
                  512, "cross", "none", cross_text=512)


def _ltx(cfg):
    # LTX-Video's VAE: 32x spatial, 8x temporal; patch 1x1x1; T5 text (128) in the
    # cross-attention only.
    return _Model("ltx-video", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"), _patch3(cfg), 32, 8,
                  128, "cross", "none", cross_text=128)


_FAMILIES = {
    "FluxTransformer2DModel": _flux,
    "QwenImageTransformer2DModel": _qwen,
    "SD3Transformer2DModel": _sd3,
    "CogVideoXTransformer3DModel": _cogvideox,
    "HunyuanVideoTransformer3DModel": _hunyuan,
    "WanTransformer3DModel": _wan,
    "LTXVideoTransformer3DModel": _ltx,
}


def _parallel_fields(pc):
    """diffusers' ContextParallelConfig (or ParallelConfig, or a dict of its fields) ->
    a dict of the fields."""
    if pc is None:
        return None
    inner = getattr(pc, "context_parallel_config", None)
    if inner is not None or type(pc).__name__ == "ParallelConfig":
        pc = inner
        if pc is None:
            return None
    if isinstance(pc, dict):
        unknown = sorted(set(pc) - set(_CP_FIELDS))
        if unknown:
            raise ValueError(f"parallel_config: unknown field(s) {', '.join(unknown)}; "
                             f"ContextParallelConfig has {', '.join(_CP_FIELDS)}")
        return dict(pc)
    return {f: getattr(pc, f) for f in _CP_FIELDS if hasattr(pc, f)}


def _mesh_sizes(mesh):
    names = getattr(mesh, "mesh_dim_names", None)
    shape = getattr(mesh, "shape", None) or getattr(getattr(mesh, "mesh", None), "shape", None)
    if not names or shape is None:
        return {}
    return {n: int(s) for n, s in zip(names, tuple(shape))}


def parallel_section(parallel_config):
    """The plan's `parallel` and `schedule` keys for a ContextParallelConfig (dict or
    object); raises ValueError for what cpc cannot honour.  Returns (parallel,
    schedule, world_size)."""
    f = _parallel_fields(parallel_config)
    if f is None:
        return {"variant": "none"}, {}, 1
    R = f.get("ring_degree")
    U = f.get("ulysses_degree")
    R = 1 if R is None else R
    U = 1 if U is None else U
    for k, d in (("ring_degree", R), ("ulysses_degree", U)):
        if isinstance(d, bool) or not isinstance(d, int):
            raise ValueError(f"{k} must be an integer, got {d!r}")
    if R < 1 or U < 1:
        raise ValueError("`ring_degree` and `ulysses_degree` must be greater than or equal "
                         f"to 1 (got ring_degree={R}, ulysses_degree={U})")
    if R == 1 and U == 1:
        raise ValueError("Either ring_degree or ulysses_degree must be greater than 1 in "
                         "order to use context parallel inference (pass parallel_config="
                         "None for a single-device plan, variant none)")
    ua, ra = bool(f.get("ulysses_anything", False)), bool(f.get("ring_anything", False))
    if ua and ra:
        raise ValueError("ulysses_anything and ring_anything cannot both be enabled")
    if ua:
        if U == 1:
            raise ValueError("ulysses_degree must be greater than 1 for ulysses_anything to "
                             "be enabled")
        if R > 1:
            raise ValueError("ulysses_anything cannot be enabled when ring_degree > 1")
        variant = "ulysses_anything"
    elif ra:
        if R == 1:
            raise ValueError("ring_degree must be greater than 1 for ring_anything to be "
                             "enabled")
        if U > 1:
            raise ValueError("ring_anything cannot be enabled when ulysses_degree > 1")
        variant = "ring_anything"
    elif R > 1 and U > 1:
        variant = "unified"
    elif R > 1:
        variant = "ring"
    else:
        variant = "ulysses"
    rotate = f.get("rotate_method", "allgather")
    rotate = "allgather" if rotate is None else rotate
    if rotate == "alltoall":
        raise ValueError("rotate_method='alltoall' cannot be honoured: neither diffusers nor "
                         "cpc implements it; use 'allgather' (diffusers' way: one all-gather "
                         "of K/V) or cpc's 'p2p' (send/recv with overlap, O(S/P) memory)")
    if rotate not in ("allgather", "p2p"):
        raise ValueError(f"rotate_method={rotate!r}: 'allgather' (diffusers) or 'p2p' (cpc)")
    c32 = f.get("convert_to_fp32", True)
    if c32 is False:
        warnings.warn("convert_to_fp32=False: cpc always merges ring partial outputs and "
                      "LSEs in fp32 (what convert_to_fp32=True asks for); the plan is "
                      "at least as accurate as requested", stacklevel=3)
    mesh = f.get("mesh")
    if mesh is not None:
        sizes = _mesh_sizes(mesh)
        for k, d in (("ring", R), ("ulysses", U)):
            if k in sizes and sizes[k] != d:
                raise ValueError(f"parallel_config.mesh has a {k!r} dimension of "
                                 f"{sizes[k]} but {k}_degree is {d}")
    par = {"variant": variant, "ring_degree": R, "ulysses_degree": U}
    return par, {"rotate": rotate}, R * U


def from_diffusers(parallel_config, transformer_config, height=None, width=None,
                   num_frames=None, world_size=None, text_tokens=None, *, batch=1,
                   dtype="bf16", attention=None, device=None, vae_scale=None,
                   vae_temporal=None, name=None, steps=None):
    """A cpc plan dict for a diffusers model under a diffusers context-parallel
    configuration.

    parallel_config: diffusers' ContextParallelConfig (or ParallelConfig), a dict of
      its fields (ring_degree, ulysses_degree, ulysses_anything, ring_anything,
      rotate_method, convert_to_fp32, mesh), or None for a single-device plan.
    transformer_config: the model's transformer/config.json as a dict (or the
      transformer's .config): FLUX.1, QwenImage, SD3/3.5, CogVideoX 1.0/1.5,
      HunyuanVideo, Wan2.1/2.2, LTX-Video.
    height, width (pixels), num_frames (video models): the generation size.
    world_size: optional; must equal ring_degree x ulysses_degree.
    text_tokens: the text sequence length, default the pipeline's
      (max_sequence_length): FLUX 512, QwenImage 512 (its maximum), SD3 333, CogVideoX
      max_text_seq_length, HunyuanVideo 256, Wan 512, LTX 128.
    batch: the transformer's batch (2 when a pipeline batches CFG's two branches).
    attention: "joint" (text + image tokens, FLUX/QwenImage/SD3/CogVideoX/Hunyuan),
      "self" (video only: Wan, LTX; their default) or "cross" (Wan/LTX: queries the
      video, keys/values the whole text, not split).
    vae_scale, vae_temporal: override the VAE's compression (default per model).
    Raises ValueError for a configuration cpc cannot honour, naming the field."""
    if isinstance(transformer_config, dict):      # diffusers' FrozenDict is a dict too
        cfg = dict(transformer_config)
    elif hasattr(transformer_config, "config"):   # a diffusers model: its .config
        cfg = dict(transformer_config.config)
    else:
        raise ValueError("transformer_config must be the model's config.json as a dict, "
                         f"not {type(transformer_config).__name__}")
    cls = _class_of(cfg)
    _validate.from_diffusers_args(parallel_config, cfg, locals())
    if cls not in _FAMILIES:
        raise ValueError(f"transformer {cls!r} is not supported; supported: "
                         + ", ".join(sorted(_FAMILIES)))
    m = _FAMILIES[cls](cfg)
    par, sched, P = parallel_section(parallel_config)
    if world_size is not None and world_size != P:
        raise ValueError(f"world_size {world_size} != ring_degree x ulysses_degree = {P}: "
                         "cpc plans exactly the context-parallel group (idle ranks are an "
                         "error, CP003); pass the world size of the context-parallel group "
                         "(the CFG and tensor-parallel axes, parallel.cfg_degree and tp_degree, "
                         "are not available in this release)")
    if height is None or width is None:
        raise ValueError(f"{cls}: height and width (pixels) are required")
    height, width = _int(height, "height"), _int(width, "width")
    vs = m.vae if vae_scale is None else _int(vae_scale, "vae_scale")
    vt = m.vae_t if vae_temporal is None else _int(vae_temporal, "vae_temporal")
    if m.kind == "video":
        if num_frames is None:
            raise ValueError(f"{cls} is a video model: num_frames is required")
        num_frames = _int(num_frames, "num_frames")
        if m.family == "wan" and num_frames % vt != 1:
            # WanPipeline rounds num_frames to the next lower multiple of 4, plus 1.
            fixed = num_frames // vt * vt + 1
            warnings.warn(f"num_frames {num_frames}: Wan's pipeline uses {fixed} "
                          f"(a multiple of {vt}, plus 1)", stacklevel=2)
            num_frames = fixed
    elif num_frames is not None and num_frames != 1:
        raise ValueError(f"{cls} is an image model: num_frames must be None or 1")
    if attention is None:
        attention = "self" if m.text_pos == "cross" else "joint"
    if attention not in ("joint", "self", "cross"):
        raise ValueError(f"attention={attention!r}: joint, self or cross")
    if m.text_pos == "cross" and attention == "joint":
        raise ValueError(f"{cls} has no joint attention: its text enters a separate "
                         "cross-attention (attention='cross') after the video "
                         "self-attention (attention='self')")
    if m.text_pos != "cross" and attention != "joint":
        raise ValueError(f"{cls} has joint attention only (text and image tokens in one "
                         "attention): attention='joint'")
    text = m.text if text_tokens is None else _int(text_tokens, "text_tokens")
    if text < 1:
        raise ValueError(f"text_tokens must be >= 1, got {text}")

    if m.kind == "image":
        seg = {"name": "image", "image": {"height": height, "width": width, "vae_scale": vs,
                                          "patch": m.patch}}
    else:
        pt, ph, pw = m.patch
        video = {"frames": num_frames, "height": height, "width": width, "vae_scale": vs,
                 "vae_temporal": vt, "patch": [pt, ph, pw]}
        seg = {"name": "video", "video": video}
        latent = (num_frames - 1) // vt + 1
        if pt > 1 and latent % pt:
            # CogVideoX 1.5 (patch_size_t 2) pads the latent frames to a multiple of pt.
            latent = math.ceil(latent / pt) * pt
            seg = {"name": "video",
                   "tokens": latent // pt * ((height // vs) // ph) * ((width // vs) // pw)}
    segments = [seg]
    if attention == "joint":
        t = {"name": "text", "tokens": text}
        segments = [t, seg] if m.text_pos == "first" else [seg, t]
    inp = {"batch": _int(batch, "batch"), "segments": segments,
           "mask": m.mask if attention == "joint" else "none"}
    if attention == "cross":
        inp["kv"] = {"tokens": text}
    if steps is not None:
        inp["steps"] = _int(steps, "steps")
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype {dtype!r}: bf16, fp16 or fp32")
    size = f"{width}x{height}" + (f"x{num_frames}f" if m.kind == "video" else "")
    plan = {
        "version": 1,
        "name": name or f"{m.family}-{size}-{par['variant']}"
                        + (f"-{par['ring_degree']}x{par['ulysses_degree']}"
                           if par["variant"] != "none" else "")
                        + (f"-{attention}" if attention != "joint" else ""),
        "model": {"heads": _int(m.heads, "num_attention_heads"),
                  "head_dim": _int(m.head_dim, "attention_head_dim"), "dtype": dtype,
                  "layers": _int(m.layers, "num_layers")},
        "input": inp,
        "cluster": {"world_size": P},
        "parallel": par,
    }
    if device is not None:
        plan["cluster"]["device"] = device
    if sched:
        plan["schedule"] = sched
    return plan
