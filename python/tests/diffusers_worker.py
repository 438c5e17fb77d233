"""One process of a cpc.diffusers.parallelize check (run under mpirun or torchrun by
test_diffusers_parallel.py): a tiny random diffusers model, the same on every rank (seeded),
run once as is (the single-process reference) and once parallelized; rank 0 prints one
JSON line with the relative errors (output; with --train also the summed parameter
gradients and the input gradient).

    mpirun -np 2 python diffusers_worker.py --model flux --ulysses 2 --tokens 24 --text 7
"""

import argparse
import json
import os
import sys
import time


def tiny_flux(heads):
    from diffusers import FluxTransformer2DModel
    return FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1,
                                  num_single_layers=1, attention_head_dim=16,
                                  num_attention_heads=heads, joint_attention_dim=32,
                                  pooled_projection_dim=32, guidance_embeds=False,
                                  axes_dims_rope=(4, 6, 6))


def tiny_flux2(heads):
    from diffusers import Flux2Transformer2DModel
    return Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=1,
                                   num_single_layers=1, attention_head_dim=16,
                                   num_attention_heads=heads, joint_attention_dim=32,
                                   timestep_guidance_channels=32, guidance_embeds=False,
                                   axes_dims_rope=(4, 4, 4, 4))


def tiny_wan(heads):
    from diffusers import WanTransformer3DModel
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=heads,
                                 attention_head_dim=16, in_channels=4, out_channels=4,
                                 text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2,
                                 cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                 rope_max_seq_len=64)


def tiny_skyreels(heads):
    from diffusers import SkyReelsV2Transformer3DModel
    return SkyReelsV2Transformer3DModel(patch_size=(1, 2, 2), num_attention_heads=heads,
                                        attention_head_dim=16, in_channels=4, out_channels=4,
                                        text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2,
                                        cross_attn_norm=True,
                                        qk_norm="rms_norm_across_heads", rope_max_seq_len=64)


def tiny_chroma(heads):
    from diffusers import ChromaTransformer2DModel
    return ChromaTransformer2DModel(patch_size=1, in_channels=16, num_layers=1,
                                    num_single_layers=1, attention_head_dim=16,
                                    num_attention_heads=heads, joint_attention_dim=32,
                                    axes_dims_rope=(4, 6, 6), approximator_num_channels=8,
                                    approximator_hidden_dim=16, approximator_layers=1)


def tiny_cogview4(heads):
    from diffusers import CogView4Transformer2DModel
    return CogView4Transformer2DModel(patch_size=2, in_channels=4, out_channels=4,
                                      num_layers=2, attention_head_dim=16,
                                      num_attention_heads=heads, text_embed_dim=32,
                                      time_embed_dim=16, condition_dim=8,
                                      pos_embed_max_size=16, sample_size=16,
                                      rope_axes_dim=(16, 16))


def tiny_cosmos(heads):
    from diffusers import CosmosTransformer3DModel
    return CosmosTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=heads,
                                    attention_head_dim=16, num_layers=2, text_embed_dim=32,
                                    adaln_lora_dim=8, max_size=(8, 16, 16),
                                    patch_size=(1, 2, 2), encoder_hidden_states_channels=32,
                                    crossattn_proj_in_channels=32, concat_padding_mask=False)


def tiny_easyanimate(heads):
    from diffusers import EasyAnimateTransformer3DModel
    return EasyAnimateTransformer3DModel(num_attention_heads=heads, attention_head_dim=16,
                                         in_channels=4, out_channels=4, patch_size=2,
                                         sample_width=8, sample_height=8, num_layers=2,
                                         mmdit_layers=1, time_embed_dim=16, text_embed_dim=32)


def tiny_chronoedit(heads):
    from diffusers import ChronoEditTransformer3DModel
    return ChronoEditTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=heads,
                                        attention_head_dim=16, in_channels=4, out_channels=4,
                                        text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2,
                                        rope_max_seq_len=64)


