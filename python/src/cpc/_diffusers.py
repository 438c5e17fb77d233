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
                 text_pos, mask, cross_text=None, kv_heads=None, attention=None,
                 cross_heads=None):
        self.family, self.kind = family, kind            # kind: image | video
        self.heads, self.head_dim, self.layers = heads, head_dim, layers
        self.patch, self.vae, self.vae_t = patch, vae, vae_t
        self.text, self.text_pos, self.mask = text, text_pos, mask  # text_pos: first|last|cross
        self.cross_text = cross_text
        self.kv_heads = kv_heads          # GQA (Lumina2): model.kv_heads
        self.attention = attention        # "linear": the self-attention's kind (Sana)
        self.cross_heads = cross_heads    # (heads, head_dim) of the cross-attention if other


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
    if {"num_single_layers", "timestep_guidance_channels"} <= keys:
        return "Flux2Transformer2DModel"
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


def _flux2(cfg):
    # FLUX.2: as FLUX.1 (Flux2Pipeline packs 2x2 latent patches: in_channels 128 = 32 x 4;
    # VAE 8); Mistral text (max_sequence_length 512) first in the joint attention
    # (Flux2AttnProcessor: cat([encoder_query, query])).
    p = _int(_get(cfg, "patch_size", 1), "patch_size")
    return _Model("flux2", "image", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"),
                  _get(cfg, "num_layers") + _get(cfg, "num_single_layers", 0), 2 * p, 8, None,
                  512, "first", "none")


def _hunyuan15(cfg):
    # HunyuanVideo-1.5: [video, text]; the text is Qwen2.5-VL (tokenizer_max_length 1000) +
    # byT5 glyphs (256) + SigLIP image tokens (vision_num_semantic_tokens 729, zeros and
    # masked for text-to-video), with a key mask; VAE 16 x 4, patch [patch_size_t, p, p].
    return _Model("hunyuanvideo1.5", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"), _patch3(cfg), 16, 4,
                  1000 + 256 + 729, "last", "key_padding")


def _mochi(cfg):
    # Mochi 1: MochiAttnProcessor2_0 concatenates [video, valid text]; text 256
    # (max_sequence_length) after the video, padding masked; VAE 8 x 6; patch 1 x p x p.
    p = _int(_get(cfg, "patch_size", 2), "patch_size")
    return _Model("mochi", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"), [1, p, p], 8, 6,
                  _get(cfg, "max_sequence_length", 256), "last", "key_padding")


def _skyreels(cfg):
    # SkyReels-V2: Wan's architecture (self-attention over the video, umT5 text 512 in the
    # cross-attention); VAE 8 x 4.
    return _Model("skyreels-v2", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"), _patch3(cfg), 8, 4,
                  512, "cross", "none", cross_text=512)


def _chronoedit(cfg):
    # ChronoEdit (14B): Wan2.1-I2V's architecture (self-attention over the video, umT5 text
    # 512 in the cross-attention, VAE 8 x 4); the edit is a short video (input frame ->
    # edited frame)
    return _Model("chronoedit", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"), _patch3(cfg), 8, 4,
                  512, "cross", "none", cross_text=512)


def _zimage(cfg):
    # Z-Image: one stream over [image, caption] (the basic, non-omni order), the caption
    # (max_sequence_length 512) padded and masked; image and caption each padded to a
    # multiple of 32 tokens (from_diffusers below); VAE 8, patch all_patch_size[0];
    # heads n_heads, head_dim dim / n_heads; n_layers joint blocks (its refiners attend
    # within the image or the caption alone).
    heads = _int(_get(cfg, "n_heads"), "n_heads")
    dim = _int(_get(cfg, "dim"), "dim")
    if dim % heads:
        raise ValueError(f"dim {dim} is not a multiple of n_heads {heads}")
    p = _get(cfg, "all_patch_size", [2])
    p = _int(p[0] if isinstance(p, (list, tuple)) else p, "all_patch_size")
    return _Model("z-image", "image", heads, dim // heads, _get(cfg, "n_layers"), p, 8, None,
                  512, "last", "key_padding")


