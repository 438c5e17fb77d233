"""NCCL ranks bootstrapped from the launcher's group (cpc/_nccl.py): what runs without a
GPU.  The whole path on device memory (NCCL between ranks, CAI device arrays, mpi4py and
gloo groups) runs on the CUDA emulator with the fake NCCL in tests/cli/nccl_emu.sh
(tests/emu/nccl_py_emu.py); on a GPU in tests/gpu/run.sh (torchrun, CUDA tensors).
Here: the id broadcast over mpi4py and gloo with the device check replaced, and the
errors that say what to do."""
import os
import shutil
import subprocess
import sys

import pytest

import cpc
from cpc import _nccl
from conftest import HERE

MPIRUN = shutil.which("mpirun")


def plan(world):
    return cpc.compile({"version": 1, "model": {"heads": 4, "head_dim": 16},
                        "input": {"tokens": 32}, "cluster": {"world_size": world, "device": "cpu"},
                        "parallel": {"variant": "ring" if world > 1 else "none"}})


def test_transport_argument_is_checked():
    a = plan(1)
    with pytest.raises(cpc.UsageError, match="one of auto, nccl, torch, mpi"):
        cpc.Attention(a, transport="gloo")
    with pytest.raises(cpc.UsageError, match="needs comm="):
        cpc.Attention(a, backend="cuda", transport="nccl")


def test_no_gpu_here_says_what_to_do():
    """This machine: a CUDA runtime without a driver (or a libcpc without NCCL): the
    real device check refuses, every rank alike, before NCCL is touched."""
    MPI = pytest.importorskip("mpi4py.MPI")
    why = _nccl.device_problem(None)
    if why is None:
        pytest.skip("this machine has a GPU and NCCL: tests/gpu/run.sh covers it")
    assert "no CUDA device" in why or "without NCCL" in why, why
    with pytest.raises(cpc.UnsupportedError) as e:
        cpc.Attention(plan(1), comm=MPI.COMM_SELF, backend="cuda")
    assert "NCCL cannot run on rank 0 of 1" in str(e.value)
    assert "backend='cpu'" in e.value.hint


def test_world_size_mismatch_names_the_launch():
    MPI = pytest.importorskip("mpi4py.MPI")
    with pytest.raises(cpc.UsageError) as e:
        cpc.Attention(plan(2), comm=MPI.COMM_SELF, backend="cuda")
    assert "has 1 processes but the plan's world_size is 2" in str(e.value)
    assert "mpirun -np 2" in e.value.hint


def test_a_rank_without_gpu_makes_every_rank_raise(monkeypatch):
    MPI = pytest.importorskip("mpi4py.MPI")
    monkeypatch.setattr(_nccl, "device_problem", lambda device: "no CUDA device: (test)")
    with pytest.raises(cpc.UnsupportedError, match=r"rank 0 of 1: no CUDA device: \(test\)"):
        _nccl.bootstrap_id(plan(1), MPI.COMM_SELF, "mpi")


def test_id_from_rank0_in_one_process(monkeypatch):
    """NCCL's ncclGetUniqueId needs no GPU: a 128-byte id, fresh every time."""
    MPI = pytest.importorskip("mpi4py.MPI")
    if not cpc._native.lib().cpc_have_nccl():
        pytest.skip("this libcpc has no NCCL")
    monkeypatch.setattr(_nccl, "device_problem", lambda device: None)
    g, a = _nccl.bootstrap_id(plan(1), MPI.COMM_SELF, "mpi")
    _, b = _nccl.bootstrap_id(plan(1), MPI.COMM_SELF, "mpi")
    assert len(a) == len(b) == 128 and a != b and g.size == 1


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed")
@pytest.mark.parametrize("n", [2, 3])
def test_id_broadcast_over_mpi4py_and_gloo(n, tmp_path):
    pytest.importorskip("mpi4py")
    if not cpc._native.lib().cpc_have_nccl():
        pytest.skip("this libcpc has no NCCL")
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n),
           "-x", "OPENBLAS_NUM_THREADS=1", sys.executable, str(HERE / "nccl_worker.py"),
           str(tmp_path / "store")]
    # without this process's own MPI singleton's variables (the tests above initialised
    # MPI here: a child mpirun that inherits them exits at once)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "OPAL_"))}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "nccl_worker: ok" in out, out
