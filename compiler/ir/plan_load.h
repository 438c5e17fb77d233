/*
 * plan_load.h - the plan-file front end: YAML text -> cpc_plan (plan.h),
 * with every rule of the file stage (SPEC section 1, codes CP100-CP106 of
 * section 2).
 *
 * Pipeline: read the file (at most 1 MiB) -> YAML tree (yaml_tree.h: CP100,
 * CP105 duplicate keys, CP106) -> apply `--set KEY=VALUE` overrides to the
 * tree -> convert the tree, checking every key of SPEC section 1:
 *   CP101 unknown key (with "did you mean 'head_dim'?" when a known key is
 *         close, or "'world_size' belongs under 'cluster'"),
 *   CP102 wrong type (expected and found, strict core-schema typing:
 *         "8", 0x18, 1_000, 24.0 are not integers, yes/on are not booleans),
 *   CP103 out of range (version != 1, heads 1..65536, kv_heads 1..65536,
 *         head_dim 1..256, layers 1..2^20, batch 1..2^20, world_size 1..2^20,
 *         gpus_per_node 1..2^20, degrees -2^20..2^20, tokens per segment and
 *         kv tokens 1..2^31-1, 1..64 segments, unknown enum names such as
 *         `device: h300`, scale > 0 finite, memory_gb > 0, reserved_gb >= 0,
 *         token arithmetic that overflows int64 or yields 0 tokens),
 *   CP104 missing required key (version, model.heads, model.head_dim,
 *         cluster.world_size, the input's tokens; image height/width, video
 *         frames/height/width, kv tokens),
 *   CP105 conflicting keys (two of input.tokens/image/video/segments; two of
 *         tokens/image/video in one segment; two segments with one name;
 *         ulysses_anything and ring_anything both true; a flag true with a
 *         different `variant`; variant ring with ulysses_degree > 1 or
 *         ulysses with ring_degree > 1) and duplicate keys.
 * Parallel degrees are stored as written within -2^20..2^20 (CP103
 * outside), also 0 or negative: a degree < 1 is the validator's CP002, and a
 * written 0 is told from an omitted one by its key span
 * ("parallel.ring_degree" in cpc_plan.key_spans).
 * Every diagnostic has class CPC_E_PLAN, the rule number, and the
 * file:line:col (1-based) of the key or value it is about; a conflict has a
 * note at the other key.  All errors of the stage are reported, sorted by
 * position (file positions before --set ones).
 *
 * Warnings (severity CPC_SEV_WARNING, class CPC_E_PLAN, rule 0): an image
 * or video size not divisible by vae_scale * patch (or frames - 1 by
 * vae_temporal, latent frames by the temporal patch) is floored as the
 * models' pipelines do, and said so.
 *
 * Token shorthands (as in the diffusers pipelines; all arithmetic in int64
 * with overflow checks):
 *   input.tokens: N              one segment named "tokens"
 *   input.image: {height, width, vae_scale: 8, patch: 2}
 *       tokens = floor(h / (vae*patch)) * floor(w / (vae*patch))
 *       (FLUX 1024x1024 -> 4096, 1008x1008 -> 3969); segment "image"
 *   input.video: {frames, height, width, vae_scale: 8, vae_temporal: 4,
 *                 patch: [pt, ph, pw] = [1, 2, 2]}
 *       tokens = floor((floor((frames-1)/vae_temporal) + 1) / pt)
 *              * floor(h / (vae*ph)) * floor(w / (vae*pw))
 *       (Wan 81f 480x832 -> 32760, HunyuanVideo 129f 720x1280 -> 118800,
 *        CogVideoX 49f 480x720 -> 17550, LTX-Video 161f 512x704 with
 *        vae_scale 32, vae_temporal 8, patch [1,1,1] -> 7392); segment "video"
 *   input.segments: [{name, tokens | image | video}, ...] in this order; a
 *       segment without a name is called "segment<i>" (i 0-based).
 *
 * Defaults (SPEC section 1): name = file stem ("plans/flux.yaml" -> "flux"),
 * kv_heads = heads, dtype bf16, layers 1, scale 1/sqrt(head_dim), batch 1,
 * mask none, mode inference, gpus_per_node min(world_size, 8), device
 * h100-sxm, memory_gb 0 (= the preset's), reserved_gb 0, fallback strict,
 * overlap true, rotate p2p; parallel.variant omitted -> variant_given false,
 * variant CPC_VARIANT_AUTO (the validator infers it); degrees omitted -> 0.
 *
 * Key spans (cpc_plan.key_spans) are recorded for every known key present,
 * by dotted path: "model.heads", "input.segments", "input.segments[1]",
 * "input.segments[1].image.height", "input.video.patch", "parallel.ring_degree".
 *
 * --set OVERRIDES.  Each `sets[i]` is "KEY=VALUE".  KEY is a dotted path of
 * mapping keys, each optionally followed by [N] indices into an existing
 * sequence: "cluster.world_size", "parallel.variant",
 * "input.segments[1].tokens".  VALUE is parsed as YAML (one scalar or flow
 * collection: `8`, `ring`, `"8"`, `{height: 1024, width: 1024}`, `[1,2,2]`;
 * an empty VALUE is null) with the same strict typing as the file.
 * Overrides are applied in order, before conversion; missing mapping keys
 * (and missing intermediate mappings) are created.  Diagnostics about a
 * value or key that came from --set point at file CPC_SET_FILE
 * ("<--set>"), line = i + 1 (the override's ordinal), column = the 1-based
 * column within the argument string.  A malformed KEY (no '=', empty
 * component, bad [N]), an index past the end of a sequence (the message
 * names the valid range) and an index into a key that does not exist
 * (input.segments[0] on a plan written with the input.tokens shorthand:
 * the hint says so) are CPC_E_USAGE (exit status 2); walking through a
 * scalar is CP102; a VALUE with YAML errors is CP100; a VALUE that is a
 * block collection is CP102.
 *
 * Thread-safety: no global state; loads may run in parallel.
 */
#ifndef CPC_PLAN_LOAD_H
#define CPC_PLAN_LOAD_H

#include <stddef.h>

#include "plan.h"
#include "status.h"

/* File name used in spans of values that came from --set. */
#define CPC_SET_FILE "<--set>"

/* Loads the plan file at `path` (the name kept in spans and plan->file),
 * applies the n_sets overrides of `sets` (may be NULL when n_sets == 0) and
 * converts it.
 * Returns the chain of diagnostics (errors and warnings), NULL when there
 * are none; the caller frees it with cpc_status_free.
 * When the chain holds an error, *out = NULL; otherwise *out is the plan
 * (caller frees with cpc_plan_free) and the chain holds only warnings.
 * Errors: CPC_E_IO when the file cannot be read (no plan rule),
 * CPC_E_USAGE for a malformed --set, CPC_E_PLAN with rule 100..106 for
 * the rules above, CPC_E_NOMEM when memory runs out. */
cpc_status *cpc_plan_load_file(const char *path, const char *const *sets, int n_sets,
                               cpc_plan **out);

/* As cpc_plan_load_file, from `len` bytes of `text` (not necessarily
 * NUL-terminated; more than 1 MiB is CP106).  `file` is the name used in
 * spans and for the default plan name (NULL -> "<string>"). */
cpc_status *cpc_plan_load_string(const char *text, size_t len, const char *file,
                                 const char *const *sets, int n_sets, cpc_plan **out);

#endif