def _ltx2(cfg):
    # LTX-2 (audio + video): the video stream's attentions (the largest): self-attention
    # over the video latents, the Gemma text (LTX2Pipeline max_sequence_length 1024) in a
    # cross-attention; VAE from the config's vae_scale_factors (t, h, w) = (8, 32, 32);
    # patch [patch_size_t, patch_size, patch_size].  The audio stream (audio self- and
    # cross-attention, audio<->video cross-attention) is not in this plan.
    vsf = _get(cfg, "vae_scale_factors", [8, 32, 32])
    if not isinstance(vsf, (list, tuple)) or len(vsf) != 3:
        raise ValueError(f"vae_scale_factors {vsf!r}: expected [t, h, w]")
    if vsf[1] != vsf[2]:
        raise ValueError(f"vae_scale_factors {vsf!r}: cpc's video segment has one spatial "
                         "factor (pass vae_scale=)")
    return _Model("ltx-2", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"), _patch3(cfg),
                  _int(vsf[1], "vae_scale_factors"), _int(vsf[0], "vae_scale_factors"), 1024,
                  "cross", "none", cross_text=1024)


def _chroma(cfg):
    # Chroma: FLUX.1's architecture (2x2 packing, VAE 8, patch_size 1); T5 text (512)
    # first, its padding masked (ChromaPipeline keeps one pad token): key padding.
    p = _int(_get(cfg, "patch_size", 1), "patch_size")
    return _Model("chroma", "image", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"),
                  _get(cfg, "num_layers") + _get(cfg, "num_single_layers", 0), 2 * p, 8, None,
                  512, "first", "key_padding")


def _cogview4(cfg):
    # CogView4: [text, image] (CogView4AttnProcessor: cat([encoder_hidden_states,
    # hidden_states])); the GLM text is padded (pad tokens, not masked) to a multiple of 16,
    # at most max_sequence_length 1024; VAE 8, patch_size 2.
    return _Model("cogview4", "image", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"),
                  _int(_get(cfg, "patch_size", 2), "patch_size"), 8, None, 1024, "first",
                  "none")


def _cosmos(cfg):
    # Cosmos (text2world): self-attention over the video (patch (1, 2, 2), VAE 8 x 8: the
    # Cosmos tokenizer CV8x8x8), T5 text (512) in a cross-attention.
    return _Model("cosmos", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"), _patch3(cfg), 8, 8,
                  512, "cross", "none", cross_text=512)


def _allegro(cfg):
    # Allegro: self-attention over the video (patch [patch_size_t, p, p], VAE 8 x 4), T5
    # text (512) in a cross-attention.
    return _Model("allegro", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"), _patch3(cfg), 8, 4,
                  512, "cross", "none", cross_text=512)


def _lumina2(cfg):
    # Lumina-Image-2.0: one stream over [caption, image] (the Gemma caption, at most
    # max_sequence_length 256, padding masked); heads num_attention_heads, head_dim
    # hidden_size / heads, GQA with num_kv_heads; num_layers joint layers (its noise and
    # context refiners attend within the image or the caption alone); VAE 8, patch 2.
    heads = _int(_get(cfg, "num_attention_heads"), "num_attention_heads")
    hidden = _int(_get(cfg, "hidden_size"), "hidden_size")
    if hidden % heads:
        raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads "
                         f"{heads}")
    return _Model("lumina2", "image", heads, hidden // heads, _get(cfg, "num_layers"),
                  _int(_get(cfg, "patch_size", 2), "patch_size"), 8, None, 256, "first",
                  "key_padding", kv_heads=_get(cfg, "num_kv_heads", heads))


