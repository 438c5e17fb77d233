"""cpc.check / cpc.compile / cpc.load: plans from a path, a YAML string or a dict;
diagnostics as objects; predictions as dicts (SPEC section 3's JSON)."""

import json
import subprocess

import pytest

import cpc
from conftest import REPO, cpc_tool

FLUX1008 = REPO / "plans" / "flux1-dev-1008.yaml"

SMALL = """version: 1
model: {heads: 4, head_dim: 16, dtype: fp32}
input: {segments: [{name: text, tokens: 24}, {name: image, tokens: 64}]}
cluster: {world_size: 4}
parallel: {variant: ulysses}
"""


def test_library_loads():
    assert cpc.library_version().count(".") == 2
    assert set(cpc.features()) == {"mpi", "cuda", "nccl", "cudnn"}
    assert cpc.library_path()


def test_check_path_string_dict_agree():
    by_path = cpc.check(str(FLUX1008))
    by_text = cpc.check(FLUX1008.read_text())
    import yaml  # python3-yaml: only to build the dict form of the same plan
    by_dict = cpc.check(yaml.safe_load(FLUX1008.read_text()))
    for r in (by_path, by_text, by_dict):
        assert r.ok and r.variant == "ulysses_anything"
        assert (r.ring_degree, r.ulysses_degree, r.cfg_degree, r.tp_degree) == (1, 4, 1, 1)
        assert set(r.predicted) >= {"ms_per_layer", "ms_per_forward", "memory_bytes_per_rank",
                                    "bytes_sent_per_rank"}
        assert isinstance(r.predicted["memory_bytes_per_rank"], int)
    assert by_path.predicted == by_text.predicted == by_dict.predicted
    assert by_path.file == str(FLUX1008) and by_text.file == "<string>"
    assert by_dict.file == "<dict>" and by_dict.source.startswith("{")


def test_rejection_diagnostics_are_objects():
    r = cpc.check(str(FLUX1008), set={"parallel.variant": "ulysses"})
    assert not r.ok and r.predicted is None and r.variant is None
    (d,) = [x for x in r.diagnostics if x.severity == "error"]
    assert (d.code, d.file, d.line, d.column) == ("CP011", str(FLUX1008), 9, 7)
    assert d.hint == "variant ulysses_anything or ring_anything runs this plan"
    assert str(d) == (f"{FLUX1008}:9:7: error[CP011]: ulysses: segment 'image' has 3969 tokens,"
                      " not divisible by ulysses_degree 4 (3969 = 4*992 + 1); hint: variant "
                      "ulysses_anything or ring_anything runs this plan")
    with pytest.raises(cpc.PlanError) as e:
        cpc.compile(str(FLUX1008), set={"parallel.variant": "ulysses"})
    assert e.value.code == "plan" and e.value.rule == 11
    assert e.value.diagnostics[0] == d
    assert isinstance(e.value, cpc.Error)


@pytest.mark.skipif(not cpc_tool("cpc"), reason="CPC_BUILD_DIR with the cpc program not set")
@pytest.mark.parametrize("plan", sorted((REPO / "plans").glob("*.yaml")), ids=lambda p: p.name)
@pytest.mark.parametrize("sets", [{}, {"parallel.variant": "ring"}])
def test_same_json_as_cpc_check(plan, sets):
    """cpc.check(...).as_dict() is the object `cpc --check --format json` prints."""
    args = [cpc_tool("cpc"), "--check", "--format", "json", str(plan)]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
    theirs = json.loads(out.stdout.splitlines()[0])
    mine = cpc.check(str(plan), set=sets).as_dict()
    theirs["file"] = mine["file"]
    assert mine["ok"] == theirs["ok"]
    if theirs["selected"] is None:
        assert mine["selected"] is None
    else:
        # SPEC section 3 lists cfg_degree and tp_degree; a cpc without those axes
        # leaves them out (they are 1 then)
        assert {k: mine["selected"][k] for k in theirs["selected"]} == theirs["selected"]
        assert all(mine["selected"][k] == 1 for k in set(mine["selected"]) -
                   set(theirs["selected"]))
    assert mine["diagnostics"] == theirs["diagnostics"]
    if theirs["predicted"] is None:
        assert mine["predicted"] is None
    else:
        assert _flat(mine["predicted"]) == pytest.approx(_flat(theirs["predicted"]), rel=1e-9)