def tiny_allegro(heads):
    from diffusers import AllegroTransformer3DModel
    return AllegroTransformer3DModel(patch_size=2, patch_size_t=1, num_attention_heads=heads,
                                     attention_head_dim=24, in_channels=4, out_channels=4,
                                     num_layers=2, cross_attention_dim=24 * heads,
                                     sample_height=8, sample_width=8, sample_frames=4,
                                     caption_channels=32)


def tiny_qwen(heads):
    from diffusers import QwenImageTransformer2DModel
    return QwenImageTransformer2DModel(patch_size=1, in_channels=16, out_channels=16,
                                       num_layers=2, attention_head_dim=16,
                                       num_attention_heads=heads, joint_attention_dim=32,
                                       axes_dims_rope=(4, 6, 6))


def tiny_hunyuan(heads):
    from diffusers import HunyuanVideoTransformer3DModel
    return HunyuanVideoTransformer3DModel(in_channels=4, out_channels=4,
                                          num_attention_heads=heads, attention_head_dim=16,
                                          num_layers=1, num_single_layers=1,
                                          num_refiner_layers=1, patch_size=2, patch_size_t=1,
                                          guidance_embeds=False, text_embed_dim=32,
                                          pooled_projection_dim=32, rope_axes_dim=(4, 6, 6))


def tiny_hunyuani2v(heads):
    """HunyuanVideo-I2V's structure: image_condition_type token_replace (the first latent
    frame's tokens modulated apart in every block)."""
    from diffusers import HunyuanVideoTransformer3DModel
    return HunyuanVideoTransformer3DModel(in_channels=4, out_channels=4,
                                          num_attention_heads=heads, attention_head_dim=16,
                                          num_layers=1, num_single_layers=1,
                                          num_refiner_layers=1, patch_size=2, patch_size_t=1,
                                          guidance_embeds=False, text_embed_dim=32,
                                          pooled_projection_dim=32, rope_axes_dim=(4, 6, 6),
                                          image_condition_type="token_replace")


def tiny_cosmos25(heads):
    """Cosmos 2.5's structure: an image context (a second cross-attention per block)."""
    from diffusers import CosmosTransformer3DModel
    return CosmosTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=heads,
                                    attention_head_dim=16, num_layers=2, text_embed_dim=32,
                                    adaln_lora_dim=8, max_size=(8, 16, 16),
                                    patch_size=(1, 2, 2), encoder_hidden_states_channels=32,
                                    crossattn_proj_in_channels=32, concat_padding_mask=False,
                                    img_context_dim_in=16, img_context_num_tokens=5,
                                    img_context_dim_out=16 * heads)


def tiny_cogvideox(heads):
    from diffusers import CogVideoXTransformer3DModel
    return CogVideoXTransformer3DModel(num_attention_heads=heads, attention_head_dim=16,
                                       in_channels=4, out_channels=4, time_embed_dim=32,
                                       text_embed_dim=32, num_layers=2, sample_width=8,
                                       sample_height=8, sample_frames=9, patch_size=2,
                                       max_text_seq_length=8,
                                       use_rotary_positional_embeddings=True)


def tiny_sd3(heads):
    from diffusers import SD3Transformer2DModel
    return SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=2,
                                 attention_head_dim=16, num_attention_heads=heads,
                                 joint_attention_dim=32, caption_projection_dim=16 * heads,
                                 pooled_projection_dim=32, out_channels=4,
                                 pos_embed_max_size=16)


def tiny_sd35m(heads):
    """SD3.5 Medium's structure: dual attention (an image-only attn2) in block 0."""
    from diffusers import SD3Transformer2DModel
    return SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=2,
                                 attention_head_dim=16, num_attention_heads=heads,
                                 joint_attention_dim=32, caption_projection_dim=16 * heads,
                                 pooled_projection_dim=32, out_channels=4,
                                 pos_embed_max_size=16, dual_attention_layers=(0,),
                                 qk_norm="rms_norm")


def tiny_ltx(heads):
    from diffusers import LTXVideoTransformer3DModel
    return LTXVideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=heads,
                                      attention_head_dim=16, cross_attention_dim=16 * heads,
                                      num_layers=2, caption_channels=32)


