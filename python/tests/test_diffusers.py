"""cpc.from_diffusers on the real transformer/config.json contents of the models
(tests/configs/, copied from the models' public Hugging Face repositories)."""

import dataclasses
import warnings

import pytest

import cpc
from conftest import REPO, config


@dataclasses.dataclass
class ContextParallelConfig:
    """The fields of diffusers' ContextParallelConfig (diffusers/models/_modeling_parallel.py),
    for tests that run without diffusers installed."""
    ring_degree: int = None
    ulysses_degree: int = None
    convert_to_fp32: bool = True
    rotate_method: str = "allgather"
    mesh: object = None
    ulysses_anything: bool = False
    ring_anything: bool = False


@dataclasses.dataclass
class ParallelConfig:
    context_parallel_config: ContextParallelConfig = None


FLUX = config("flux1-dev")


def segs(plan):
    return [(s["name"], s.get("tokens")) for s in plan["input"]["segments"]]


# (config, parallel, kwargs, expected tokens, expected segment order, mask, heads, D, layers)
CASES = [
    ("flux1-dev", {"ulysses_degree": 4}, dict(height=1024, width=1024), 4608, ["text", "image"],
     "none", 24, 128, 57),
    ("flux1-dev", {"ulysses_degree": 4, "ulysses_anything": True}, dict(height=1008, width=1008),
     512 + 3969, ["text", "image"], "none", 24, 128, 57),
    ("flux1-schnell", {"ring_degree": 2}, dict(height=1024, width=1024, text_tokens=256),
     256 + 4096, ["text", "image"], "none", 24, 128, 57),
    ("qwen-image", {"ulysses_degree": 4}, dict(height=1024, width=1024), 4608, ["text", "image"],
     "key_padding", 24, 128, 60),
    ("sd3.5-large", {"ulysses_degree": 4, "ulysses_anything": True}, dict(height=1024, width=1024),
     4096 + 333, ["image", "text"], "none", 38, 64, 38),
    ("sd3-medium", {"ring_degree": 2, "ulysses_degree": 2}, dict(height=1024, width=1024,
     text_tokens=332), 4096 + 332, ["image", "text"], "none", 24, 64, 24),
    ("cogvideox-5b", {"ulysses_degree": 4, "ulysses_anything": True},
     dict(height=480, width=720, num_frames=49), 226 + 17550, ["text", "video"], "none", 48, 64,
     42),
    # CogVideoX 1.5: 21 latent frames padded to 22 (patch_size_t 2): 11 x 48 x 85.
    ("cogvideox1.5-5b", {"ulysses_degree": 4, "ulysses_anything": True},
     dict(height=768, width=1360, num_frames=81), 226 + 44880, ["text", "video"], "none", 48, 64,
     42),
    ("hunyuanvideo", {"ulysses_degree": 8}, dict(height=720, width=1280, num_frames=129),
     118800 + 256, ["video", "text"], "key_padding", 24, 128, 60),
    ("wan2.1-t2v-14b", {"ulysses_degree": 8}, dict(height=480, width=832, num_frames=81), 32760,
     ["video"], "none", 40, 128, 40),
    ("wan2.1-t2v-14b", {"ulysses_degree": 8}, dict(height=720, width=1280, num_frames=81), 75600,
     ["video"], "none", 40, 128, 40),
    ("wan2.1-t2v-1.3b", {"ring_degree": 2, "ulysses_degree": 2},
     dict(height=480, width=832, num_frames=81), 32760, ["video"], "none", 12, 128, 30),
    ("wan2.2-t2v-a14b", {"ulysses_degree": 8}, dict(height=720, width=1280, num_frames=81), 75600,
     ["video"], "none", 40, 128, 40),
    # Wan2.2 TI2V-5B: 16x spatial VAE: 31 x (704/32) x (1280/32) = 31 x 22 x 40.
    ("wan2.2-ti2v-5b", {"ulysses_degree": 4}, dict(height=704, width=1280, num_frames=121), 27280,
     ["video"], "none", 24, 128, 30),
    ("ltx-video", {"ulysses_degree": 4}, dict(height=512, width=704, num_frames=161), 7392,
     ["video"], "none", 32, 64, 28),
]


