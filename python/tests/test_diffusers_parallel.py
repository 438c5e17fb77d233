"""cpc.diffusers.parallelize on real diffusers models (the torch-2 tier).

Needs torch >= 2, diffusers and mpi4py (scripts/torch_venv.sh builds that venv;
scripts/test_torch.sh runs this file in it); skipped elsewhere (Debian's torch 1.13
cannot import diffusers).  Tiny random FluxTransformer2DModel, Flux2Transformer2DModel,
WanTransformer3DModel, QwenImageTransformer2DModel, HunyuanVideoTransformer3DModel,
CogVideoXTransformer3DModel, SD3Transformer2DModel, LTXVideoTransformer3DModel,
MochiTransformer3DModel, HunyuanVideo15Transformer3DModel, SkyReelsV2Transformer3DModel,
ChromaTransformer2DModel, CogView4Transformer2DModel, CosmosTransformer3DModel,
EasyAnimateTransformer3DModel, ChronoEditTransformer3DModel, AllegroTransformer3DModel,
ZImageTransformer2DModel, Lumina2Transformer2DModel, HiDreamImageTransformer2DModel,
LTX2VideoTransformer3DModel (video and audio outputs), HunyuanVideo-I2V (token_replace),
Cosmos 2.5 (image context) and SkyReels-V2 diffusion forcing
(seeded: the same weights on every rank), even and odd token counts, padded (masked)
text where the model masks it, fp32 and bf16,
every variant, inference and autograd training, 2 and 4 MPI processes, one torchrun
(gloo) run: each parallelized output (and, training, the input gradient and every
parameter's gradient summed over the ranks) against the same model in one process.
All cases of a process count run in ONE mpirun (diffusers_worker.py --cases), to keep
the tier at about a minute."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import HERE

torch = pytest.importorskip("torch")
if not hasattr(torch, "accelerator"):
    pytest.skip("diffusers needs torch >= 2 (scripts/test_torch.sh)", allow_module_level=True)
pytest.importorskip("diffusers")
pytest.importorskip("mpi4py")

WORKER = HERE / "diffusers_worker.py"
MPIRUN = shutil.which("mpirun")

# name: (worker options, expected variant)
CASES_2 = {
    "flux-ulysses-fp32": "--model flux --ulysses 2",
    "flux-ring-fp32": "--model flux --ring 2",
    "flux-ring-bf16": "--model flux --ring 2 --dtype bf16",
    "flux-ulysses-bf16": "--model flux --ulysses 2 --dtype bf16",
    "flux-ulysses_anything-odd-fp32": "--model flux --ulysses 2 --anything --heads 3 "
                                      "--tokens 25 --text 7",
    "flux-ring_anything-odd-bf16": "--model flux --ring 2 --anything --tokens 25 --text 7 "
                                   "--dtype bf16",
    "flux-ulysses-train-fp32": "--model flux --ulysses 2 --train --batch 2",
    "flux-ring_anything-odd-train-fp32": "--model flux --ring 2 --anything --tokens 23 "
                                         "--text 5 --train",
    # replicate_text=True (xDiT's layout): 7 text tokens whole on every rank, not split
    "flux-ring-replicate-odd-fp32": "--model flux --ring 2 --replicate-text --text 7",
    # replicate_text training: the text's gradients 1/P per rank (cpc.diffusers), the
    # parameter gradients summed by allreduce_grads equal the single-process ones
    "flux-ring-replicate-odd-train-fp32": "--model flux --ring 2 --replicate-text --text 7 "
                                          "--train",
    "flux-ulysses-replicate-odd-train-bf16": "--model flux --ulysses 2 --replicate-text "
                                             "--text 7 --train --dtype bf16",
    "flux-ring_anything-replicate-odd-train-fp32": "--model flux --ring 2 --anything "
                                                   "--tokens 23 --replicate-text --text 5 "
                                                   "--train",
    "flux-ulysses-replicate-odd-bf16": "--model flux --ulysses 2 --replicate-text --text 7 "
                                       "--dtype bf16",
    "flux2-ring-bf16": "--model flux2 --ring 2 --dtype bf16",
    "flux2-ulysses_anything-odd-train-fp32": "--model flux2 --ulysses 2 --anything "
                                             "--tokens 25 --text 7 --train",
    "wan-ulysses-fp32": "--model wan --ulysses 2",
    "wan-ring-bf16": "--model wan --ring 2 --dtype bf16",
    "wan-ring_anything-odd-fp32": "--model wan --ring 2 --anything --frames 3 --height 6 "
                                  "--width 6",
    "wan-ulysses_anything-odd-bf16": "--model wan --ulysses 2 --anything --heads 3 "
                                     "--frames 3 --height 6 --width 6 --dtype bf16",
    "wan-ring-train-fp32": "--model wan --ring 2 --train",
    "wan-ulysses-train-bf16": "--model wan --ulysses 2 --train --dtype bf16",
    "flux-ring-odd-refused": "--model flux --ring 2 --tokens 25 --text 7 "
                             "--expect-error PlanError",
    # QwenImage: its own _cp_plan (pos_embed output 1 = the text RoPE); the text key mask
    "qwen-ulysses-mask-fp32": "--model qwen --ulysses 2 --pad 2",
    "qwen-ring_anything-odd-bf16": "--model qwen --ring 2 --anything --tokens 25 --text 7 "
                                   "--pad -1 --dtype bf16",
    "qwen-ulysses-mask-train-fp32": "--model qwen --ulysses 2 --pad 3 --train --batch 2",
    # HunyuanVideo: cpc's split plan ([video, text], the refiner on the whole text)
    "hunyuan-ring-mask-fp32": "--model hunyuan --ring 2 --pad 2",
    "hunyuan-ring_anything-mask-refused": "--model hunyuan --ring 2 --anything --pad 2 "
                                          "--frames 3 --height 6 --width 6 "
                                          "--expect-error PlanError",
    # CogVideoX, SD3: processors that call torch's SDPA themselves
    "cogvideox-ulysses-train-fp32": "--model cogvideox --ulysses 2 --frames 2 --train",
    "sd3-ulysses-bf16": "--model sd3 --ulysses 2 --dtype bf16",
    "sd3-ring_anything-odd-fp32": "--model sd3 --ring 2 --anything --height 6 --width 6 "
                                  "--text 7",
    # LTX-Video: video self-attention + a masked text cross-attention (kv plan)
    "ltx-ulysses_anything-odd-mask-train-fp32": "--model ltx --ulysses 2 --anything --heads 3 "
                                                "--frames 3 --height 5 --width 5 --pad 1 "
                                                "--train",
    # Mochi: one attention call per batch element (batch 2: both rows of the key mask)
    "mochi-ring-mask-train-fp32": "--model mochi --ring 2 --pad 1 --batch 2 --train",
    # SD3.5 Medium's structure: an image-only attention (attn2) next to the joint one
    "sd35m-ring-train-fp32": "--model sd35m --ring 2 --train",
    # HunyuanVideo-1.5: text = Qwen + byT5 + SigLIP, reordered valid-first by the model
    "hunyuan15-ring-mask-fp32": "--model hunyuan15 --ring 2 --pad 2 --text 7 --batch 2",
    # CogView4: its processor calls torch's SDPA (cpc's split plan, the image RoPE split)
    "cogview4-ring_anything-odd-train-fp32": "--model cogview4 --ring 2 --anything "
                                             "--height 6 --width 6 --text 7 --train",
    # Allegro: the RoPE's per-token position grids (an input) split, a masked cross-attention
    "allegro-ulysses_anything-odd-mask-train-fp32": "--model allegro --ulysses 2 --anything "
                                                    "--heads 3 --frames 3 --height 6 "
                                                    "--width 6 --pad 1 --train",
    # ChronoEdit: Wan's architecture, its own _cp_plan
    "chronoedit-ulysses-fp32": "--model chronoedit --ulysses 2",
    # EasyAnimate: [text, video], torch SDPA (cpc's split plan)
    "easyanimate-ring_anything-odd-train-fp32": "--model easyanimate --ring 2 --anything "
                                                "--frames 3 --height 6 --width 6 --text 7 "
                                                "--train",
    # Cosmos: self-attention + a masked text cross-attention (cpc's split plan)
    "cosmos-ulysses_anything-odd-mask-train-fp32": "--model cosmos --ulysses 2 --anything "
                                                   "--heads 3 --frames 3 --height 6 "
                                                   "--width 6 --pad 1 --train",
    # Chroma: FLUX's architecture, attention_mask over [text, image] (cpc's split plan)
    "chroma-ring-mask-train-fp32": "--model chroma --ring 2 --pad 1 --train --batch 2",
    # SkyReels-V2: Wan's architecture without a diffusers _cp_plan (cpc's)
    "skyreels-ring_anything-odd-train-fp32": "--model skyreels --ring 2 --anything "
                                             "--frames 3 --height 6 --width 6 --train",
    # Z-Image: the model packs [image, caption] itself, each padded to a multiple of 32;
    # batch 2 with captions of 7 and 47 tokens: sample 0 padded to 96, its tail masked
    "zimage-ulysses-fp32": "--model zimage --ulysses 2 --height 4 --width 4 --text 7",
    "zimage-ring-mask-train-fp32": "--model zimage --ring 2 --batch 2 --pad 1 --height 4 "
                                   "--width 6 --text 7 --train",
    "zimage-ulysses-mask-bf16": "--model zimage --ulysses 2 --batch 2 --pad 1 --height 4 "
                                "--width 4 --text 7 --dtype bf16",
    # Lumina2: [caption L_i (encoder_attention_mask.sum), image] per sample, GQA
    "lumina2-ulysses_anything-odd-fp32": "--model lumina2 --ulysses 2 --anything --text 7",
    "lumina2-ulysses_anything-odd-mask-train-fp32": "--model lumina2 --ulysses 2 --anything "
                                                    "--text 7 --pad 1 --batch 2 --train",
    "lumina2-ring-bf16": "--model lumina2 --ring 2 --text 8 --dtype bf16",
    "lumina2-ring_anything-mask-refused": "--model lumina2 --ring 2 --anything --text 7 "
                                          "--pad 1 --batch 2 --expect-error PlanError",
    # an odd caption on ring 2: the hint offers *_anything, not replicate_text (refused)
    "lumina2-ring-odd-refused": "--model lumina2 --ring 2 --text 7 --expect-error PlanError",
    # HiDream: the text (T5 + Llama layers, re-assembled per block) whole on every rank
    "hidream-ring_anything-odd-fp32": "--model hidream --ring 2 --anything --height 6 "
                                      "--width 6 --text 5",
    "hidream-ulysses-train-fp32": "--model hidream --ulysses 2 --height 6 --width 8 "
                                  "--text 5 --train",
    "hidream-ring-bf16": "--model hidream --ring 2 --height 4 --width 4 --text 5 "
                         "--dtype bf16",
    # LTX-2: video self + text cross through cpc, audio whole on every rank,
    # video-to-audio over the all-gathered video K/V; per-token timestep (image-to-video)
    "ltx2-ulysses-mask-fp32": "--model ltx2 --ulysses 2 --frames 2 --height 3 --width 4 "
                              "--text 7 --pad 1",
    "ltx2-ring_anything-odd-train-fp32": "--model ltx2 --ring 2 --anything --frames 3 "
                                         "--height 3 --width 3 --text 7 --train --per-token",
    "ltx2-ring-bf16": "--model ltx2 --ring 2 --frames 2 --height 3 --width 4 --dtype bf16",
    # HunyuanVideo-I2V (token_replace): the first frame's 6 of 18 video tokens all on rank 0
    "hunyuani2v-ring-mask-train-fp32": "--model hunyuani2v --ring 2 --pad 1 --frames 3 "
                                       "--train",
    # SkyReels-V2 diffusion forcing (synchronous): a timestep per frame, so per-token
    # modulation (split with the video; the output norm's on the gathered video)
    "skyreels-ring_anything-odd-forcing-fp32": "--model skyreels --ring 2 --anything "
                                               "--frames 3 --height 6 --width 6 --forcing",
    "skyreels-ulysses-forcing-train-fp32": "--model skyreels --ulysses 2 --frames 3 "
                                           "--forcing --train",
    # Cosmos 2.5: the image context, a second cross-attention (5 tokens, whole)
    "cosmos25-ulysses_anything-odd-fp32": "--model cosmos25 --ulysses 2 --anything --heads 3 "
                                          "--frames 3 --height 6 --width 6",
    "cosmos25-ring-train-fp32": "--model cosmos25 --ring 2 --frames 2 --train",
}
CASES_4 = {
    "flux-unified-fp32": "--model flux --ring 2 --ulysses 2",
    "flux-ring-bf16": "--model flux --ring 4 --dtype bf16",
    "flux-ulysses_anything-odd-fp32": "--model flux --ulysses 4 --anything --heads 6 "
                                      "--tokens 27 --text 7",
    "flux-unified-train-fp32": "--model flux --ring 2 --ulysses 2 --train",
    "flux2-unified-fp32": "--model flux2 --ring 2 --ulysses 2",
    "flux-unified-replicate-odd-fp32": "--model flux --ring 2 --ulysses 2 --replicate-text "
                                       "--text 7",
    "flux-unified-replicate-odd-train-fp32": "--model flux --ring 2 --ulysses 2 "
                                             "--replicate-text --text 7 --train",
    "wan-ulysses-fp32": "--model wan --ulysses 4 --frames 4",
    "wan-ring_anything-odd-bf16": "--model wan --ring 4 --anything --frames 5 --height 6 "
                                  "--width 6 --dtype bf16",
    "wan-unified-train-fp32": "--model wan --ring 2 --ulysses 2 --frames 4 --train",
    "wan-ulysses-odd-refused": "--model wan --ulysses 4 --frames 5 --height 6 --width 6 "
                               "--expect-error PlanError",
    "qwen-unified-mask-bf16": "--model qwen --ring 2 --ulysses 2 --pad 2 --dtype bf16",
    "hunyuan-ulysses-mask-fp32": "--model hunyuan --ulysses 4 --pad 3 --frames 2",
    "cogvideox-ring-fp32": "--model cogvideox --ring 4 --frames 2",
    # CogVideoX's joint text must divide when it is split (the hint offers
    # replicate_text=True); held whole on every rank (xDiT's layout) it need not
    "cogvideox-ulysses-text-refused": "--model cogvideox --ulysses 4 --frames 2 --text 6 "
                                      "--expect-error PlanError",
    "cogvideox-ulysses-replicate-odd-fp32": "--model cogvideox --ulysses 4 --frames 2 "
                                            "--text 6 --replicate-text",
    "hunyuan-unified-replicate-mask-fp32": "--model hunyuan --ring 2 --ulysses 2 --frames 2 "
                                           "--text 7 --pad 2 --replicate-text",
    "sd3-unified-fp32": "--model sd3 --ring 2 --ulysses 2 --height 8 --width 4",
    "ltx-unified-mask-fp32": "--model ltx --ring 2 --ulysses 2 --pad 1",
    "mochi-unified-mask-fp32": "--model mochi --ring 2 --ulysses 2 --pad 2 --batch 2 "
                               "--frames 2",
    "hunyuan15-ulysses_anything-odd-mask-fp32": "--model hunyuan15 --ulysses 4 --anything "
                                                "--pad 1",
    "skyreels-unified-bf16": "--model skyreels --ring 2 --ulysses 2 --frames 4 --dtype bf16",
    "chroma-ulysses-mask-fp32": "--model chroma --ulysses 4 --pad 2",
    "cosmos-ring-mask-fp32": "--model cosmos --ring 4 --frames 4 --pad 2",
    "easyanimate-unified-fp32": "--model easyanimate --ring 2 --ulysses 2 --frames 4",
    "allegro-ring-mask-fp32": "--model allegro --ring 4 --frames 4 --pad 2",
    "cogview4-unified-bf16": "--model cogview4 --ring 2 --ulysses 2 --width 8 --text 16 "
                             "--dtype bf16",
    "sd35m-ulysses_anything-odd-fp32": "--model sd35m --ulysses 4 --anything --height 6 "
                                       "--width 6 --text 7",
    "ltx2-unified-train-fp32": "--model ltx2 --ring 2 --ulysses 2 --frames 2 --height 3 "
                               "--width 4 --text 7 --pad 2 --train",
    # first-frame tokens 5 + 1 + 0 + 0 of an uneven 5/5/4/4 split
    "hunyuani2v-ulysses_anything-odd-mask-bf16": "--model hunyuani2v --ulysses 4 --anything "
                                                 "--pad 2 --frames 3 --dtype bf16",
}
CASES_TORCHRUN = {
    "flux-ulysses-fp32": "--model flux --ulysses 2",
    "wan-ring_anything-odd-train-fp32": "--model wan --ring 2 --anything --frames 3 "
                                        "--height 6 --width 6 --train",
    "qwen-ring-mask-fp32": "--model qwen --ring 2 --pad 2",
    "hunyuan-ulysses-mask-fp32": "--model hunyuan --ulysses 2 --pad 1",
    "cogvideox-ulysses-fp32": "--model cogvideox --ulysses 2 --frames 2",
    "sd3-ring-fp32": "--model sd3 --ring 2",
    "ltx-ulysses-mask-fp32": "--model ltx --ulysses 2 --pad 2",
    "mochi-ulysses-mask-bf16": "--model mochi --ulysses 2 --pad 2 --dtype bf16",
    "cogview4-ulysses-fp32": "--model cogview4 --ulysses 2 --text 16",
    "cosmos-ring-mask-fp32": "--model cosmos --ring 2 --pad 1",
    "easyanimate-ulysses-bf16": "--model easyanimate --ulysses 2 --dtype bf16",
    "hunyuan15-ulysses-mask-fp32": "--model hunyuan15 --ulysses 2 --pad 1 --text 7",
    # the gathered video K/V's summing backward over gloo (torch.distributed all_reduce)
    "ltx2-ring_anything-odd-train-fp32": "--model ltx2 --ring 2 --anything --frames 3 "
                                         "--height 3 --width 3 --text 7 --train --per-token",
}

# attention calls per forward: the tiny models' layers (x2 where a layer has a text
# cross-attention as well; Mochi: x batch, one call per batch element)
CALLS = {"flux": 2, "flux2": 2, "wan": 4, "qwen": 2, "hunyuan": 2, "cogvideox": 2, "sd3": 2,
         "ltx": 4, "mochi": 2, "sd35m": 3, "hunyuan15": 2, "skyreels": 4, "chroma": 2,
         "cogview4": 2, "cosmos": 4, "easyanimate": 2, "chronoedit": 4,
         "allegro": 4, "zimage": 2, "lumina2": 2, "hidream": 2, "ltx2": 2, "hunyuani2v": 2,
         "cosmos25": 6}

# The main plan's segments ([name, tokens, split]) and heads for the cases of the models
# that assemble their sequence themselves, from the models' own rules: Z-Image pads image
# and caption to multiples of 32 (4x4 latent / patch 2 = 4 -> 32; captions 7, 47 -> 32,
# 64); Lumina2 [caption (mask sum), image (4x6 / 2x2 = 6)]; HiDream [image, T5 5 + Llama
# 6 + 6 replicated], a non-square 6x8 latent padded to max_resolution^2 / 4 = 64; LTX-2
# the video's frames x height x width.  cpc.Attention checks every call's q/k/v against
# the plan's shard shapes, so the attention saw these tokens and heads.
PLAN_FACTS = {
    "zimage-ulysses-fp32": ([["image", 32, "shard"], ["text", 32, "shard"]], 4, None),
    "zimage-ring-mask-train-fp32": ([["image", 32, "shard"], ["text", 64, "shard"]], 4, None),
    "lumina2-ulysses_anything-odd-fp32": ([["text", 7, "shard"], ["image", 6, "shard"]], 4, 2),
    "lumina2-ulysses_anything-odd-mask-train-fp32": ([["text", 6, "shard"],
                                                      ["image", 6, "shard"]], 4, 2),
    "hidream-ring_anything-odd-fp32": ([["image", 9, "shard"], ["text", 17, "replicate"]], 4,
                                       None),
    "hidream-ulysses-train-fp32": ([["image", 64, "shard"], ["text", 17, "replicate"]], 4,
                                   None),
    "ltx2-ring_anything-odd-train-fp32": ([["video", 27, "shard"]], 4, None),
}


def _env():
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _launch(cmd, cases, tmp_path, tag, extra=()):
    f = tmp_path / f"cases-{tag}.txt"
    f.write_text("".join(f"{opts} --name {name}\n" for name, opts in cases.items()))
    out = tmp_path / f"out-{tag}"
    out.mkdir()
    p = subprocess.run(cmd + [str(WORKER), "--cases", str(f), "--out", str(out), *extra],
                       capture_output=True, text=True, timeout=600, env=_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    res = {}
    for fr in sorted(out.glob("rank*.jsonl")):
        for line in fr.read_text().splitlines():
            d = json.loads(line)
            res.setdefault(d["name"], []).append(d)
    return res


def _mpirun(n):
    if MPIRUN is None:
        pytest.skip("no mpirun")
    return [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n),
            "-x", "PYTHONPATH", "-x", "CPC_LIBRARY", "-x", "OPENBLAS_NUM_THREADS",
            "-x", "OMP_NUM_THREADS", sys.executable]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp")
    return {2: _launch(_mpirun(2), CASES_2, tmp, 2), 4: _launch(_mpirun(4), CASES_4, tmp, 4)}


def _check(name, runs, nproc):
    assert runs, f"{name}: no result"
    d = runs[0]
    opts = {**CASES_2, **CASES_4, **CASES_TORCHRUN}
    if "--expect-error" in (CASES_2.get(name, "") if nproc == 2 else CASES_4.get(name, "")):
        # every rank raised the same error before any collective (no hang)
        assert len(runs) == nproc, runs
        assert all(r["error"] == "PlanError" for r in runs)
        assert all("CP01" in r["message"] and "_anything=True" in r["message"] for r in runs)
        if name.startswith("cogvideox"):       # the text's way out: xDiT's layout
            assert all("replicate_text=True" in r["message"] for r in runs), runs
        if name.startswith(("lumina2", "zimage")):     # which refuse replicate_text
            assert not any("replicate_text" in r["message"] for r in runs), runs
        return
    assert "error" not in d, d
    bf16 = "bf16" in name
    # fp32: cpc's attention vs torch's SDPA differ by rounding only; bf16: the attention
    # output is rounded to bf16 at different points (cpc: once; SDPA: its own blocking)
    tol = 2e-2 if bf16 else 2e-6
    assert d["out"] < tol, d
    # every attention of the model went through cpc
    family = name.split("-")[0]
    assert d["cpc_calls"] == CALLS[family] * (d["batch"] if family == "mochi" else 1), d
    # LTX-2's video-to-audio attention: one per layer over the gathered video K/V
    assert d["gathered_calls"] == (1 if family == "ltx2" else 0), d
    if name in PLAN_FACTS:
        segs, heads, kv_heads = PLAN_FACTS[name]
        assert (d["plan"]["segments"], d["plan"]["heads"], d["plan"]["kv_heads"]) == \
            (segs, heads, kv_heads), d
    # a padded text reached cpc as a key mask (joint: [0]; LTX's cross-attention: [1])
    if "-mask" in name:
        want_masks = [[False, True]] if name.startswith(("ltx", "cosmos", "allegro")) else \
            [[True, False]]
        assert d["masks"] == want_masks, d
    want = {"ring": "ring", "ulysses": "ulysses", "unified": "unified",
            "ring_anything": "ring_anything", "ulysses_anything": "ulysses_anything"}
    assert d["variant"] == want[name.split("-")[1]], d
    if "train" in name:
        gtol = 1e-1 if bf16 else 2e-5
        assert d["grad_max"] < gtol, d
        assert d["dx"] < (2e-2 if bf16 else 2e-6), d
    assert opts


@pytest.mark.parametrize("name", list(CASES_2))
def test_mpirun_2(results, name):
    _check(name, results[2].get(name), 2)


@pytest.mark.parametrize("name", list(CASES_4))
def test_mpirun_4(results, name):
    _check(name, results[4].get(name), 4)


def test_torchrun(tmp_path):
    """torch.distributed (gloo) as comm, launched by torchrun as diffusers users do."""
    import socket
    with socket.socket() as s:  # a free port (a fixed one collides with another run's)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = _launch([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                   "--master-addr", "127.0.0.1", "--master-port", str(port)], CASES_TORCHRUN,
                  tmp_path, "tr",
                  extra=["--torchrun"])
    for name in CASES_TORCHRUN:
        _check(name, res.get(name), 2)


def test_torch_imports_after_a_cpc_call():
    """libcpc and torch both need libnccl.so.2 and the loader serves one per soname: with
    the system's older NCCL loaded by libcpc first, `import torch` after a cpc call failed
    with `undefined symbol: ncclCommResume` (cpc now loads the NCCL wheel first)."""
    code = ("import cpc\n"
            f"assert cpc.check({str(HERE.parent.parent / 'plans' / 'flux1-dev-1008.yaml')!r}).ok\n"
            "import torch\n"
            "print('ok', torch.zeros(3).sum().item())\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0 and "ok 0.0" in r.stdout, r.stderr[-2000:]


def _tiny(cls, **kw):
    import diffusers
    torch.manual_seed(0)
    return getattr(diffusers, cls)(**kw)


def test_refusals_name_the_field():
    """What parallelize refuses, in one process (every refusal comes before any
    collective): the message names the diffusers class / field and says why, the hint what
    runs instead."""
    import cpc
    import cpc.diffusers
    from diffusers_worker import tiny_cogview4, tiny_hidream, tiny_ltx2, tiny_zimage
    pc = {"ulysses_degree": 2}
    sana = _tiny("SanaTransformer2DModel", in_channels=4, out_channels=4, num_attention_heads=2,
                 attention_head_dim=16, num_layers=1, num_cross_attention_heads=2,
                 cross_attention_head_dim=8, cross_attention_dim=32, caption_channels=32,
                 sample_size=8, patch_size=1)
    with pytest.raises(cpc.UnsupportedError, match="linear") as e:
        cpc.diffusers.parallelize(sana, pc)
    assert "model.attention: linear" in str(e.value) and e.value.hint
    z = tiny_zimage(4)
    with pytest.raises(cpc.UnsupportedError, match="replicate_text"):
        cpc.diffusers.parallelize(z, pc, replicate_text=True)
    # a misspelt from_diffusers keyword fails at once (it failed at the first forward)
    with pytest.raises(TypeError, match="did you mean 'replicate_text'"):
        cpc.diffusers.parallelize(z, pc, replicat_text=True)
    assert not cpc.diffusers.is_parallelized(z)
    h = tiny_hidream(4)
    with pytest.raises(cpc.UnsupportedError, match="Llama"):
        cpc.diffusers.parallelize(h, pc, replicate_text=False)
    assert not cpc.diffusers.is_parallelized(h)
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    # at the call, before any collective: the field named
    cpc.diffusers.parallelize(z, pc)
    with pytest.raises(cpc.UnsupportedError, match="different image sizes"):
        z(x=[r(4, 1, 4, 4), r(4, 1, 16, 16)], t=torch.full((2,), 0.5),
          cap_feats=[r(7, 32), r(7, 32)])
    with pytest.raises(cpc.UnsupportedError, match="omni mode") as e:
        z(x=[[r(4, 1, 4, 4)]], t=torch.full((1,), 0.5), cap_feats=[[r(7, 32)]])
    assert "basic mode" in e.value.hint
    cpc.diffusers.unparallelize(z)
    c4 = tiny_cogview4(2)
    cpc.diffusers.parallelize(c4, pc)
    px = torch.tensor([[32.0, 32.0]])
    with pytest.raises(cpc.UnsupportedError, match="attention_mask") as e:
        c4(hidden_states=r(1, 4, 4, 4), encoder_hidden_states=r(1, 16, 32),
           timestep=torch.full((1,), 500.0), original_size=px, target_size=px,
           crop_coords=torch.zeros(1, 2), attention_mask=torch.ones(1, 16))
    assert "CogView4Pipeline" in e.value.hint
    cpc.diffusers.unparallelize(c4)
    x2 = tiny_ltx2(2)
    cpc.diffusers.parallelize(x2, pc)
    with pytest.raises(cpc.UnsupportedError, match="video_self_attention_mask") as e:
        x2(hidden_states=r(1, 24, 8), audio_hidden_states=r(1, 5, 8),
           encoder_hidden_states=r(1, 7, 32), audio_encoder_hidden_states=r(1, 7, 32),
           timestep=torch.full((1,), 500.0), num_frames=2, height=3, width=4,
           audio_num_frames=5, video_self_attention_mask=torch.ones(1, 24, 24))
    assert "drop video_self_attention_mask" in e.value.hint
    cpc.diffusers.unparallelize(x2)
    from diffusers_worker import tiny_flux2, tiny_skyreels
    f2 = tiny_flux2(2)
    cpc.diffusers.parallelize(f2, pc)
    with pytest.raises(cpc.UnsupportedError, match="kv_cache_mode") as e:
        f2(hidden_states=r(1, 8, 16), encoder_hidden_states=r(1, 4, 32),
           timestep=torch.full((1,), 0.5), img_ids=torch.zeros(1, 8, 4),
           txt_ids=torch.zeros(1, 4, 4), kv_cache_mode="extract", num_ref_tokens=4)
    assert "Flux2Pipeline" in e.value.hint
    cpc.diffusers.unparallelize(f2)
    sk = tiny_skyreels(2)
    sk._set_ar_attention(2)            # the asynchronous mode's causal_block_size 2
    cpc.diffusers.parallelize(sk, pc)
    with pytest.raises(cpc.UnsupportedError, match="block-causal") as e:
        sk(hidden_states=r(1, 4, 2, 4, 4), encoder_hidden_states=r(1, 4, 32),
           timestep=torch.full((1, 2), 500.0), enable_diffusion_forcing=True)
    assert "causal_block_size=1" in e.value.hint
    cpc.diffusers.unparallelize(sk)