def tiny_hunyuan15(heads):
    from diffusers import HunyuanVideo15Transformer3DModel
    return HunyuanVideo15Transformer3DModel(in_channels=4, out_channels=4,
                                            num_attention_heads=heads, attention_head_dim=16,
                                            num_layers=2, num_refiner_layers=1,
                                            patch_size=2, patch_size_t=1, text_embed_dim=32,
                                            text_embed_2_dim=16, image_embed_dim=16,
                                            rope_axes_dim=(4, 6, 6), target_size=64)


def tiny_mochi(heads):
    from diffusers import MochiTransformer3DModel
    return MochiTransformer3DModel(patch_size=2, num_attention_heads=heads,
                                   attention_head_dim=16, num_layers=2,
                                   pooled_projection_dim=16, in_channels=4, text_embed_dim=32,
                                   time_embed_dim=16, max_sequence_length=16)


def tiny_zimage(heads):
    from diffusers import ZImageTransformer2DModel
    return ZImageTransformer2DModel(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4,
                                    dim=16 * heads, n_layers=2, n_refiner_layers=1,
                                    n_heads=heads, n_kv_heads=heads, cap_feat_dim=32,
                                    axes_dims=[4, 6, 6], axes_lens=[128, 32, 32])


def tiny_lumina2(heads):
    from diffusers import Lumina2Transformer2DModel
    return Lumina2Transformer2DModel(sample_size=16, patch_size=2, in_channels=4,
                                     hidden_size=16 * heads, num_layers=2,
                                     num_refiner_layers=1, num_attention_heads=heads,
                                     num_kv_heads=heads // 2, multiple_of=16,
                                     axes_dim_rope=(4, 6, 6), axes_lens=(32, 32, 32),
                                     cap_feat_dim=32)


def tiny_hidream(heads):
    from diffusers import HiDreamImageTransformer2DModel
    return HiDreamImageTransformer2DModel(patch_size=2, in_channels=4, out_channels=4,
                                          num_layers=1, num_single_layers=1,
                                          attention_head_dim=16, num_attention_heads=heads,
                                          caption_channels=[32, 16], text_emb_dim=16,
                                          num_routed_experts=2, num_activated_experts=1,
                                          axes_dims_rope=(4, 6, 6), max_resolution=(16, 16),
                                          llama_layers=[0, 1])


def tiny_ltx2(heads):
    from diffusers import LTX2VideoTransformer3DModel
    return LTX2VideoTransformer3DModel(in_channels=8, out_channels=8,
                                       num_attention_heads=heads, attention_head_dim=16,
                                       cross_attention_dim=16 * heads, audio_in_channels=8,
                                       audio_out_channels=8, audio_num_attention_heads=2,
                                       audio_attention_head_dim=8,
                                       audio_cross_attention_dim=16, num_layers=1,
                                       caption_channels=32)


MODELS = {"flux": tiny_flux, "flux2": tiny_flux2, "wan": tiny_wan, "qwen": tiny_qwen,
          "hunyuan": tiny_hunyuan, "cogvideox": tiny_cogvideox, "sd3": tiny_sd3,
          "ltx": tiny_ltx, "mochi": tiny_mochi, "sd35m": tiny_sd35m,
          "hunyuan15": tiny_hunyuan15, "skyreels": tiny_skyreels, "chroma": tiny_chroma,
          "cogview4": tiny_cogview4, "cosmos": tiny_cosmos,
          "easyanimate": tiny_easyanimate, "chronoedit": tiny_chronoedit,
          "allegro": tiny_allegro, "zimage": tiny_zimage, "lumina2": tiny_lumina2,
          "hidream": tiny_hidream, "ltx2": tiny_ltx2, "hunyuani2v": tiny_hunyuani2v,
          "cosmos25": tiny_cosmos25}


def text_mask(a, torch):
    """[B, T] 1/0: the last --pad text tokens are padding (batch element b: pad + b)."""
    m = torch.ones(a.batch, a.text, dtype=torch.long)
    for b in range(a.batch):
        if a.pad + b:
            m[b, a.text - a.pad - b:] = 0
    return m


