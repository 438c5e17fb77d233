"""Planning from Python: cpc.check, cpc.compile, cpc.load and the Artifact."""

import ctypes
import json
import os

from . import _native as N
from ._errors import Diagnostic, PlanError, UsageError, check as _check, diagnostics_of

PREDICTIONS = ("ms_per_layer", "ms_per_forward", "memory_bytes_per_rank",
               "bytes_sent_per_rank", "ms_per_step", "ms_per_image", "ms_backward_per_layer",
               "backward_bytes_sent_per_rank", "backward_memory_bytes_per_rank")
_INT_PREDICTIONS = ("memory_bytes_per_rank", "bytes_sent_per_rank",
                    "backward_bytes_sent_per_rank", "backward_memory_bytes_per_rank",
                    "weights_bytes_per_rank", "activation_bytes_per_rank",
                    "vae_bytes_per_rank")
# with model.parameters: the step's parts (SPEC section 3's "step_breakdown", ms per
# step), the pipeline's once-per-image parts and the deployment's memory per rank
STEP_BREAKDOWN = ("gemm_ms", "attention_ms", "memory_bound_ms", "comm_ms", "host_ms")
_DEPLOYMENT = ("text_encoder_ms", "vae_decode_ms", "weights_bytes_per_rank",
               "activation_bytes_per_rank", "vae_bytes_per_rank")


def plan_to_yaml(plan):
    """A plan dict as YAML text cpc reads (JSON is YAML 1.2 flow style: ints stay
    plain, booleans true/false, strings quoted).  Diagnostics point into this text
    (CheckResult.source holds it)."""
    if not isinstance(plan, dict):
        raise UsageError(f"a plan dict was expected, got {type(plan).__name__}", code="usage")
    return json.dumps(plan, indent=2, allow_nan=False) + "\n"


def _set_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, str)):
        return str(v)
    return json.dumps(v)


def _source(plan, name=None):
    """(kind, payload, name): kind 'file' (payload a path) or 'text' (payload YAML)."""
    if isinstance(plan, dict):
        return "text", plan_to_yaml(plan), name or "<dict>"
    if isinstance(plan, os.PathLike):
        return "file", os.fspath(plan), None
    if isinstance(plan, bytes):
        plan = plan.decode("utf-8")
    if isinstance(plan, str):
        if "\n" not in plan and (os.path.exists(plan) or plan.endswith((".yaml", ".yml"))
                                 or ":" not in plan):
            return "file", plan, None
        return "text", plan, name or "<string>"
    raise UsageError("plan must be a path, a YAML string or a dict, not "
                     f"{type(plan).__name__}", code="usage")


def _compile(plan, set=None, kernels=False, arch=None, lua=None, name=None):
    """(artifact pointer or None, [warnings], error or None, source text or None)."""
    L = N.lib()
    kind, payload, nm = _source(plan, name)
    sets = [] if set is None else [f"{k}={_set_value(v)}" for k, v in dict(set).items()]
    arr = (ctypes.c_char_p * max(1, len(sets)))(*[s.encode() for s in sets])
    o = N.CompileOptions()
    L.cpc_compile_options_init(ctypes.byref(o), ctypes.sizeof(o))
    o.sets = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)) if sets else None
    o.n_sets = len(sets)
    o.lua = os.fsencode(lua) if lua else None
    o.kernels = bool(kernels)
    o.arch = arch.encode() if arch else None
    art = ctypes.c_void_p()
    diags = ctypes.c_void_p()
    if kind == "file":
        st = L.cpc_compile_plan_file(os.fsencode(payload), ctypes.byref(o), ctypes.byref(art),
                                     ctypes.byref(diags))
        text = None
    else:
        b = payload.encode("utf-8")
        st = L.cpc_compile_plan_string(b, len(b), nm.encode(), ctypes.byref(o),
                                       ctypes.byref(art), ctypes.byref(diags))
        text = payload
    warnings = diagnostics_of(L, diags.value) if diags.value else []
    if diags.value:
        L.cpc_status_free(diags.value)
    from ._errors import take_status
    err = take_status(L, st, warnings)
    return (art.value if art.value else None), warnings, err, text


