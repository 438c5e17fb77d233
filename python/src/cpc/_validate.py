"""Type and range checks of cpc.from_diffusers' arguments (issue 23), before any
arithmetic on them: a string for a bool ({"ulysses_anything": "false"} was taken as
True), a non-integer patch size ([1.9, 2, 2] was truncated to 1), zero, negative or
string sizes (ZeroDivisionError / TypeError) and a list _class_name all raise
ValueError naming the field, as from_diffusers' docstring promises (diffusers'
ContextParallelConfig checks its own fields' types likewise).  Pure Python."""

import math

# ContextParallelConfig fields that are flags
_CP_BOOLS = ("ulysses_anything", "ring_anything", "convert_to_fp32")
# transformer config.json keys from_diffusers reads as counts: name -> least value
_CFG_INTS = {"num_attention_heads": 1, "attention_head_dim": 1, "num_layers": 1,
             "num_single_layers": 0, "patch_size_t": 1, "temporal_compression_ratio": 1,
             "max_text_seq_length": 1, "in_channels": 1}
# from_diffusers keyword arguments that are counts (None: the default)
_ARG_INTS = ("height", "width", "num_frames", "world_size", "text_tokens", "batch",
             "vae_scale", "vae_temporal", "steps", "tokens")


def _is_bool(v):
    # numpy's bool scalar too: numpy.bool_ (numpy 1.x), numpy.bool (numpy 2.x)
    t = type(v)
    return isinstance(v, bool) or (t.__module__ == "numpy" and t.__name__ in ("bool_", "bool"))


def integer(v, what, least=1):
    """v as an int: an int (not a bool) or an integral float, at least `least`;
    else ValueError naming `what`."""
    if _is_bool(v) or not isinstance(v, (int, float)) or (
            isinstance(v, float) and not (math.isfinite(v) and v.is_integer())):
        try:
            import numbers
            ok = isinstance(v, numbers.Integral) and not _is_bool(v)
        except ImportError:  # pragma: no cover
            ok = False
        if not ok:
            raise ValueError(f"{what} must be an integer, got {v!r} ({type(v).__name__})")
    n = int(v)
    if n < least:
        raise ValueError(f"{what} must be >= {least}, got {n}")
    return n


def parallel_fields(f):
    """Checks the fields of a ContextParallelConfig (a dict of them, or None)."""
    if not f:
        return
    for k in _CP_BOOLS:
        v = f.get(k)
        if v is not None and not _is_bool(v):
            raise ValueError(f"parallel_config.{k} must be True or False, got {v!r} "
                             f"({type(v).__name__})")
    # ring_degree / ulysses_degree: from_diffusers checks them itself (with
    # diffusers' own messages)
    r = f.get("rotate_method")
    if r is not None and not isinstance(r, str):
        raise ValueError(f"parallel_config.rotate_method must be a string, got {r!r}")


def transformer_config(cfg):
    """Checks the keys of a transformer config.json (a dict) that from_diffusers reads."""
    name = cfg.get("_class_name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"transformer_config._class_name must be a string, got {name!r} "
                         f"({type(name).__name__})")
    for k, least in _CFG_INTS.items():
        if cfg.get(k) is not None:
            integer(cfg[k], f"transformer_config.{k}", least)
    p = cfg.get("patch_size")
    if p is not None:
        if isinstance(p, (list, tuple)):
            for i, x in enumerate(p):
                integer(x, f"transformer_config.patch_size[{i}]")
        else:
            integer(p, "transformer_config.patch_size")


def from_diffusers_args(parallel_config, cfg, args):
    """All of from_diffusers' checks: the parallel config's fields, the transformer
    config dict `cfg`, and the keyword arguments in `args` (a dict of them, e.g.
    locals(); names it does not know are left alone).  Raises ValueError."""
    from ._diffusers import _parallel_fields
    parallel_fields(_parallel_fields(parallel_config))
    transformer_config(cfg)
    for k in _ARG_INTS:
        if args.get(k) is not None:
            integer(args[k], k)