def inputs(model, a, torch, dtype):
    g = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    B = a.batch
    if a.model == "flux2":
        N, T = a.tokens, a.text
        ids_img = torch.zeros(B, N, 4)
        ids_img[..., 1] = torch.arange(N) // 5
        ids_img[..., 2] = torch.arange(N) % 5
        ids_txt = torch.zeros(B, T, 4)
        ids_txt[..., 3] = torch.arange(T)
        return dict(hidden_states=r(B, N, 16), encoder_hidden_states=r(B, T, 32),
                    timestep=torch.full((B,), 0.5).to(dtype), img_ids=ids_img,
                    txt_ids=ids_txt, return_dict=False)
    if a.model == "chroma":
        N, T = a.tokens, a.text
        ids_img = torch.zeros(N, 3)
        ids_img[:, 1] = torch.arange(N) // 5
        ids_img[:, 2] = torch.arange(N) % 5
        am = torch.cat([text_mask(a, torch), torch.ones(B, N, dtype=torch.long)], 1)
        return dict(hidden_states=r(B, N, 16), encoder_hidden_states=r(B, T, 32),
                    timestep=torch.full((B,), 0.5).to(dtype), img_ids=ids_img,
                    txt_ids=torch.zeros(T, 3), attention_mask=am.bool(), return_dict=False)
    if a.model == "flux":
        N, T = a.tokens, a.text
        ids_img = torch.zeros(N, 3)
        ids_img[:, 1] = torch.arange(N) // 5
        ids_img[:, 2] = torch.arange(N) % 5
        return dict(hidden_states=r(B, N, 16), encoder_hidden_states=r(B, T, 32),
                    pooled_projections=r(B, 32), timestep=torch.full((B,), 0.5).to(dtype),
                    img_ids=ids_img, txt_ids=torch.zeros(T, 3), return_dict=False)
    F, H, W = a.frames, a.height, a.width
    if a.model == "zimage":
        # one image per sample, captions of --text (+ 40 for sample 1 with --pad: a longer
        # caption, so sample 0's unified sequence is padded and masked)
        caps = [a.text + (40 * b if a.pad else 0) for b in range(B)]
        return dict(x=[r(4, 1, H, W) for _ in range(B)], t=torch.full((B,), 0.5).to(dtype),
                    cap_feats=[r(c, 32) for c in caps], return_dict=False)
    if a.model == "lumina2":
        return dict(hidden_states=r(B, 4, H, W), timestep=torch.full((B,), 0.5).to(dtype),
                    encoder_hidden_states=r(B, a.text, 32),
                    encoder_attention_mask=text_mask(a, torch), return_dict=False)
    if a.model == "hidream":
        return dict(hidden_states=r(B, 4, H, W), timesteps=torch.full((B,), 500.0),
                    encoder_hidden_states_t5=r(B, a.text, 32),
                    encoder_hidden_states_llama3=r(2, B, 6, 16), pooled_embeds=r(B, 16),
                    return_dict=False)
    if a.model == "ltx2":
        ts = torch.full((B,), 500.0)
        if a.per_token:        # image-to-video: the first latent frame's tokens at t = 0
            ts = torch.full((B, F * H * W), 500.0)
            ts[:, :H * W] = 0.0
        return dict(hidden_states=r(B, F * H * W, 8), audio_hidden_states=r(B, 5, 8),
                    encoder_hidden_states=r(B, a.text, 32),
                    audio_encoder_hidden_states=r(B, a.text, 32), timestep=ts,
                    audio_timestep=torch.full((B,), 500.0),
                    encoder_attention_mask=text_mask(a, torch), num_frames=F, height=H,
                    width=W, audio_num_frames=5, return_dict=False)
    if a.model == "qwen":
        N, T = a.tokens, a.text
        h = {24: (4, 6), 25: (5, 5), 23: (1, 23), 27: (3, 9)}.get(N, (1, N))
        return dict(hidden_states=r(B, N, 16), encoder_hidden_states=r(B, T, 32),
                    encoder_hidden_states_mask=text_mask(a, torch) if a.pad >= 0 else None,
                    timestep=torch.full((B,), 0.5).to(dtype), img_shapes=[[(1, *h)]] * B,
                    return_dict=False)
    if a.model == "cosmos25":
        return dict(hidden_states=r(B, 4, F, H, W), timestep=torch.full((B,), 500.0),
                    encoder_hidden_states=(r(B, a.text, 32), r(B, 5, 16)), return_dict=False)
    if a.model in ("hunyuan", "hunyuani2v"):
        return dict(hidden_states=r(B, 4, F, H, W), timestep=torch.full((B,), 500.0),
                    encoder_hidden_states=r(B, a.text, 32),
                    encoder_attention_mask=text_mask(a, torch), pooled_projections=r(B, 32),
                    return_dict=False)
    if a.model == "cogvideox":
        S = F * (H // 2) * (W // 2)
        g2 = torch.Generator().manual_seed(5)
        ang = torch.rand(S, 16, generator=g2) * 6.3
        return dict(hidden_states=r(B, F, 4, H, W), encoder_hidden_states=r(B, a.text, 32),
                    timestep=torch.full((B,), 500.0),
                    image_rotary_emb=(ang.cos().to(dtype), ang.sin().to(dtype)),
                    return_dict=False)
    if a.model == "allegro":
        # the RoPE as AllegroPipeline._prepare_rotary_positional_embeddings makes it
        from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro
        ft, fh, fw, gt, gh, gw = get_3d_rotary_pos_embed_allegro(
            embed_dim=24, crops_coords=((0, 0), (H // 2, W // 2)), grid_size=(H // 2, W // 2),
            temporal_size=F, interpolation_scale=(2.2, 2.0, 2.0))
        pos = torch.cartesian_prod(gt.long(), gh.long(), gw.long())
        pos = pos.reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1).contiguous()
        return dict(hidden_states=r(B, 4, F, H, W), encoder_hidden_states=r(B, a.text, 32),
                    timestep=torch.full((B,), 500.0),
                    encoder_attention_mask=text_mask(a, torch),
                    image_rotary_emb=((ft, fh, fw), tuple(pos)), return_dict=False)
    if a.model == "easyanimate":
        return dict(hidden_states=r(B, 4, F, H, W), timestep=torch.full((B,), 500.0),
                    encoder_hidden_states=r(B, a.text, 32), return_dict=False)
    if a.model == "cosmos":
        return dict(hidden_states=r(B, 4, F, H, W), timestep=torch.full((B,), 500.0),
                    encoder_hidden_states=r(B, a.text, 32),
                    attention_mask=text_mask(a, torch).bool(), return_dict=False)
    if a.model == "cogview4":
        px = torch.tensor([[8.0 * H, 8.0 * W]] * B)
        return dict(hidden_states=r(B, 4, H, W), encoder_hidden_states=r(B, a.text, 32),
                    timestep=torch.full((B,), 500.0), original_size=px, target_size=px,
                    crop_coords=torch.zeros(B, 2), return_dict=False)
    if a.model in ("sd3", "sd35m"):
        return dict(hidden_states=r(B, 4, H, W), encoder_hidden_states=r(B, a.text, 32),
                    pooled_projections=r(B, 32), timestep=torch.full((B,), 500.0),
                    return_dict=False)
    if a.model == "hunyuan15":
        # text: Qwen (a.text, --pad padded), byT5 (3, 1 padded), SigLIP image tokens (4;
        # zeros: text-to-video, all masked)
        m2 = torch.ones(B, 3, dtype=torch.long)
        m2[:, 2:] = 0
        return dict(hidden_states=r(B, 4, F, H, W), timestep=torch.full((B,), 500.0),
                    encoder_hidden_states=r(B, a.text, 32),
                    encoder_attention_mask=text_mask(a, torch),
                    encoder_hidden_states_2=r(B, 3, 16), encoder_attention_mask_2=m2,
                    image_embeds=torch.zeros(B, 4, 16, dtype=dtype), return_dict=False)
    if a.model == "mochi":
        return dict(hidden_states=r(B, 4, F, H, W), encoder_hidden_states=r(B, a.text, 32),
                    timestep=torch.full((B,), 500.0),
                    encoder_attention_mask=text_mask(a, torch), return_dict=False)
    if a.model == "ltx":
        return dict(hidden_states=r(B, F * H * W, 8), encoder_hidden_states=r(B, a.text, 32),
                    timestep=torch.full((B,), 500.0),
                    encoder_attention_mask=text_mask(a, torch), num_frames=F, height=H,
                    width=W, return_dict=False)
    if a.model == "skyreels" and a.forcing:
        # diffusion forcing (synchronous): a timestep per latent frame
        return dict(hidden_states=r(B, 4, F, H, W), encoder_hidden_states=r(B, a.text, 32),
                    timestep=torch.linspace(900.0, 100.0, F).repeat(B, 1),
                    enable_diffusion_forcing=True, return_dict=False)
    return dict(hidden_states=r(B, 4, F, H, W), encoder_hidden_states=r(B, a.text, 32),
                timestep=torch.full((B,), 500.0), return_dict=False)


def _plan_facts(model):
    """The main plan's segments (name, tokens, split) and heads, for the test to compare
    with what the model's attention saw."""
    st = next(iter(model._cpc.shapes.values()))
    p = st.plan
    return {"segments": [[s["name"], s.get("tokens"), s.get("split", "shard")]
                         for s in p["input"]["segments"]],
            "heads": p["model"]["heads"], "kv_heads": p["model"].get("kv_heads"),
            "mask": p["input"]["mask"], "tokens": st.main[0].tokens}


def rel(x, ref):
    x, ref = x.double(), ref.double()
    return float((x - ref).norm() / max(float(ref.norm()), 1e-300))


def parser():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(MODELS), default="flux")
    p.add_argument("--ring", type=int, default=1)
    p.add_argument("--ulysses", type=int, default=1)
    p.add_argument("--anything", action="store_true")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--text", type=int, default=8)
    p.add_argument("--frames", type=int, default=3)
    p.add_argument("--height", type=int, default=4)
    p.add_argument("--width", type=int, default=6)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--pad", type=int, default=0,
                   help="text padding tokens (masked) for models with a text mask; "
                        "-1: no mask passed")
    p.add_argument("--train", action="store_true")
    p.add_argument("--forcing", action="store_true",
                   help="skyreels: enable_diffusion_forcing with a per-frame timestep")
    p.add_argument("--per-token", action="store_true",
                   help="ltx2: a per-token timestep [B, S] (image-to-video)")
    p.add_argument("--replicate-text", action="store_true",
                   help="parallelize(..., replicate_text=True): the text whole on every rank")
    p.add_argument("--expect-error", default=None, help="a cpc error class name")
    p.add_argument("--name", default=None)
    return p