class CheckResult:
    """The result of cpc.check, with the fields of SPEC section 3's JSON: ok, variant,
    ring_degree, ulysses_degree, cfg_degree, tp_degree (None when rejected),
    predicted (a dict, None when rejected), diagnostics (list of cpc.Diagnostic),
    file, and source (the YAML text checked, for a dict or string plan)."""

    def __init__(self, file, ok, selected, predicted, diagnostics, source):
        self.file, self.ok, self.predicted = file, ok, predicted
        self.diagnostics, self.source = diagnostics, source
        self.selected = selected
        sel = selected or {}
        self.variant = sel.get("variant")
        self.ring_degree = sel.get("ring_degree")
        self.ulysses_degree = sel.get("ulysses_degree")
        self.cfg_degree = sel.get("cfg_degree")
        self.tp_degree = sel.get("tp_degree")

    def as_dict(self):
        """SPEC section 3's JSON object."""
        return {"file": self.file, "ok": self.ok,
                "diagnostics": [d.as_dict() for d in self.diagnostics],
                "selected": self.selected, "predicted": self.predicted}

    def __bool__(self):
        return self.ok

    def __repr__(self):
        return f"CheckResult({self.as_dict()!r})"


def _from_diffusers(plan, warnings, err):
    """A plan made by from_diffusers: its diagnostics also name the ContextParallelConfig
    fields (the user wrote ulysses_anything=True, not parallel.variant)."""
    from ._diffusers import DiffusersPlan, translate_diagnostics, translate_error
    if not isinstance(plan, DiffusersPlan):
        return
    translate_diagnostics(warnings or [])
    if err is not None:
        translate_error(err)


def check(plan, set=None, *, lua=None, name=None):
    """Validates a plan as `cpc --check` does (no kernels, no artifact kept).

    plan: a path, a YAML string or a dict of the plan's keys; set: {"cluster.world_size":
    8, ...} applied as `cpc --set`.  Returns a CheckResult (ok False with the rule
    violations in .diagnostics for a rejected plan).  Raises cpc.FileError for an
    unreadable file and cpc.UsageError for a bad `set` key."""
    kind, payload, nm = _source(plan, name)
    art, warnings, err, text = _compile(plan, set=set, lua=lua, name=name)
    file = payload if kind == "file" else nm
    _from_diffusers(plan, warnings, err)
    if err is not None:
        if isinstance(err, PlanError):
            return CheckResult(file, False, None, None, err.diagnostics, text)
        raise err
    a = Artifact(art, warnings, text)
    return CheckResult(file, True, a.selected, a.predicted, warnings, text)


def compile(plan, set=None, *, kernels=False, arch=None, lua=None, name=None):  # noqa: A001
    """Compiles a plan (path, YAML string or dict) into a proven Artifact.

    kernels=True also generates CUDA kernels with NVRTC (a libcpc built with CUDA).
    Raises cpc.PlanError (with .diagnostics: every violation and warning) for a
    rejected plan."""
    art, warnings, err, text = _compile(plan, set=set, kernels=kernels, arch=arch, lua=lua,
                                        name=name)
    _from_diffusers(plan, warnings, err)
    if err is not None:
        raise err
    return Artifact(art, warnings, text)


def load(path):
    """Reads a .cplan file (as `cpc` writes it) and proves it again."""
    L = N.lib()
    art = ctypes.c_void_p()
    _check(L, L.cpc_artifact_load(os.fsencode(os.fspath(path)), ctypes.byref(art)))
    return Artifact(art.value, [], None)


def _arrays(x):
    """The array module helpers for numpy arrays or torch tensors."""
    import sys
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch", torch
    import numpy as np
    if isinstance(x, np.ndarray):
        return "numpy", np
    if hasattr(x, "__dlpack__"):
        return "numpy", np
    raise UsageError(f"expected a numpy array or a torch tensor, got {type(x).__name__}",
                     code="usage")