def _sana(cfg):
    # Sana: ReLU linear self-attention over the image (SanaLinearAttnProcessor2_0: cpc
    # prices model.attention linear, its kernels run softmax only), Gemma text (300) in a
    # softmax cross-attention with its own heads (num_cross_attention_heads x
    # cross_attention_head_dim); DC-AE VAE 32, patch_size 1.
    cross = (_get(cfg, "num_cross_attention_heads", None, required=False),
             _get(cfg, "cross_attention_head_dim", None, required=False))
    return _Model("sana", "image", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"),
                  _int(_get(cfg, "patch_size", 1), "patch_size"), 32, None, 300, "cross",
                  "none", cross_text=300, attention="linear",
                  cross_heads=cross if None not in cross else None)


def _hidream(cfg):
    # HiDream-I1: one joint attention per block over [image, text] (HiDreamAttnProcessor:
    # cat([query_i, query_t])); the text of every block = T5 (128) + a Llama-3.1 layer
    # (128) + the block's own Llama layer (128) = 384 (HiDreamImagePipeline
    # max_sequence_length 128 each); VAE 8, patch_size 2; num_layers double-stream +
    # num_single_layers single-stream blocks.  A non-square image is padded to
    # max_resolution[0] x max_resolution[1] / patch^2 tokens (HiDreamImageTransformer2DModel
    # .patchify), whose padding keys are zeroed, not masked: they take part.
    return _Model("hidream", "image", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"),
                  _get(cfg, "num_layers") + _get(cfg, "num_single_layers", 0),
                  _int(_get(cfg, "patch_size", 2), "patch_size"), 8, None, 3 * 128, "last",
                  "none")


def _easyanimate(cfg):
    # EasyAnimate (V5.1): joint attention over [text, video] (EasyAnimateAttnProcessor2_0:
    # cat([encoder_query, query])), no text mask in the transformer; the Qwen2-VL text
    # (EasyAnimatePipeline max_sequence_length 256); VAE 8 x 4; patch [1, p, p].
    p = _int(_get(cfg, "patch_size", 2), "patch_size")
    return _Model("easyanimate", "video", _get(cfg, "num_attention_heads"),
                  _get(cfg, "attention_head_dim"), _get(cfg, "num_layers"), [1, p, p], 8, 4,
                  256, "first", "none")