def main():
    top = argparse.ArgumentParser()
    top.add_argument("--torchrun", action="store_true", help="comm: torch.distributed gloo")
    top.add_argument("--cases", default=None,
                     help="a file with one case per line (this script's case options)")
    top.add_argument("--out", default=None,
                     help="a folder: each rank appends its JSON lines to rank<r>.jsonl "
                          "there (ranks' stdout lines may interleave)")
    t, rest = top.parse_known_args()
    cases = ([parser().parse_args(line.split()) for line in open(t.cases)
              if line.strip() and not line.startswith("#")]
             if t.cases else [parser().parse_args(rest)])

    import torch
    torch.set_num_threads(1)
    import diffusers
    diffusers.utils.logging.set_verbosity_error()
    if t.torchrun:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        comm = None          # as a diffusers user would: the launcher's default group
        rank = dist.get_rank()
    else:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()
    for a in cases:
        res = one(a, torch, comm, rank)
        res["name"] = a.name
        if rank == 0 or "error" in res:
            line = json.dumps(res)
            if t.out:
                with open(os.path.join(t.out, f"rank{rank}.jsonl"), "a") as f:
                    f.write(line + "\n")
            else:
                print(line, flush=True)
    if t.torchrun:
        # end without the interpreter's finalisation: a gloo worker thread may still
        # release a Python object then and torch aborts the process (SIGABRT after
        # the results were written; tests/nccl_worker.py saw it 4 runs in 5)
        dist.barrier()
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def one(a, torch, comm, rank):
    import cpc
    import cpc.diffusers
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    torch.manual_seed(0)
    model = MODELS[a.model](a.heads).to(dtype)
    if not a.train:
        model.eval()
    x = inputs(model, a, torch, dtype)
    w = torch.randn(1, generator=torch.Generator().manual_seed(3))

    inp = "x" if a.model == "zimage" else "hidden_states"

    def outputs(res):
        # every output the model returns, flattened into one vector (LTX-2: video and
        # audio; Z-Image: a list of samples)
        o = res[0]
        outs = list(o) if isinstance(o, (list, tuple)) else [o]
        if a.model == "ltx2":
            outs.append(res[1])
        return torch.cat([t.reshape(-1) for t in outs])

    def run():
        xi = dict(x)
        if a.train:
            xi[inp] = [t.clone().requires_grad_() for t in x[inp]] if a.model == "zimage" \
                else x[inp].clone().requires_grad_()
            model.zero_grad()
            out = outputs(model(**xi))
            g = torch.Generator().manual_seed(11)
            wt = torch.randn(out.shape, generator=g).to(out.dtype)
            (out.float() * wt.float()).sum().backward()
            dx = torch.stack([t.grad for t in xi[inp]]) if a.model == "zimage" else \
                xi[inp].grad
            return out.detach(), dx, {
                n: p.grad.detach().clone() for n, p in model.named_parameters()
                if p.grad is not None}
        with torch.no_grad():
            return outputs(model(**xi)), None, None

    ref, ref_dx, ref_g = run()
    pc = {"ring_degree": a.ring, "ulysses_degree": a.ulysses}
    if a.anything:
        pc["ulysses_anything" if a.ulysses > 1 else "ring_anything"] = True
    try:
        kw = {"replicate_text": True} if a.replicate_text else {}
        cpc.diffusers.parallelize(model, pc, comm=comm, **kw)
        t0 = time.perf_counter()
        out, dx, grads = run()
        dt = time.perf_counter() - t0
    except cpc.Error as e:
        if a.expect_error and type(e).__name__ == a.expect_error:
            cpc.diffusers.unparallelize(model)
            return {"rank": rank, "error": type(e).__name__, "message": str(e),
                    "hint": getattr(e, "hint", None)}
        raise
    res = {"rank": rank, "out": rel(out, ref), "batch": a.batch, "s": dt,
           "variant": model._cpc.current is None and
           next(iter(model._cpc.shapes.values())).main[0].variant,
           "cpc_calls": model._cpc.calls, "gathered_calls": model._cpc.gathered_calls,
           "plan": _plan_facts(model),
           "masks": sorted({k[5] for k in model._cpc.shapes})}
    if a.train:
        cpc.diffusers.allreduce_grads(model)
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        model._cpc.comm.allreduce_(dx)         # each rank's input gradient: its tokens
        # A parameter whose exact gradient is 0 (a key bias: softmax does not see it) has a
        # reference of pure rounding noise: errors are relative to the largest gradient
        # norm over the parameters of the same kind then, not to their own.
        top = max(float(g.double().norm()) for g in ref_g.values())
        errs = {n: float((g.double() - ref_g[n].double()).norm()) /
                max(float(ref_g[n].double().norm()), 1e-3 * top) for n, g in grads.items()}
        res["top5"] = sorted(((e, n, float(ref_g[n].norm())) for n, e in errs.items()),
                             reverse=True)[:40] if os.environ.get("CPC_DEBUG") else None
        res["grad_max"] = max(errs.values())
        res["grad_worst"] = max(errs, key=errs.get)
        res["n_grads"] = len(errs)
        res["dx"] = rel(dx, ref_dx)
    cpc.diffusers.unparallelize(model)
    return res




if __name__ == "__main__":
    sys.exit(main())