@pytest.mark.parametrize("name,par,kw,tokens,order,mask,H,D,layers", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_models(name, par, kw, tokens, order, mask, H, D, layers):
    plan = cpc.from_diffusers(par, config(name), **kw)
    assert [s["name"] for s in plan["input"]["segments"]] == order
    assert plan["input"]["mask"] == mask
    assert (plan["model"]["heads"], plan["model"]["head_dim"], plan["model"]["layers"]) == \
        (H, D, layers)
    R, U = par.get("ring_degree", 1), par.get("ulysses_degree", 1)
    assert plan["cluster"]["world_size"] == R * U
    # degrees pinned only for unified (else they follow from the variant and world_size)
    assert ("ring_degree" in plan["parallel"]) == (R > 1 and U > 1)
    # cpc counts the tokens from the image/video segments as the pipelines do.
    a = cpc.compile(plan)
    assert (a.ring_degree, a.ulysses_degree) == (R, U)
    assert a.tokens == tokens
    assert (a.heads, a.head_dim, a.world_size) == (H, D, R * U)
    assert a.key_padding == (mask == "key_padding")


@pytest.mark.parametrize("plan_file,name,par,kw", [
    ("flux1-dev-1024.yaml", "flux1-dev", {"ulysses_degree": 4}, dict(height=1024, width=1024)),
    ("flux1-dev-1008.yaml", "flux1-dev", {"ulysses_degree": 4, "ulysses_anything": True},
     dict(height=1008, width=1008, device="l20")),
    ("qwenimage-1024.yaml", "qwen-image", {"ulysses_degree": 4}, dict(height=1024, width=1024)),
    ("sd3.5-large.yaml", "sd3.5-large", {"ulysses_degree": 4, "ulysses_anything": True},
     dict(height=1024, width=1024)),
    ("cogvideox-5b.yaml", "cogvideox-5b", {"ulysses_degree": 4, "ulysses_anything": True},
     dict(height=480, width=720, num_frames=49)),
    ("hunyuanvideo-720p.yaml", "hunyuanvideo", {"ulysses_degree": 8},
     dict(height=720, width=1280, num_frames=129)),
    ("wan2.1-14b-480p.yaml", "wan2.1-t2v-14b", {"ulysses_degree": 8},
     dict(height=480, width=832, num_frames=81)),
    ("wan2.1-14b-720p.yaml", "wan2.1-t2v-14b", {"ulysses_degree": 8},
     dict(height=720, width=1280, num_frames=81)),
    ("ltx-video.yaml", "ltx-video", {"ulysses_degree": 4},
     dict(height=512, width=704, num_frames=161)),
])
def test_same_as_the_repository_plans(plan_file, name, par, kw):
    """The plan from the diffusers configuration is the one written by hand in plans/:
    same selection and the same predictions (the hand-written plans use p2p rotation;
    diffusers' rotate_method is allgather)."""
    # parameters=False: the hand-written plans have no model.parameters (from_diffusers
    # counts them where diffusers imports: whole-step predictions would be added)
    mine = cpc.check(cpc.from_diffusers(par, config(name), parameters=False, **kw))
    theirs = cpc.check(REPO / "plans" / plan_file, set={"schedule.rotate": "allgather"})
    assert mine.ok and theirs.ok, (mine.diagnostics, theirs.diagnostics)
    assert mine.selected == theirs.selected
    assert mine.predicted == pytest.approx(theirs.predicted, rel=1e-12)


def test_cross_attention_plans():
    wan = cpc.from_diffusers({"ulysses_degree": 8}, config("wan2.1-t2v-14b"), height=480,
                             width=832, num_frames=81, attention="cross")
    assert wan["input"]["kv"] == {"tokens": 512}
    a = cpc.compile(wan)
    assert a.cross_attention and (a.tokens, a.kv_tokens) == (32760, 512)
    assert a.shard_shape(3, "k") == (1, 512, 40, 128)     # K/V whole on every rank
    ltx = cpc.from_diffusers({"ulysses_degree": 4}, config("ltx-video"), height=512, width=704,
                             num_frames=161, attention="cross")
    assert cpc.compile(ltx).kv_tokens == 128


def test_object_configs_and_wrappers():
    cp = ContextParallelConfig(ring_degree=2, ulysses_degree=2)
    plan = cpc.from_diffusers(cp, FLUX, height=1024, width=1024)
    assert plan["parallel"] == {"variant": "unified", "ring_degree": 2, "ulysses_degree": 2}
    assert plan["schedule"] == {"rotate": "allgather"}
    assert cpc.from_diffusers(ParallelConfig(cp), FLUX, height=1024, width=1024) == plan
    # a config without _class_name is recognised by its keys
    nocls = {k: v for k, v in FLUX.items() if not k.startswith("_")}
    assert cpc.from_diffusers(cp, nocls, height=1024, width=1024) == plan
    # None: a single-device baseline
    one = cpc.from_diffusers(None, FLUX, height=512, width=512)
    assert one["parallel"] == {"variant": "none"} and one["cluster"]["world_size"] == 1
    assert cpc.compile(one).variant == "none"


@pytest.mark.parametrize("par,variant", [
    ({"ring_degree": 4}, "ring"), ({"ulysses_degree": 4}, "ulysses"),
    ({"ring_degree": 2, "ulysses_degree": 4}, "unified"),
    ({"ulysses_degree": 3, "ulysses_anything": True}, "ulysses_anything"),
    ({"ring_degree": 3, "ring_anything": True}, "ring_anything"),
    ({"ring_degree": 2, "rotate_method": "p2p"}, "ring"),
])
def test_variants(par, variant):
    plan = cpc.from_diffusers(par, FLUX, height=1024, width=1024)
    assert plan["parallel"]["variant"] == variant
    r = cpc.check(plan)
    assert r.variant == variant, r.diagnostics


@pytest.mark.parametrize("par,words", [
    ({"ring_degree": 2, "rotate_method": "alltoall"}, "alltoall"),
    ({"ring_degree": 1, "ulysses_degree": 1}, "greater than 1"),
    ({"ulysses_degree": 0}, "greater than or equal to 1"),
    ({"ulysses_degree": 2, "ring_degree": 2, "ulysses_anything": True}, "ring_degree > 1"),
    ({"ulysses_degree": 1, "ring_degree": 2, "ulysses_anything": True}, "ulysses_degree must be"),
    ({"ring_degree": 2, "ulysses_degree": 2, "ring_anything": True}, "ulysses_degree > 1"),
    ({"ring_degree": 2, "ulysses_anything": True, "ring_anything": True}, "both"),
    ({"ring_degree": 2, "sequence_parallel": 2}, "unknown field"),
    ({"ring_degree": 2, "rotate_method": "ring"}, "rotate_method"),
])
def test_refused(par, words):
    with pytest.raises(ValueError, match=words):
        cpc.from_diffusers(par, FLUX, height=1024, width=1024)


def test_refused_arguments():
    with pytest.raises(ValueError, match="CP003"):
        cpc.from_diffusers({"ulysses_degree": 4}, FLUX, height=1024, width=1024, world_size=8)
    with pytest.raises(ValueError, match="num_frames"):
        cpc.from_diffusers({"ulysses_degree": 4}, config("wan2.1-t2v-14b"), height=480, width=832)
    with pytest.raises(ValueError, match="no joint attention"):
        cpc.from_diffusers({"ulysses_degree": 4}, config("wan2.1-t2v-14b"), height=480,
                           width=832, num_frames=81, attention="joint")
    with pytest.raises(ValueError, match="joint attention only"):
        cpc.from_diffusers({"ulysses_degree": 4}, FLUX, height=1024, width=1024,
                           attention="cross")
    with pytest.raises(ValueError, match="not supported"):
        cpc.from_diffusers({"ulysses_degree": 4}, {"_class_name": "UNet2DConditionModel"},
                           height=512, width=512)
    with pytest.raises(ValueError, match="height and width"):
        cpc.from_diffusers({"ulysses_degree": 4}, FLUX)


def test_convert_to_fp32_false_warns():
    with pytest.warns(UserWarning, match="fp32"):
        plan = cpc.from_diffusers({"ring_degree": 2, "convert_to_fp32": False}, FLUX,
                                  height=1024, width=1024)
    assert plan["parallel"]["variant"] == "ring"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cpc.from_diffusers({"ring_degree": 2, "convert_to_fp32": True}, FLUX, height=1024,
                           width=1024)


def test_wan_rounds_frames_as_its_pipeline():
    with pytest.warns(UserWarning, match="81"):
        plan = cpc.from_diffusers({"ulysses_degree": 8}, config("wan2.1-t2v-14b"), height=480,
                                  width=832, num_frames=80)
    assert plan["input"]["segments"][0]["video"]["frames"] == 81


def test_rejected_configuration_reports_rule():
    """A diffusers configuration that cannot run is cpc's rule violation with a hint:
    FLUX at 1008^2 (3969 image tokens) on ulysses 4."""
    r = cpc.check(cpc.from_diffusers({"ulysses_degree": 4}, FLUX, height=1008, width=1008))
    assert not r.ok
    d = [x for x in r.diagnostics if x.severity == "error"][0]
    assert d.code == "CP011" and "3969" in d.message and "ulysses_anything" in d.hint
    assert d.file == "<dict>" and d.line and d.column


# The classes added for issue 24.  Configs: the classes' own defaults in diffusers 0.42.1
# (their __init__ signatures), which are the published models' (FLUX.2-dev, HunyuanVideo-1.5
# 480p i2v, Mochi 1 preview, SkyReels-V2 1.3B-like, Z-Image-Turbo).
NEW_MODELS = [
    ({"_class_name": "Flux2Transformer2DModel", "patch_size": 1, "in_channels": 128,
      "num_layers": 8, "num_single_layers": 48, "attention_head_dim": 128,
      "num_attention_heads": 48, "joint_attention_dim": 15360, "mlp_ratio": 3.0,
      "timestep_guidance_channels": 256, "guidance_embeds": True},
     dict(height=1024, width=1024), 512 + 4096, ["text", "image"], "none", 48, 128, 56),
    ({"_class_name": "HunyuanVideo15Transformer3DModel", "num_attention_heads": 16,
      "attention_head_dim": 128, "num_layers": 54, "patch_size": 1, "patch_size_t": 1},
     dict(height=480, width=848, num_frames=121), 31 * 30 * 53 + 1985, ["video", "text"],
     "key_padding", 16, 128, 54),
    ({"_class_name": "MochiTransformer3DModel", "patch_size": 2, "num_attention_heads": 24,
      "attention_head_dim": 128, "num_layers": 48, "max_sequence_length": 256,
      "activation_fn": "swiglu"},
     dict(height=480, width=848, num_frames=163), 28 * 30 * 53 + 256, ["video", "text"],
     "key_padding", 24, 128, 48),
    ({"_class_name": "SkyReelsV2Transformer3DModel", "patch_size": [1, 2, 2],
      "num_attention_heads": 12, "attention_head_dim": 128, "num_layers": 30,
      "ffn_dim": 8960},
     dict(height=544, width=960, num_frames=97), 25 * 34 * 60, ["video"], "none", 12, 128,
     30),
    ({"_class_name": "ZImageTransformer2DModel", "all_patch_size": [2], "dim": 3840,
      "n_layers": 30, "n_heads": 30, "n_kv_heads": 30},
     dict(height=1024, width=1024), 4096 + 512, ["image", "text"], "key_padding", 30, 128,
     30),
    # LTX-2 (its video stream; defaults = LTX-2 19B): VAE 8 x 32, patch 1, Gemma text 1024
    # in the cross-attention: 16 x 16 x 24.
    ({"_class_name": "LTX2VideoTransformer3DModel", "num_attention_heads": 32,
      "attention_head_dim": 128, "num_layers": 48, "patch_size": 1, "patch_size_t": 1,
      "vae_scale_factors": [8, 32, 32]},
     dict(height=512, width=768, num_frames=121), 16 * 16 * 24, ["video"], "none", 32, 128,
     48),
    ({"_class_name": "ChromaTransformer2DModel", "patch_size": 1, "num_layers": 19,
      "num_single_layers": 38, "attention_head_dim": 128, "num_attention_heads": 24},
     dict(height=1024, width=1024), 512 + 4096, ["text", "image"], "key_padding", 24, 128,
     57),
    ({"_class_name": "CogView4Transformer2DModel", "patch_size": 2, "num_layers": 28,
      "attention_head_dim": 128, "num_attention_heads": 32},
     dict(height=1024, width=1024), 1024 + 4096, ["text", "image"], "none", 32, 128, 28),
    ({"_class_name": "CosmosTransformer3DModel", "num_attention_heads": 32,
      "attention_head_dim": 128, "num_layers": 28, "patch_size": [1, 2, 2]},
     dict(height=704, width=1280, num_frames=121), 16 * 44 * 80, ["video"], "none", 32, 128,
     28),
    # Allegro: 88 frames -> 22 latent frames (its even-frame rule ceil(88 / 4)).
    ({"_class_name": "AllegroTransformer3DModel", "num_attention_heads": 24,
      "attention_head_dim": 96, "num_layers": 32, "patch_size": 2, "patch_size_t": 1},
     dict(height=720, width=1280, num_frames=88), 22 * 45 * 80, ["video"], "none", 24, 96,
     32),
    ({"_class_name": "Lumina2Transformer2DModel", "patch_size": 2, "hidden_size": 2304,
      "num_layers": 26, "num_attention_heads": 24, "num_kv_heads": 8},
     dict(height=1024, width=1024), 256 + 4096, ["text", "image"], "key_padding", 24, 96,
     26),
    ({"_class_name": "SanaTransformer2DModel", "num_attention_heads": 70,
      "attention_head_dim": 32, "num_layers": 20, "patch_size": 1,
      "num_cross_attention_heads": 20, "cross_attention_head_dim": 112},
     dict(height=1024, width=1024), 32 * 32, ["image"], "none", 70, 32, 20),
    # HiDream-I1 (Full / Dev / Fast): text = T5 128 + two Llama-3.1 layers of 128, after
    # the image; non-square images are padded to max_resolution^2 / 4 = 4096 tokens.
    ({"_class_name": "HiDreamImageTransformer2DModel", "patch_size": 2, "num_layers": 16,
      "num_single_layers": 32, "attention_head_dim": 128, "num_attention_heads": 20,
      "max_resolution": [128, 128]},
     dict(height=1024, width=1024), 4096 + 384, ["image", "text"], "none", 20, 128, 48),
    ({"_class_name": "HiDreamImageTransformer2DModel", "patch_size": 2, "num_layers": 16,
      "num_single_layers": 32, "attention_head_dim": 128, "num_attention_heads": 20,
      "max_resolution": [128, 128]},
     dict(height=768, width=1360), 4096 + 384, ["image", "text"], "none", 20, 128, 48),
    # ChronoEdit-14B: Wan2.1's architecture, text in the cross-attention.
    ({"_class_name": "ChronoEditTransformer3DModel", "patch_size": [1, 2, 2],
      "num_attention_heads": 40, "attention_head_dim": 128, "num_layers": 40},
     dict(height=480, width=832, num_frames=5), 2 * 30 * 52, ["video"], "none", 40, 128, 40),
    # EasyAnimate V5.1: [Qwen2-VL text 256, video], VAE 8 x 4, patch 2.
    ({"_class_name": "EasyAnimateTransformer3DModel", "num_attention_heads": 48,
      "attention_head_dim": 64, "num_layers": 48, "patch_size": 2},
     dict(height=512, width=512, num_frames=49), 256 + 13 * 32 * 32, ["text", "video"], "none",
     48, 64, 48),
]


@pytest.mark.parametrize("cfg,kw,tokens,order,mask,H,D,layers", NEW_MODELS)
def test_more_models(cfg, kw, tokens, order, mask, H, D, layers):
    """Tokens, text position, mask, heads and layers as the models' diffusers code has
    them: FLUX.2 packs 2x2 (VAE 8) with Mistral text first; HunyuanVideo-1.5 VAE 16x4,
    text = Qwen2.5-VL 1000 + byT5 256 + SigLIP 729 after the video; Mochi VAE 8x6,
    patch 2, text 256 after the video; SkyReels-V2 as Wan (text in cross-attention);
    Z-Image [image, caption 512]."""
    plan = cpc.from_diffusers({"ulysses_degree": 2, "ulysses_anything": True}, cfg,
                              parameters=False, **kw)
    assert [s["name"] for s in plan["input"]["segments"]] == order
    assert plan["input"]["mask"] == mask
    assert (plan["model"]["heads"], plan["model"]["head_dim"], plan["model"]["layers"]) == \
        (H, D, layers)
    assert cpc.compile(plan).tokens == tokens


def test_reference_images_and_mode():
    qwen = config("qwen-image")
    one = cpc.from_diffusers({"ring_degree": 2}, qwen, height=1024, width=1024)
    edit = cpc.from_diffusers({"ring_degree": 2}, qwen, height=1024, width=1024,
                              reference_images=1)
    assert cpc.compile(edit).tokens - 512 == 2 * (cpc.compile(one).tokens - 512)
    tr = cpc.from_diffusers({"ring_degree": 2}, qwen, height=1024, width=1024,
                            mode="training")
    assert tr["input"]["mode"] == "training" and cpc.compile(tr).trains
    with pytest.raises(ValueError, match="mode"):
        cpc.from_diffusers({"ring_degree": 2}, qwen, height=1024, width=1024, mode="train")
    t = cpc.from_diffusers({"ring_degree": 2}, config("flux1-dev"), tokens=4096)
    assert cpc.compile(t).tokens == 4096 + 512


def test_hints_name_the_diffusers_fields():
    bad = cpc.from_diffusers({"ulysses_degree": 4}, config("flux1-dev"), height=1008,
                             width=1008)
    r = cpc.check(bad)
    assert not r.ok
    hints = " ".join(d.hint or "" for d in r.diagnostics)
    assert "ulysses_anything=True" in hints
    # a plain dict (not from from_diffusers) keeps cpc's own words
    r2 = cpc.check(dict(bad))
    assert "ulysses_anything=True" not in " ".join(d.hint or "" for d in r2.diagnostics)
    # the PlanError's own .hint and .message too (they kept the plan keys' words:
    # new-user trial), as its first error's diagnostic
    with pytest.raises(cpc.PlanError) as ei:
        cpc.compile(bad)
    e = ei.value
    first = next(d for d in e.diagnostics if d.severity == "error")
    assert e.hint == first.hint and "ulysses_anything=True" in e.hint, (e.hint, first.hint)
    assert "ulysses_anything=True" in e.message


def test_unpinned_degrees_sweep():
    """Degrees follow the variant and world_size (not pinned): --set world_size works."""
    plan = cpc.from_diffusers({"ulysses_degree": 2}, config("flux1-dev"), height=1024,
                              width=1024)
    assert plan["parallel"] == {"variant": "ulysses"}
    r = cpc.check(plan, set={"cluster.world_size": 8})
    assert r.ok and r.ulysses_degree == 8, r.diagnostics


def test_parameters_from_the_models_code():
    """model.parameters counted from diffusers' own class (meta device) where diffusers
    imports; FLUX.1-dev's is its published 11,901,408,320."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "accelerator"):
        pytest.skip("diffusers needs torch >= 2")
    pytest.importorskip("diffusers")
    plan = cpc.from_diffusers({"ring_degree": 2}, config("flux1-dev"), height=1024,
                              width=1024, steps=28)
    assert plan["model"]["parameters"] == 11901408320
    r = cpc.check(plan)
    assert r.ok and "ms_per_step" in r.predicted, r.predicted


# ---- the classes' token counts against the models' own attention (torch-2 tier) -------

def _tiny(cls, **kw):
    import diffusers
    return getattr(diffusers, cls)(**kw)


def _shape_cases():
    """(class, tiny config, inputs(torch, r), from_diffusers kwargs (the pixel size whose
    latents the pipeline makes at these shapes), plan attention, text tokens).  Latent
    shapes follow the pipelines' prepare_latents: Chroma packs 2x2 (VAE 8): 3x4 tokens =
    48x64 px; CogView4 / Lumina2 latents 6x8 (VAE 8, patch 2) = 48x64 px; Sana 3x4 (DC-AE
    32) = 96x128 px; LTX-2 latent 2x3x4 (VAE 8 x 32) = 9 frames of 96x128; Cosmos 2x4x6
    (VAE 8 x 8) = 9 frames of 32x48; Allegro 3x4x6 (VAE 8 x 4) = 7 frames of 32x48 (its
    odd-frame rule: ceil(6/4)+1 = 3 latent frames); HiDream 6x6 (VAE 8, patch 2) = 48x48 px,
    and 6x8 = 48x64 px, non-square: padded to max_resolution^2 / 4 = 64 tokens; its text
    T5 + two Llama layers; EasyAnimate 2x4x6 (VAE 8 x 4, patch 2) = 5 frames of 32x48."""
    B = 1
    return [
        ("LTX2VideoTransformer3DModel",
         dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16,
              cross_attention_dim=32, audio_in_channels=8, audio_out_channels=8,
              audio_num_attention_heads=2, audio_attention_head_dim=8,
              audio_cross_attention_dim=16, num_layers=1, caption_channels=32),
         lambda t, r: dict(hidden_states=r(B, 24, 8), audio_hidden_states=r(B, 5, 8),
                           encoder_hidden_states=r(B, 7, 32),
                           audio_encoder_hidden_states=r(B, 7, 32),
                           timestep=t.full((B,), 500.0), num_frames=2, height=3, width=4,
                           audio_num_frames=5, return_dict=False),
         dict(height=96, width=128, num_frames=9), "self", 7),
        ("ChromaTransformer2DModel",
         dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
              attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
              axes_dims_rope=(4, 6, 6), approximator_num_channels=8,
              approximator_hidden_dim=16, approximator_layers=1),
         lambda t, r: dict(hidden_states=r(B, 12, 16), encoder_hidden_states=r(B, 7, 32),
                           timestep=t.full((B,), 0.5), img_ids=t.zeros(12, 3),
                           txt_ids=t.zeros(7, 3), return_dict=False),
         dict(height=48, width=64), "joint", 7),
        ("CogView4Transformer2DModel",
         dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=16,
              num_attention_heads=2, text_embed_dim=32, time_embed_dim=16, condition_dim=8,
              pos_embed_max_size=16, sample_size=16, rope_axes_dim=(16, 16)),
         lambda t, r: dict(hidden_states=r(B, 4, 6, 8), encoder_hidden_states=r(B, 16, 32),
                           timestep=t.full((B,), 500.0),
                           original_size=t.tensor([[48., 64.]]),
                           target_size=t.tensor([[48., 64.]]),
                           crop_coords=t.tensor([[0., 0.]]), return_dict=False),
         dict(height=48, width=64), "joint", 16),
        ("CosmosTransformer3DModel",
         dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
              num_layers=1, text_embed_dim=32, adaln_lora_dim=8, max_size=(8, 16, 16),
              patch_size=(1, 2, 2), encoder_hidden_states_channels=32,
              crossattn_proj_in_channels=32, concat_padding_mask=False),
         lambda t, r: dict(hidden_states=r(B, 4, 2, 4, 6), timestep=t.full((B,), 500.0),
                           encoder_hidden_states=r(B, 7, 32), return_dict=False),
         dict(height=32, width=48, num_frames=9), "self", 7),
        ("AllegroTransformer3DModel",
         dict(patch_size=2, patch_size_t=1, num_attention_heads=2, attention_head_dim=16,
              in_channels=4, out_channels=4, num_layers=1, cross_attention_dim=32,
              sample_height=8, sample_width=8, sample_frames=4, caption_channels=32),
         lambda t, r: dict(hidden_states=r(B, 4, 3, 4, 6), encoder_hidden_states=r(B, 7, 32),
                           timestep=t.full((B,), 500.0), return_dict=False),
         dict(height=32, width=48, num_frames=7), "self", 7),
        ("Lumina2Transformer2DModel",
         dict(sample_size=16, patch_size=2, in_channels=4, hidden_size=64, num_layers=1,
              num_refiner_layers=1, num_attention_heads=4, num_kv_heads=2, multiple_of=16,
              axes_dim_rope=(4, 6, 6), axes_lens=(32, 32, 32), cap_feat_dim=32),
         lambda t, r: dict(hidden_states=r(B, 4, 6, 8), timestep=t.full((B,), 0.5),
                           encoder_hidden_states=r(B, 7, 32),
                           encoder_attention_mask=t.ones(B, 7, dtype=t.bool),
                           return_dict=False),
         dict(height=48, width=64), "joint", 7),
        ("SanaTransformer2DModel",
         dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
              num_layers=1, num_cross_attention_heads=2, cross_attention_head_dim=8,
              cross_attention_dim=32, caption_channels=32, sample_size=8, patch_size=1),
         lambda t, r: dict(hidden_states=r(B, 4, 3, 4), encoder_hidden_states=r(B, 7, 32),
                           timestep=t.full((B,), 500.0), return_dict=False),
         dict(height=96, width=128), "cross", 7),
        ("HiDreamImageTransformer2DModel",
         dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1,
              attention_head_dim=16, num_attention_heads=2, caption_channels=[32, 16],
              text_emb_dim=16, num_routed_experts=2, num_activated_experts=1,
              axes_dims_rope=(4, 6, 6), max_resolution=(16, 16), llama_layers=[0, 1]),
         lambda t, r: dict(hidden_states=r(B, 4, 6, 6), timesteps=t.full((B,), 500.0),
                           encoder_hidden_states_t5=r(B, 5, 32),
                           encoder_hidden_states_llama3=r(2, B, 6, 16),
                           pooled_embeds=r(B, 16), return_dict=False),
         dict(height=48, width=48), "joint", 5 + 6 + 6),
        # non-square: the image padded to max_resolution^2 / 4 = 64 tokens
        ("HiDreamImageTransformer2DModel",
         dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1,
              attention_head_dim=16, num_attention_heads=2, caption_channels=[32, 16],
              text_emb_dim=16, num_routed_experts=2, num_activated_experts=1,
              axes_dims_rope=(4, 6, 6), max_resolution=(16, 16), llama_layers=[0, 1]),
         lambda t, r: dict(hidden_states=r(B, 4, 6, 8), timesteps=t.full((B,), 500.0),
                           encoder_hidden_states_t5=r(B, 5, 32),
                           encoder_hidden_states_llama3=r(2, B, 6, 16),
                           pooled_embeds=r(B, 16), return_dict=False),
         dict(height=48, width=64), "joint", 5 + 6 + 6),
        # Z-Image: a 6x6 latent (9 tokens) and a 7-token caption, each padded to 32
        ("ZImageTransformer2DModel",
         dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=64, n_layers=1,
              n_refiner_layers=1, n_heads=4, n_kv_heads=4, cap_feat_dim=32,
              axes_dims=[4, 6, 6], axes_lens=[128, 32, 32]),
         lambda t, r: dict(x=[r(4, 1, 6, 6)], t=t.full((B,), 0.5), cap_feats=[r(7, 32)],
                           return_dict=False),
         dict(height=48, width=48), "joint", 7),
        ("EasyAnimateTransformer3DModel",
         dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
              patch_size=2, sample_width=8, sample_height=8, num_layers=1, mmdit_layers=1,
              time_embed_dim=16, text_embed_dim=32),
         lambda t, r: dict(hidden_states=r(B, 4, 2, 4, 6), timestep=t.full((B,), 500.0),
                           encoder_hidden_states=r(B, 7, 32), return_dict=False),
         dict(height=32, width=48, num_frames=5), "joint", 7),
    ]


@pytest.mark.parametrize("case", range(11), ids=lambda i: _SHAPE_IDS[i])
def test_tokens_match_the_models_attention(case, monkeypatch):
    """from_diffusers' tokens and heads for the classes added in this round, against the
    attention the model itself runs: a tiny random transformer of the class, fed the
    latents its pipeline makes for a pixel size, every SDPA call recorded (q, k shapes:
    [B, H, S, D]).  joint: text + image tokens == the longest query; self: the
    image/video tokens == a call whose queries and keys are all of them; cross: that
    query length against the whole text (Sana's with its own cross heads)."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "accelerator"):
        pytest.skip("diffusers needs torch >= 2 (scripts/test_torch.sh)")
    pytest.importorskip("diffusers")
    cls, tiny, make, kw, attention, text = _shape_cases()[case]
    torch.manual_seed(0)
    model = _tiny(cls, **tiny).eval()
    g = torch.Generator().manual_seed(0)
    x = make(torch, lambda *s: torch.randn(*s, generator=g))
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def rec(*a, **k):
        q = a[0] if a else k["query"]
        kk = a[1] if len(a) > 1 else k["key"]
        calls.append((tuple(q.shape), tuple(kk.shape)))
        return sdpa(*a, **k)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", rec)
    with torch.no_grad():
        model(**x)
    assert calls
    cfg = dict(model.config)
    cfg["_class_name"] = cls
    plan = cpc.from_diffusers(None, cfg, text_tokens=text, attention=attention,
                              parameters=False, **kw)
    tokens = cpc.compile(plan).tokens
    H = plan["model"]["heads"]
    if attention == "joint":
        q, k = max(calls, key=lambda c: c[0][2])
        assert (q[1], q[2], k[2]) == (H, tokens, tokens), (calls, tokens)
        # the text's place, as the processors concatenate (HiDream: [image, text])
        first = "image" if cls.startswith(("HiDream", "ZImage")) else "text"
        assert plan["input"]["segments"][0]["name"] == first
    elif attention == "self":
        assert ((1, H, tokens, plan["model"]["head_dim"]),) * 2 in \
            [(c[0], c[1]) for c in calls if c[0][2] == c[1][2]], (calls, tokens)
        assert any(c[0][2] == tokens and c[1][2] == text for c in calls), calls
    else:
        assert ((1, H, tokens, plan["model"]["head_dim"]), (1, H, text,
                plan["model"]["head_dim"])) in calls, (calls, tokens, H)
    if "kv_heads" in plan["model"]:          # Lumina2: GQA in the model's own attention
        assert plan["model"]["kv_heads"] == cfg["num_kv_heads"]


_SHAPE_IDS = ["ltx2", "chroma", "cogview4", "cosmos", "allegro", "lumina2", "sana",
              "hidream", "hidream-nonsquare", "zimage", "easyanimate"]