_FAMILIES = {
    "FluxTransformer2DModel": _flux,
    "QwenImageTransformer2DModel": _qwen,
    "SD3Transformer2DModel": _sd3,
    "CogVideoXTransformer3DModel": _cogvideox,
    "HunyuanVideoTransformer3DModel": _hunyuan,
    "WanTransformer3DModel": _wan,
    "LTXVideoTransformer3DModel": _ltx,
    "Flux2Transformer2DModel": _flux2,
    "HunyuanVideo15Transformer3DModel": _hunyuan15,
    "MochiTransformer3DModel": _mochi,
    "SkyReelsV2Transformer3DModel": _skyreels,
    "ZImageTransformer2DModel": _zimage,
    "LTX2VideoTransformer3DModel": _ltx2,
    "ChromaTransformer2DModel": _chroma,
    "CogView4Transformer2DModel": _cogview4,
    "CosmosTransformer3DModel": _cosmos,
    "AllegroTransformer3DModel": _allegro,
    "Lumina2Transformer2DModel": _lumina2,
    "SanaTransformer2DModel": _sana,
    "HiDreamImageTransformer2DModel": _hidream,
    "ChronoEditTransformer3DModel": _chronoedit,
    "EasyAnimateTransformer3DModel": _easyanimate,
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
                   vae_temporal=None, name=None, steps=None, tokens=None, mode=None,
                   reference_images=0, parameters=None, mask=None, replicate_text=False):
    """A cpc plan dict for a diffusers model under a diffusers context-parallel
    configuration.

    parallel_config: diffusers' ContextParallelConfig (or ParallelConfig), a dict of
      its fields (ring_degree, ulysses_degree, ulysses_anything, ring_anything,
      rotate_method, convert_to_fp32, mesh), or None for a single-device plan.
    transformer_config: the model's transformer/config.json as a dict (or the
      transformer's .config), by its _class_name: FLUX.1, FLUX.2, Chroma, QwenImage (and
      -Edit), SD3/3.5, CogView4, Lumina-Image-2.0, Sana, Z-Image, CogVideoX 1.0/1.5,
      HunyuanVideo, HunyuanVideo-1.5, Mochi, Wan2.1/2.2, SkyReels-V2, LTX-Video, LTX-2
      (its video stream), Cosmos, Allegro, HiDream-I1, EasyAnimate, ChronoEdit.
    height, width (pixels), num_frames (video models): the generation size.
    world_size: optional; must equal ring_degree x ulysses_degree.
    text_tokens: the text sequence length, default the pipeline's
      (max_sequence_length): FLUX 512, QwenImage 512 (its maximum), SD3 333, CogVideoX
      max_text_seq_length, HunyuanVideo 256, Wan 512, LTX 128, LTX-2 1024, Chroma 512,
      CogView4 1024 (its maximum: the prompt padded to a multiple of 16), Lumina2 256,
      Sana 300, Cosmos 512, Allegro 512, HiDream 384 (T5 128 + two Llama layers of
      128), EasyAnimate 256.
    batch: the transformer's batch (2 when a pipeline batches CFG's two branches).
    attention: "joint" (text + image tokens, FLUX/QwenImage/SD3/CogVideoX/Hunyuan/...),
      "self" (image/video only: Wan, SkyReels-V2, LTX, LTX-2, Cosmos, Allegro, Sana; their
      default; Sana's is linear attention, model.attention linear) or "cross" (those
      models: queries the image/video, keys/values the whole text, not split; Sana's
      with its own cross-attention heads).
    vae_scale, vae_temporal: override the VAE's compression (default per model).
    tokens: the image/video token count as the transformer sees it (after the VAE and
      the patching), instead of height/width/num_frames (cpc.diffusers.parallelize
      passes the count it reads from the transformer's inputs).
    mode: "inference" (default) or "training" (input.mode: a forward and a backward
      program; autograd through cpc.Attention).
    steps: denoising steps per image/video (input.steps: whole-image predictions).
    reference_images: image models: how many reference images of the generation size
      join the image tokens (Qwen-Image-Edit: 1; FLUX.2 with reference images: their
      count), i.e. the image segment holds (1 + reference_images) images' tokens.
    mask: input.mask: None = the model's (key_padding for the joint attention of
      QwenImage, HunyuanVideo(-1.5), Mochi, Z-Image, whose text is padded and masked;
      none otherwise), or "none" / "key_padding" (cpc.diffusers.parallelize passes what
      the call's inputs carry: "none" when every key takes part).
    parameters: model.parameters (the transformer's weight count, for whole-step
      predictions): None = counted from the model's own code when diffusers (torch >= 2)
      is importable (the model built from the config on torch's "meta" device: no
      memory, ~0.1 s), else left out; an int = that; False = left out.
    replicate_text: True = xDiT's layout for joint attention: the text segment is held
      whole by every rank (`split: replicate`, SPEC section 1), never divided by the
      degrees, and only the image/video tokens are split; the text's queries run on every
      rank and its keys/values are never sent.  So CogVideoX's 226 text tokens run on
      ring 2 x ulysses 3 (CP010 when sharded).  Inference only (training: CP018).  No
      effect for attention "self" / "cross" (Wan, LTX: no text segment, or the text is
      already whole as cross-attention K/V).  Default False: the text is split as diffusers
      splits it.
    The plan pins ring_degree and ulysses_degree only for unified (both > 1); for the
    other variants the degrees follow from the variant and cluster.world_size, so
    `cpc --sweep` / `--set cluster.world_size=N` can vary them.
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
                         "(for more ranks, split the batch or the heads first: the plan's "
                         "parallel.cfg_degree and parallel.tp_degree axes)")
    if mode not in (None, "inference", "training"):
        raise ValueError(f"mode={mode!r}: 'inference' or 'training'")
    if tokens is not None:
        tokens = _int(tokens, "tokens")
        if tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {tokens}")
        if height is not None or width is not None or num_frames is not None:
            raise ValueError("pass tokens= or height/width/num_frames, not both")
        height = width = 0
    elif height is None or width is None:
        raise ValueError(f"{cls}: height and width (pixels) are required (or tokens=, the "
                         "image/video token count the transformer sees)")
    height, width = _int(height, "height"), _int(width, "width")
    vs = m.vae if vae_scale is None else _int(vae_scale, "vae_scale")
    vt = m.vae_t if vae_temporal is None else _int(vae_temporal, "vae_temporal")
    if tokens is not None:
        pass
    elif m.kind == "video":
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
    if m.family == "z-image":
        text = -(-text // 32) * 32          # the caption padded as the image (cap_pad_token)

    reference_images = _int(reference_images, "reference_images")
    if reference_images < 0 or (reference_images and m.kind != "image"):
        raise ValueError("reference_images: a count >= 0, for image models")
    if tokens is not None:
        seg = {"name": m.kind, "tokens": tokens * (1 + reference_images)}
    elif m.kind == "image" and reference_images:
        one = (height // vs // m.patch) * (width // vs // m.patch)
        seg = {"name": "image", "tokens": one * (1 + reference_images)}
    elif m.family == "z-image":
        # ZImageTransformer2DModel.patchify_and_embed pads the image to a multiple of 32
        # tokens (SEQ_MULTI_OF; the padding rows are real keys)
        n = (height // vs // m.patch) * (width // vs // m.patch)
        seg = {"name": "image", "tokens": -(-n // 32) * 32}
    elif m.kind == "image" and m.family == "hidream" and height // vs != width // vs:
        mr = _get(cfg, "max_resolution", [128, 128])
        seg = {"name": "image", "tokens": _int(mr[0], "max_resolution") *
               _int(mr[1], "max_resolution") // (m.patch * m.patch)}
    elif m.kind == "image":
        seg = {"name": "image", "image": {"height": height, "width": width, "vae_scale": vs,
                                          "patch": m.patch}}
    else:
        pt, ph, pw = m.patch
        video = {"frames": num_frames, "height": height, "width": width, "vae_scale": vs,
                 "vae_temporal": vt, "patch": [pt, ph, pw]}
        seg = {"name": "video", "video": video}
        latent = (num_frames - 1) // vt + 1
        if m.family == "allegro" and num_frames % 2:
            # AllegroPipeline.prepare_latents: ceil((F - 1) / vt) + 1 for an odd F (one
            # more latent frame than (F - 1) // vt + 1 when F - 1 is not a multiple of vt)
            latent = -(-(num_frames - 1) // vt) + 1
            seg = {"name": "video",
                   "tokens": latent // pt * ((height // vs) // ph) * ((width // vs) // pw)}
        if pt > 1 and latent % pt:
            # CogVideoX 1.5 (patch_size_t 2) pads the latent frames to a multiple of pt.
            latent = math.ceil(latent / pt) * pt
            seg = {"name": "video",
                   "tokens": latent // pt * ((height // vs) // ph) * ((width // vs) // pw)}
    segments = [seg]
    if attention == "joint":
        t = {"name": "text", "tokens": text}
        if not isinstance(replicate_text, bool):
            raise ValueError(f"replicate_text must be True or False, not {replicate_text!r}")
        if replicate_text:
            t["split"] = "replicate"      # xDiT: joint text whole on every rank
        segments = [t, seg] if m.text_pos == "first" else [seg, t]
    if mask is None:
        mask = m.mask if attention == "joint" else "none"
    elif mask not in ("none", "key_padding"):
        raise ValueError(f"mask={mask!r}: 'none' or 'key_padding'")
    inp = {"batch": _int(batch, "batch"), "segments": segments, "mask": mask}
    if attention == "cross":
        inp["kv"] = {"tokens": text}
    if steps is not None:
        inp["steps"] = _int(steps, "steps")
    if mode == "training":
        inp["mode"] = "training"
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype {dtype!r}: bf16, fp16 or fp32")
    size = (f"{tokens}tok" if tokens is not None else
            f"{width}x{height}" + (f"x{num_frames}f" if m.kind == "video" else ""))
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
    if attention == "cross" and m.cross_heads:
        plan["model"]["heads"] = _int(m.cross_heads[0], "num_cross_attention_heads")
        plan["model"]["head_dim"] = _int(m.cross_heads[1], "cross_attention_head_dim")
    if m.kv_heads is not None and m.kv_heads != m.heads:
        plan["model"]["kv_heads"] = _int(m.kv_heads, "num_kv_heads")
    if m.attention and attention == "self":
        plan["model"]["attention"] = m.attention
    if par["variant"] not in ("unified", "none"):
        # the variant and world_size determine the degrees: left to cpc, so that a sweep
        # or --set cluster.world_size can change them (CP105 otherwise)
        plan["parallel"] = {"variant": par["variant"]}
    if parameters is None:
        parameters = _count_parameters(cls, cfg)
    if parameters:
        plan["model"]["parameters"] = _int(parameters, "parameters")
    plan["model"].update(_structure(cls, cfg, m))
    if device is not None:
        plan["cluster"]["device"] = device
    if sched:
        plan["schedule"] = sched
    return DiffusersPlan(plan, parallel_fields=_parallel_fields(parallel_config))


class DiffusersPlan(dict):
    """A plan dict made by from_diffusers (a plain dict otherwise).  cpc.check /
    cpc.compile see it and add the ContextParallelConfig field to the hints that speak
    of plan keys (e.g. "variant ulysses_anything" -> ulysses_anything=True)."""

    def __init__(self, plan, parallel_fields=None):
        super().__init__(plan)
        self.parallel_fields = parallel_fields


_PARAM_CACHE = {}


def _count_parameters(cls, cfg):
    """The transformer's weight count from diffusers' own class, built on torch's meta
    device (no memory); None when diffusers / torch >= 2 cannot be imported or the
    build fails."""
    import json as _json
    import sys
    key = (cls, _json.dumps(cfg, sort_keys=True, default=str))
    if key in _PARAM_CACHE:
        return _PARAM_CACHE[key]
    n = None
    try:
        torch = sys.modules.get("torch")
        if torch is None:
            import torch
        if hasattr(torch, "accelerator"):
            import diffusers
            model_cls = getattr(diffusers, cls, None)
            if model_cls is not None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with torch.device("meta"):
                        model = model_cls.from_config(
                            {k: v for k, v in cfg.items() if not k.startswith("_")})
                n = int(sum(p.numel() for p in model.parameters()))
    except Exception:  # noqa: BLE001 - no diffusers here, or a config it cannot build
        n = None
    _PARAM_CACHE[key] = n
    return n


_STRUCTURE_OK = None


def _structure_keys_accepted():
    """Whether this libcpc's plan schema has the model-structure keys (model.hidden,
    mlp_ratio, ...: the cost model's whole-step structure); False without libcpc."""
    global _STRUCTURE_OK
    if _STRUCTURE_OK is None:
        try:
            from ._plan import check
            r = check({"version": 1, "model": {"heads": 1, "head_dim": 8, "hidden": 8},
                       "input": {"tokens": 8}, "cluster": {"world_size": 1},
                       "parallel": {"variant": "none"}})
            _STRUCTURE_OK = bool(r.ok)
        except Exception:  # noqa: BLE001 - no libcpc: leave the keys out
            _STRUCTURE_OK = False
    return _STRUCTURE_OK


