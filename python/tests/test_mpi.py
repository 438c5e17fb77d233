"""cpc.Attention under mpirun (the caller's MPI_COMM_WORLD), and the distributed
example model (examples/flux_mini.py) at 1, 2 and 4 processes."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import HERE, REPO

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed")
pytest.importorskip("mpi4py")

EXAMPLE = REPO / "examples" / "flux_mini.py"


def mpirun(n, *args, timeout=240):
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n),
           "-x", "OPENBLAS_NUM_THREADS=1", sys.executable, *map(str, args)]
    env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout + p.stderr


def test_attention_on_mpi_comm():
    rc, out = mpirun(2, HERE / "mpi_worker.py")
    assert rc == 0 and "mpi_worker: ok" in out, out


def test_example_one_process():
    pytest.importorskip("torch")
    p = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0 and "PASS" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("n,dtype", [(2, "fp32"), (4, "bf16")])
def test_example_distributed(n, dtype):
    pytest.importorskip("torch")
    rc, out = mpirun(n, EXAMPLE, "--dtype", dtype)
    assert rc == 0 and "PASS" in out, out
    assert f"{n} process(es)" in out


@pytest.mark.parametrize("mode", ["abort", "stall"])
def test_an_error_on_one_process_ends_the_job(mode):
    """issue 22: a process that raises before the forward while its peer is inside it
    left the job hanging forever.  cpc.abort ends it at once; without it the peer's
    forward fails at the stall limit (timeout_s 2 s) and the job is aborted."""
    import time
    t0 = time.monotonic()
    rc, out = mpirun(2, HERE / "mpi_abort_worker.py", mode, timeout=120)
    took = time.monotonic() - t0
    assert rc != 0, out
    assert "the forward returned" not in out, out
    if mode == "abort":
        assert "aborted by the caller" in out, out
    else:
        assert "stalled" in out, out
    assert took < 60, (took, out)
