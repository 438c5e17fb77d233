import json
import os
import pathlib

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
CONFIGS = HERE / "configs"


def config(name):
    """A model's transformer/config.json (tests/configs/NAME.json)."""
    return json.loads((CONFIGS / f"{name}.json").read_text())


def attention_ref(q, k, v, mask=None, causal=False, scale=None):
    """float64 softmax(q k^T * scale) v in BSHD (GQA: query head h uses kv head
    h // (H / Hkv)); mask [B, Skv] (1 = the key takes part); a row with every key
    masked gives 0.  Returns (out [B,S,H,D], lse [B,H,S])."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, S, H, D = q.shape
    Hkv = k.shape[2]
    k = np.repeat(k, H // Hkv, axis=2)
    v = np.repeat(v, H // Hkv, axis=2)
    s = np.einsum("bshd,bthd->bhst", q, k) * (scale or 1.0 / np.sqrt(D))
    if mask is not None:
        s = np.where(np.asarray(mask, bool)[:, None, None, :], s, -np.inf)
    if causal:
        s = np.where(np.tril(np.ones((S, k.shape[1]), bool))[None, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    den = p.sum(-1, keepdims=True)
    out = np.einsum("bhst,bthd->bshd", p / np.where(den > 0, den, 1.0), v)
    with np.errstate(divide="ignore"):
        lse = (np.log(den) + m)[..., 0]
    return out, lse


def rel_err(x, ref):
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-300))


def run_ranks(P, fn):
    """Runs fn(r) for r in range(P), each in its own thread (ranks of a LocalWorld),
    and re-raises the first exception any of them raised, after all have ended."""
    import threading
    errs = [None] * P

    def run(r):
        try:
            fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errs[r] = e
    th = [threading.Thread(target=run, args=(r,)) for r in range(P)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    for e in errs:
        if e is not None:
            raise e


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def cpc_tool(name):
    """build/<name> of the C build when CPC_BUILD_DIR is set (CI), else None."""
    d = os.environ.get("CPC_BUILD_DIR")
    if d and os.access(os.path.join(d, name), os.X_OK):
        return os.path.join(d, name)
    return None