def _structure(cls, cfg, m):
    """model.hidden / mlp_ratio / mlp_gated / dual_stream_layers / cross_attention_tokens
    from the config where it says them (/work/notes/model-keys.md: the keys the cost
    model prices the whole step with); left out when this libcpc does not know them."""
    if not _structure_keys_accepted():
        return {}
    out = {}
    hidden = m.heads * m.head_dim
    for k in ("inner_dim", "hidden_size", "dim"):
        if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool) and cfg[k] > 0:
            hidden = cfg[k]
            break
    out["hidden"] = int(hidden)
    if isinstance(cfg.get("mlp_ratio"), (int, float)) and cfg["mlp_ratio"] > 0:
        out["mlp_ratio"] = float(cfg["mlp_ratio"])
    elif isinstance(cfg.get("ffn_dim"), int) and cfg["ffn_dim"] > 0:
        out["mlp_ratio"] = cfg["ffn_dim"] / hidden
    act = str(cfg.get("activation_fn", ""))
    if "geglu" in act or "swiglu" in act:
        out["mlp_gated"] = True
    if cls in ("FluxTransformer2DModel", "Flux2Transformer2DModel",
               "HunyuanVideoTransformer3DModel"):
        out["dual_stream_layers"] = int(cfg.get("num_layers", 0))
    elif cls in ("SD3Transformer2DModel", "QwenImageTransformer2DModel",
                 "MochiTransformer3DModel"):
        out["dual_stream_layers"] = int(m.layers)
    if m.cross_text:
        out["cross_attention_tokens"] = int(m.cross_text)
    return out