def _flat(d, prefix=""):
    """A nested dict (the prediction's step_breakdown) as one flat dict for approx."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def test_set_values_and_usage_errors(tmp_path):
    r = cpc.check(SMALL, set={"cluster.world_size": 2, "parallel.variant": "ring"})
    assert r.ok and (r.variant, r.ring_degree, r.ulysses_degree) == ("ring", 2, 1)
    bad = cpc.check(SMALL, set={"no.such.key": 1})
    assert not bad.ok and bad.diagnostics[0].code == "CP101"
    assert bad.diagnostics[0].file == "<--set>"
    with pytest.raises(cpc.FileError) as e:
        cpc.check(str(tmp_path / "missing.yaml"))
    assert isinstance(e.value, OSError) and e.value.code == "io"
    with pytest.raises(cpc.UsageError):
        cpc.check(42)


def test_yaml_errors_have_positions():
    r = cpc.check(SMALL.replace("head_dim: 16", "head_dim: \"16\""))
    assert not r.ok
    d = r.diagnostics[0]
    assert d.code == "CP102" and d.file == "<string>" and d.line == 2


def test_compile_save_load(tmp_path):
    a = cpc.compile(SMALL)
    assert (a.variant, a.world_size, a.ring_degree, a.ulysses_degree) == ("ulysses", 4, 1, 4)
    assert a.dtype == "fp32"
    assert a.shape == {"batch": 1, "tokens": 88, "kv_tokens": 88, "heads": 4, "kv_heads": 4,
                       "head_dim": 16}
    assert not (a.causal or a.key_padding or a.cross_attention)
    p = tmp_path / "small.cplan"
    a.save(p)
    b = cpc.load(p)
    assert b.selected == a.selected and b.predicted == a.predicted and b.shape == a.shape
    # a tampered artifact is refused (hash), never run
    text = p.read_text().replace("head_dim: 16", "head_dim: 8", 1)
    p.write_text(text)
    with pytest.raises(cpc.Error) as e:
        cpc.load(p)
    assert e.value.code in ("input", "plan")
    with pytest.raises(cpc.FileError):
        cpc.load(tmp_path / "nope.cplan")


def test_shards_and_runs():
    a = cpc.compile(SMALL.replace("tokens: 64", "tokens: 61").replace("ulysses}", "ulysses_anything}"))
    # segments are split separately, unevenly (tensor_split): text 6 each, image 16,15,15,15
    assert a.shard_runs(0) == [(0, 6), (24, 16)]
    assert a.shard_runs(3) == [(18, 6), (24 + 16 + 15 + 15, 15)]
    assert a.shard_shape(0, "q") == (1, 22, 4, 16) and a.shard_shape(3, "out") == (1, 21, 4, 16)
    assert a.shard_shape(1, "lse") == (1, 4, 21)
    with pytest.raises(cpc.UsageError):
        a.shard_runs(4)
    with pytest.raises(cpc.UsageError):
        a.shard_shape(0, "x")
    import numpy as np
    x = np.arange(1 * 85 * 4 * 16, dtype=np.float32).reshape(1, 85, 4, 16)
    shards = [a.shard(x, r) for r in range(4)]
    assert shards[0].shape == (1, 22, 4, 16)
    assert np.array_equal(shards[1][0, :6], x[0, 6:12]) and np.array_equal(shards[1][0, 6:], x[0, 40:55])
    assert np.array_equal(a.gather(shards, "q"), x)
    with pytest.raises(cpc.UsageError):
        a.gather(shards[:3])


def test_shard_checks_the_global_shape_on_every_rank():
    """A global array of the wrong token count (FLUX-schnell's 256 text tokens against a
    dev plan) fails on every rank with the plan's global shape, never sliced silently on
    some ranks (too many tokens) or failing on one rank only (too few: in a LocalWorld
    the others then waited out the stall limit)."""
    import numpy as np
    a = cpc.compile(SMALL.replace("tokens: 64", "tokens: 61").replace("ulysses}", "ulysses_anything}"))
    assert a.global_shape("q") == (1, 85, 4, 16) and a.global_shape("lse") == (1, 4, 85)
    assert a.global_shape("mask") == (1, 85)
    rng = np.random.default_rng(7)
    for tokens in (84, 86, 100):
        x = rng.standard_normal((1, tokens, 4, 16)).astype(np.float32)
        for r in range(4):
            with pytest.raises(cpc.UsageError, match=r"the plan says \(1, 85, 4, 16\)"):
                a.shard(x, r)
    x = rng.standard_normal((1, 85, 4, 16)).astype(np.float32)
    with pytest.raises(cpc.UsageError, match="the plan says"):
        cpc.LocalWorld(a)(x[:, :84], x[:, :84], x[:, :84])
    with pytest.raises(cpc.UsageError, match="the plan says"):
        a.shard(x[:, :, :3], 0)


def test_linear_attention_is_priced_not_run():
    """model.attention: linear is a cost-model key: cpc.check prices it (as `cpc --check`),
    an artifact is made for its predictions, but no rank runs it as softmax attention."""
    plan = {"version": 1, "model": {"heads": 8, "head_dim": 32, "dtype": "fp32",
                                    "attention": "linear"},
            "input": {"tokens": 256}, "cluster": {"world_size": 2, "device": "cpu"},
            "parallel": {"variant": "ulysses"}}
    r = cpc.check(plan)
    assert r.ok and r.predicted["ms_per_layer"] > 0
    soft = cpc.check(dict(plan, model=dict(plan["model"], attention="softmax")))
    assert soft.predicted["ms_per_layer"] != r.predicted["ms_per_layer"]
    a = cpc.compile(plan)
    with pytest.raises(cpc.InputError, match="model.attention is linear"):
        cpc.LocalWorld(a)
