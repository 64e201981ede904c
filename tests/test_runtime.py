"""Backend selection and the simulator's gaps (warp shuffles, barriers), and fp8lab.timing."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import fp8lab
from fp8lab import bench, runtime, timing
from fp8lab.runtime import FULL_MASK, cuda, shfl_down_sync, shfl_xor_sync


def run_py(code: str, **env) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.pop("FP8LAB_BACKEND", None)
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)


def test_info_reports_backend_device_and_versions(capsys):
    d = fp8lab.info(show=True)
    assert d["backend"] == fp8lab.backend == runtime.backend
    for key in ("device_name", "device_sms", "device_cc", "device_memory_gib", "numpy", "numba-cuda"):
        assert key in d
    assert "backend" in capsys.readouterr().out
    if runtime.IS_SIM:
        assert d["device_sms"] is None
    else:
        assert d["device_sms"] > 0 and d["device_memory_gib"] > 1


def test_probe_does_not_import_numba():
    path = os.path.join(os.path.dirname(fp8lab.__file__), "_backend.py")
    r = run_py("import sys, importlib.util as u; s = u.spec_from_file_location('b', %r); m = u.module_from_spec(s); "
               "s.loader.exec_module(m); print(m.probe_driver()); assert 'numba' not in sys.modules" % path)
    assert r.returncode == 0, r.stderr


def test_bad_backend_variable_is_a_clear_error():
    r = run_py("import fp8lab", FP8LAB_BACKEND="cpu")
    assert r.returncode != 0
    assert "FP8LAB_BACKEND must be one of ('gpu', 'sim')" in r.stderr and "'cpu'" in r.stderr


def test_forcing_the_simulator_works():
    r = run_py("import fp8lab; print(fp8lab.backend)", FP8LAB_BACKEND="sim")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "sim"


def test_numba_imported_first_in_the_other_mode_is_a_clear_error():
    other = "0" if runtime.IS_SIM else "1"
    want = "sim" if runtime.IS_SIM else "gpu"
    r = run_py("import numba.cuda; import fp8lab", NUMBA_ENABLE_CUDASIM=other, FP8LAB_BACKEND=want)
    assert r.returncode != 0
    assert "numba.cuda was imported before fp8lab" in r.stderr


@pytest.mark.skipif(not runtime.IS_SIM, reason="there is a GPU here")
def test_forcing_gpu_without_one_is_a_clear_error():
    r = run_py("import fp8lab", FP8LAB_BACKEND="gpu")
    assert r.returncode != 0
    assert "FP8LAB_BACKEND=gpu" in r.stderr


@cuda.jit
def _shuffle_kernel(x, down, xor_max, total):
    i = cuda.threadIdx.x
    v = x[i]
    d = shfl_down_sync(FULL_MASK, v, 3)
    down[i] = d
    m = v
    off = 16
    while off > 0:
        m = max(m, shfl_xor_sync(FULL_MASK, m, off))
        off //= 2
    xor_max[i] = m
    s = v
    off = 16
    while off > 0:
        s += shfl_down_sync(FULL_MASK, s, off)
        off //= 2
    if i % 32 == 0:
        total[i // 32] = s


def test_warp_shuffles(rng):
    n = 64
    x = rng.standard_normal(n).astype(np.float32)
    down, xmax, total = np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32), np.full(2, np.nan, np.float32)
    _shuffle_kernel[1, n](x, down, xmax, total)
    w = x.reshape(2, 32)
    want_down = np.where((np.arange(n) % 32) + 3 < 32, np.roll(x, -3), x)
    assert (down == want_down).all()
    assert (xmax == np.repeat(w.max(1), 32)).all()
    # float32 tree sum vs NumPy's pairwise sum: bound by the magnitudes, not the (possibly tiny) total
    np.testing.assert_allclose(total, w.sum(1), rtol=0, atol=1e-6 * np.abs(w).sum(1).max())


@cuda.jit
def _early_exit_kernel(tmp, out, n):
    i = cuda.threadIdx.x
    if i >= n:
        return  # these threads never reach the barrier below
    tmp[i] = i
    cuda.syncthreads()
    out[i] = tmp[i] + tmp[(i + 1) % n]


def test_threads_that_return_early_do_not_hang_the_block():
    tmp, out = np.full(40, np.nan, np.float32), np.full(40, np.nan, np.float32)
    _early_exit_kernel[1, 64](tmp, out, 40)
    assert (out == np.arange(40) + (np.arange(40) + 1) % 40).all()


@cuda.jit
def _failing_kernel(out):
    i = cuda.threadIdx.x
    if i == 5:
        out[1000] = 1  # out of bounds
    cuda.syncthreads()
    out[i] = i


@pytest.mark.skipif(not runtime.IS_SIM, reason="the simulator raises IndexError; a GPU writes out of bounds")
def test_a_failing_simulated_kernel_raises_instead_of_hanging():
    with pytest.raises(IndexError):
        _failing_kernel[1, 32](np.zeros(32, np.float32))


def test_time_ms():
    ms = timing.time_ms(lambda: None)
    if runtime.IS_SIM:
        # nothing is timed under the simulator: a number here would be a Python-threads timing, not a GPU's
        assert ms is None and timing.fmt_ms(ms) == "not measured (simulator)"
        assert timing.launch_ms(lambda: None) is None
    else:
        # no GPU work between the events: far below a kernel launch (the hold before the start event is not
        # counted); a known 1 ms of GPU work measures about 1 ms; the wall time of a call includes it
        assert 0 <= ms < 0.05, ms
        assert 0.9 <= timing.time_ms(lambda: timing.hold_gpu(1.0)) <= 1.5
        assert timing.launch_ms(lambda: timing.hold_gpu(1.0)) >= 0.9
        assert timing.fmt_ms(ms) == f"{ms:.3f} ms"


def test_hold_gpu_holds_for_the_time_asked():
    timing.hold_gpu(0.1)  # compiles
    runtime.synchronize()
    t = time.perf_counter()
    timing.hold_gpu(3.0)
    runtime.synchronize()
    assert time.perf_counter() - t >= 3e-3


def test_hold_ms():
    assert timing.hold_ms(None) == timing.HOLD_MAX_MS
    assert timing.hold_ms(1e-5) == pytest.approx(0.02 + timing.HOLD_MARGIN_MS)
    assert timing.hold_ms(1.0) == timing.HOLD_MAX_MS


@cuda.jit
def _empty_kernel(x):
    pass


@pytest.mark.gpu
def test_time_ms_measures_the_gpu_not_the_python_launch():
    # a held kernel of 1 ms measures 1 ms; an empty kernel measures far less than Python's launch of it
    assert 1.0 <= timing.time_ms(lambda: timing.hold_gpu(1.0)) < 1.1
    x = cuda.device_array(4, np.float32)
    gpu = timing.time_ms(lambda: _empty_kernel[1, 32](x))
    wall = timing.launch_ms(lambda: _empty_kernel[1, 32](x))
    assert gpu < 0.02 and gpu < wall, (gpu, wall)


@pytest.mark.gpu
def test_the_hold_orders_pytorch_work_on_the_null_stream():
    torch = bench.torch_cuda()
    if torch is None:
        pytest.skip("PyTorch with CUDA is not installed (optional)")
    assert torch.cuda.current_stream().cuda_stream == 0
    e = torch.cuda.Event()
    timing.hold_gpu(0.1)
    runtime.synchronize()
    t = time.perf_counter()
    timing.hold_gpu(20.0)
    e.record()
    e.synchronize()
    assert time.perf_counter() - t >= 20e-3
    ts = torch.ones(1 << 20, device="cuda")
    assert 0 < timing.torch_time_ms(torch, lambda: ts.mul_(1.0)) < 0.05


def test_sizes_per_backend():
    t = runtime.sizes("train")
    assert {"batch", "d_in", "d_out", "steps"} <= set(t)
    with pytest.raises(ValueError, match="name must be one of"):
        runtime.sizes("nope")
