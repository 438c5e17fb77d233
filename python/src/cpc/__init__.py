"""cpc: plan, validate and run context-parallel attention (ring, Ulysses, unified,
ulysses_anything, ring_anything) inside a Python program, over libcpc.

    import cpc
    r = cpc.check(plan)                 # plan: a path, a YAML string or a dict
    a = cpc.compile(plan)               # a proven Artifact (raises cpc.PlanError)
    att = cpc.Attention(a, comm=MPI.COMM_WORLD)
    out = att(q, k, v)                  # this rank's shards, numpy or torch
    plan = cpc.from_diffusers(ContextParallelConfig(ulysses_degree=4), transformer.config,
                              height=1024, width=1024)

`import cpc` needs neither libcpc's dependencies (MPI, CUDA) nor a GPU: libcpc is
loaded on first use, and what is missing is reported then (cpc.UnsupportedError).
See python/README.md."""

from ._errors import (Diagnostic, Error, FileError, InputError, NoMemoryError, PlanError,
                      RuntimeError, UnsupportedError, UsageError)
from ._diffusers import from_diffusers
from ._plan import Artifact, CheckResult, check, compile, load, plan_to_yaml
from ._attention import Attention, LocalWorld, abort
from ._bf16 import from_bf16, to_bf16

__version__ = "0.2.0"

__all__ = ["Artifact", "Attention", "abort", "CheckResult", "Diagnostic", "Error", "FileError",
           "InputError", "LocalWorld", "NoMemoryError", "PlanError", "RuntimeError",
           "UnsupportedError", "UsageError", "check", "compile", "features", "from_bf16",
           "from_diffusers", "library_path", "library_version", "load", "plan_to_yaml",
           "to_bf16"]


def library_version():
    """libcpc's version string (what `cpc --version` prints)."""
    from . import _native
    return _native.lib().cpc_version().decode()


def library_path():
    """The path of the loaded libcpc (None when it cannot be loaded)."""
    from . import _native
    return _native.library_path()


def features():
    """What this libcpc supports: {"mpi", "cuda", "nccl", "cudnn"} -> bool."""
    from . import _native
    L = _native.lib()
    return {"mpi": bool(L.cpc_have_mpi()), "cuda": bool(L.cpc_have_cuda()),
            "nccl": bool(L.cpc_have_nccl()), "cudnn": bool(L.cpc_have_cudnn())}