class Artifact:
    """A compiled, proven plan (a .cplan in memory).  Read-only; may be shared by any
    number of ranks (cpc.Attention) in this process."""

    def __init__(self, ptr, diagnostics, source):
        self._ptr = ptr
        self._L = N.lib()
        self.diagnostics = list(diagnostics)
        self.source = source
        L = self._L
        self.variant = L.cpc_artifact_variant(ptr).decode()
        self.world_size = L.cpc_artifact_world_size(ptr)
        self.ring_degree = L.cpc_artifact_ring_degree(ptr)
        self.ulysses_degree = L.cpc_artifact_ulysses_degree(ptr)
        self.dtype = N.DTYPE_NAMES.get(L.cpc_artifact_dtype(ptr), "?")
        v = [ctypes.c_int64() for _ in range(6)]
        L.cpc_artifact_shape(ptr, *[ctypes.byref(x) for x in v])
        (self.batch, self.tokens, self.kv_tokens, self.heads, self.kv_heads,
         self.head_dim) = [x.value for x in v]
        self.causal = bool(L.cpc_artifact_causal(ptr))
        self.key_padding = bool(L.cpc_artifact_key_padding(ptr))
        self.cross_attention = bool(L.cpc_artifact_cross_attention(ptr))
        # a training plan's artifact holds a proven backward program: Attention.backward
        # and autograd through Attention.__call__ work only then
        self.trains = bool(L.cpc_artifact_trains(ptr))
        q0 = self.shard_shape(0, "q")
        self.cfg_degree = self.batch // q0[0] if q0[0] else 1
        self.tp_degree = self.heads // q0[2] if q0[2] else 1
        self._runs = {}

    # -- queries ------------------------------------------------------------------

    @property
    def shape(self):
        """Global shape: dict batch, tokens, kv_tokens, heads, kv_heads, head_dim."""
        return {"batch": self.batch, "tokens": self.tokens, "kv_tokens": self.kv_tokens,
                "heads": self.heads, "kv_heads": self.kv_heads, "head_dim": self.head_dim}

    @property
    def selected(self):
        return {"variant": self.variant, "ring_degree": self.ring_degree,
                "ulysses_degree": self.ulysses_degree, "cfg_degree": self.cfg_degree,
                "tp_degree": self.tp_degree}

    @property
    def predicted(self):
        """The cost model's predictions (SPEC section 3's "predicted")."""
        out = {}
        d = ctypes.c_double()
        for name in PREDICTIONS + _DEPLOYMENT:
            if self._L.cpc_artifact_get_prediction(self._ptr, name.encode(), ctypes.byref(d)):
                out[name] = int(round(d.value)) if name in _INT_PREDICTIONS else d.value
        parts = {}
        for name in STEP_BREAKDOWN:
            if self._L.cpc_artifact_get_prediction(self._ptr, name.encode(), ctypes.byref(d)):
                parts[name] = d.value
        if parts:
            out["step_breakdown"] = parts
        return out

    def save(self, path):
        """Writes the artifact as a .cplan file (the same format `cpc -o` writes)."""
        _check(self._L, self._L.cpc_artifact_write(self._ptr, os.fsencode(os.fspath(path))))

    def _rank_ok(self, rank):
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise UsageError(f"rank {rank!r} is out of range: the world has {self.world_size} "
                             "ranks", code="usage")

    def shard_shape(self, rank, role="q"):
        """The shape of rank `rank`'s shard of `role` (q, k, v, out, lse, mask; dout, dq,
        dk, dv for the backward) as cpc.Attention takes or returns it."""
        if role not in N.ROLES:
            raise UsageError(f"role {role!r}: one of {', '.join(N.ROLES)}", code="usage")
        nd = ctypes.c_int()
        shape = (ctypes.c_int64 * 4)()
        _check(self._L, self._L.cpc_artifact_shard_shape(self._ptr, rank, N.ROLES[role],
                                                         ctypes.byref(nd), shape))
        return tuple(shape[i] for i in range(nd.value))

    def shard_runs(self, rank):
        """The global token positions of rank `rank`'s q/out shard, in shard order, as a
        list of (start, length) runs (one per segment; more for zigzag layouts).  With a
        replicated segment (`split: replicate`) the rank also holds that segment whole, at
        its place in segment order (text first: [(0, text), (text + off, n)], adjacent
        runs merged)."""
        self._rank_ok(rank)
        if rank in self._runs:
            return list(self._runs[rank])
        n = ctypes.c_int()
        cap = 8
        while True:
            runs = (N.TokenRun * cap)()
            _check(self._L, self._L.cpc_artifact_shard_runs(self._ptr, rank, runs, cap,
                                                            ctypes.byref(n)))
            if n.value <= cap:
                break
            cap = n.value
        res = [(runs[i].start, runs[i].len) for i in range(n.value)]
        self._runs[rank] = res
        return list(res)

    def token_index(self, rank):
        """The global token positions of rank `rank`'s shard as a list of ints."""
        return [t for s, n in self.shard_runs(rank) for t in range(s, s + n)]

    def _coords(self, rank):
        """(batch slice, q-head slice, kv-head slice) of rank `rank` (cfg and tp axes)."""
        C, T = self.cfg_degree, self.tp_degree
        c = rank // (self.world_size // C)
        t = rank % T
        bpc = self.batch // C
        hq = self.heads // T
        hk = self.shard_shape(rank, "k")[2]
        k0 = (t * self.kv_heads) // T
        return (slice(c * bpc, (c + 1) * bpc), slice(t * hq, (t + 1) * hq),
                slice(k0, k0 + hk))

    def global_shape(self, role="q"):
        """The global (unsharded) shape of `role` as the plan gives it: (B, S, H, D) for
        q, out, dout, dq; (B, Skv, Hkv, D) for k, v, dk, dv (Skv = S, or the `input.kv`
        length); (B, H, S) for lse; (B, Skv) for mask."""
        B, S, H, D = self.batch, self.tokens, self.heads, self.head_dim
        if role in ("q", "out", "dout", "dq"):
            return (B, S, H, D)
        if role in ("k", "v", "dk", "dv"):
            return (B, self.kv_tokens, self.kv_heads, D)
        if role == "lse":
            return (B, H, S)
        if role == "mask":
            return (B, self.kv_tokens)
        raise UsageError(f"role {role!r}: one of q, k, v, out, lse, mask, dout, dq, dk, dv",
                         code="usage")

    def _layout(self, rank, role):
        """(token axis or None when the rank holds every token, head axis or None,
        head slice, batch slice)."""
        bs, hs, ks = self._coords(rank)
        if role in ("q", "out", "dout", "dq"):
            return 1, 2, hs, bs
        if role in ("k", "v", "dk", "dv"):
            return (None if self.cross_attention else 1), 2, ks, bs
        if role == "lse":
            return 2, 1, hs, bs
        if role == "mask":
            whole = self.shard_shape(rank, "mask")[1] == self.kv_tokens
            return (None if whole else 1), None, None, bs
        raise UsageError(f"role {role!r}: one of q, k, v, out, lse, mask, dout, dq, dk, dv",
                          code="usage")

    def shard(self, x, rank, role="q"):
        """This rank's shard of the global array `x` (numpy or torch; BSHD for q, k, v,
        out; [B, H, S] for lse; [B, Skv] for mask): the tokens of every segment this
        rank holds, in shard order (uneven splits and zigzag layouts included), and the
        batch / heads of its cfg / tp coordinates.  Returns a new contiguous array of
        x's type."""
        self._rank_ok(rank)
        kind, xp = _arrays(x)
        if kind == "numpy" and not isinstance(x, xp.ndarray):
            x = xp.from_dlpack(x)
        glob = self.global_shape(role)
        if tuple(x.shape) != glob:
            # every rank checks the whole array (not only its own slice), so a wrong
            # token count fails on every rank alike, before any rank communicates
            names = {4: "[B, S, H, D]", 3: "[B, H, S]", 2: "[B, S_kv]"}
            raise UsageError(f"{role}: the global array has shape {tuple(x.shape)}, the plan "
                             f"says {glob} {names.get(len(glob), '')}", code="usage")
        tax, hax, hs, bs = self._layout(rank, role)
        y = x[bs]
        if hax is not None:
            idx = [slice(None)] * y.ndim
            idx[hax] = hs
            y = y[tuple(idx)]
        if tax is not None:
            parts = []
            for s, n in self.shard_runs(rank):
                idx = [slice(None)] * y.ndim
                idx[tax] = slice(s, s + n)
                parts.append(y[tuple(idx)])
            y = (xp.cat(parts, dim=tax) if kind == "torch" else xp.concatenate(parts, axis=tax)) \
                if len(parts) != 1 else parts[0]
        want = self.shard_shape(rank, role)
        if tuple(y.shape) != tuple(want):
            raise UsageError(f"{role}: the global array has shape {tuple(x.shape)}; rank "
                             f"{rank}'s shard would be {tuple(y.shape)}, the plan says "
                             f"{tuple(want)}", code="usage")
        return y.contiguous() if kind == "torch" else xp.ascontiguousarray(y)

    def gather(self, shards, role="out"):
        """The global array from every rank's shard (a list of world_size arrays, rank
        order), the inverse of shard().  Rows of a replicated segment (`split: replicate`),
        which every rank returns, are taken from rank 0 (the ranks' copies agree to
        rounding: with ring steps each rank merges the key blocks in its own order).
        For dk / dv with K/V heads replicated over
        tensor-parallel ranks (kv_heads < tp_degree) each rank holds a partial gradient
        of its K/V head (its query heads only): the parts are summed (in float32, then
        rounded to the shards' dtype once); the rows of a replicated segment, which
        every rank of a context-parallel group holds, are added once per group."""
        shards = list(shards)
        if len(shards) != self.world_size:
            raise UsageError(f"gather needs {self.world_size} shards (one per rank), got "
                             f"{len(shards)}", code="usage")
        kind, xp = _arrays(shards[0])
        shape = self.global_shape(role)
        x0 = shards[0]
        summed = role in ("dk", "dv") and self.tp_degree > self.kv_heads
        if summed:
            from ._bf16 import from_bf16

            def f32(x):
                if kind == "torch":
                    return x.float()
                return from_bf16(x) if x.dtype == xp.uint16 else x.astype(xp.float32)
            g = (xp.zeros(shape, dtype=xp.float32, device=x0.device) if kind == "torch"
                 else xp.zeros(shape, dtype=xp.float32))
        elif kind == "torch":
            g = xp.empty(shape, dtype=x0.dtype, device=x0.device)
        else:
            g = xp.empty(shape, dtype=x0.dtype)
        # summed parts with replicated segments: every rank of a context-parallel group
        # holds their rows (the same gradient): only the group's rank 0 adds them
        rep = set()
        T = self.tp_degree
        G = self.world_size // (self.cfg_degree * T)
        if summed and G > 1:
            held = [{t for s, n in self.shard_runs(r) for t in range(s, s + n)} for r in (0, T)]
            rep = held[0] & held[1]
        # last rank first, so that rows several ranks hold (replicated segments)
        # end with rank 0's copy
        for p, sh in reversed(list(enumerate(shards))):
            want = self.shard_shape(p, role)
            if tuple(sh.shape) != tuple(want):
                raise UsageError(f"{role}: rank {p}'s shard has shape {tuple(sh.shape)}, the "
                                 f"plan says {tuple(want)}", code="usage")
            tax, hax, hs, bs = self._layout(p, role)
            runs = self.shard_runs(p) if tax is not None else [(0, sh.shape[1])]
            if rep and tax is not None and (p // T) % G:
                # (global start, length, row in the shard) of the rows it adds
                parts, off = [], 0
                for s, n in runs:
                    for t in range(s, s + n):
                        if t not in rep:
                            if parts and parts[-1][0] + parts[-1][1] == t:
                                parts[-1][1] += 1
                            else:
                                parts.append([t, 1, off + t - s])
                    off += n
            else:
                parts, off = [], 0
                for s, n in runs:
                    parts.append([s, n, off])
                    off += n
            for s, n, off in parts:
                dst = [bs, slice(None), slice(None), slice(None)][:len(shape)]
                src = [slice(None)] * len(shape)
                if hax is not None:
                    dst[hax] = hs
                if tax is not None:
                    dst[tax] = slice(s, s + n)
                    src[tax] = slice(off, off + n)
                if summed:
                    g[tuple(dst)] += f32(sh[tuple(src)])
                else:
                    g[tuple(dst)] = sh[tuple(src)]
        if summed:
            if kind == "torch":
                return g.to(x0.dtype)
            from ._bf16 import to_bf16
            return to_bf16(g) if x0.dtype == xp.uint16 else g.astype(x0.dtype)
        return g

    def __repr__(self):
        return (f"<cpc.Artifact {self.variant} {self.ring_degree}x{self.ulysses_degree} "
                f"world {self.world_size} {self.dtype} B={self.batch} S={self.tokens} "
                f"H={self.heads} D={self.head_dim}>")

    def __del__(self):
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr:
            try:
                self._L.cpc_artifact_free(ptr)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
