"""cpc's exceptions as a user sees them: str(e) (what an uncaught traceback prints)
carries the hint, so a hint is never lost to a user who does not read e.hint."""

import numpy as np
import pytest

try:  # before libcpc loads: a CUDA torch wheel cannot import after it (see python/README.md)
    import torch
except ImportError:
    torch = None

import cpc

TINY = {"version": 1, "name": "tiny", "model": {"heads": 2, "head_dim": 8, "dtype": "fp32"},
        "input": {"tokens": 8}, "cluster": {"world_size": 1, "device": "cpu"},
        "parallel": {"variant": "none"}}


@pytest.mark.parametrize("cls", [cpc.Error, cpc.UsageError, cpc.FileError, cpc.RuntimeError,
                                 cpc.UnsupportedError])
def test_str_has_the_hint(cls):
    e = cls("it failed", code="usage", hint="do this instead")
    assert str(e) == "it failed; hint: do this instead"
    assert e.message == "it failed" and e.hint == "do this instead"
    assert str(cls("no hint here")) == "no hint here"
    # a message that already quotes its hint is not repeated
    assert str(cls("x; hint: y", hint="y")) == "x; hint: y"


def test_plan_error_unchanged():
    with pytest.raises(cpc.PlanError) as ei:
        cpc.compile(dict(TINY, cluster={"world_size": 3, "device": "cpu"},
                         parallel={"variant": "ulysses"}))
    text = str(ei.value)
    assert "error[CP" in text and text.count("; hint: ") == text.count("error[CP")


def test_raised_error_prints_its_hint():
    if torch is None:
        pytest.skip("no torch")
    a = cpc.compile(TINY)
    q, k, v = (torch.randn(1, 8, 2, 8, requires_grad=True) for _ in range(3))
    with pytest.raises(cpc.UsageError) as ei:
        cpc.Attention(a)(q, k, v)
    assert ei.value.hint and ei.value.hint in str(ei.value)
    assert "input.mode: training" in str(ei.value)


def test_numpy_usage_error_str():
    a = cpc.compile(TINY)
    with pytest.raises(cpc.UsageError) as ei:
        cpc.Attention(a)(*(np.zeros((1, 8, 2, 8), np.float64) for _ in range(3)))
    assert str(ei.value).startswith(ei.value.message)