# ---- hints in diffusers' words ------------------------------------------------------

_VARIANT_WORDS = {"ulysses_anything": "ulysses_anything=True",
                  "ring_anything": "ring_anything=True",
                  "ring": "ring_degree > 1 alone", "ulysses": "ulysses_degree > 1 alone",
                  "unified": "ring_degree > 1 and ulysses_degree > 1"}


def diffusers_words(text):
    """A diagnostic's text with the ContextParallelConfig field next to each plan key it
    names ("variant ulysses_anything" -> "... (ulysses_anything=True)")."""
    import re
    if not text:
        return text

    def variant(mt):
        v = mt.group(2)
        w = _VARIANT_WORDS.get(v)
        return f"{mt.group(0)} ({w})" if w else mt.group(0)

    text = re.sub(r"(parallel\.variant:?|variant) (ulysses_anything|ring_anything|unified|"
                  r"ring|ulysses)\b(?! \()", variant, text)
    text = re.sub(r"\bor (ring_anything|ulysses_anything)\b(?! \()", r"or \1 (\1=True)", text)
    text = re.sub(r"parallel\.(ring|ulysses)_degree:? (\d+)", r"\1_degree=\2", text)
    text = re.sub(r"\bmodel\.heads\b", "model.heads (the transformer's num_attention_heads)",
                  text)
    text = re.sub(r"\bcluster\.world_size\b",
                  "cluster.world_size (the number of processes: ring_degree x ulysses_degree)",
                  text)
    return text


def translate_error(err):
    """A PlanError of a from_diffusers plan: its diagnostics, and its own .message and
    .hint (the first error's), in the ContextParallelConfig's words."""
    diags = getattr(err, "diagnostics", None) or []
    translate_diagnostics(diags)
    first = next((d for d in diags if d.severity == "error"), None)
    err.message = diffusers_words(err.message)
    if first is not None and first.hint:
        err.hint = first.hint
    else:
        err.hint = diffusers_words(err.hint)
    if err.args:
        err.args = (err.message,) + tuple(err.args[1:])
    return err


def translate_diagnostics(diags):
    for d in diags:
        d.message = diffusers_words(d.message)
        d.hint = diffusers_words(d.hint)
        if d.code in ("CP010", "CP011", "CP020") and "segment 'text'" in (d.message or ""):
            # xDiT's way out: the text whole on every rank, never divided
            more = ("or keep the text whole on every rank, as xDiT does: "
                    "replicate_text=True (to cpc.diffusers.parallelize or "
                    "cpc.from_diffusers)")
            d.hint = f"{d.hint}; {more}" if d.hint else more
    return diags
