"""Backend selection and the simulator's gaps (warp shuffles, barriers), and fp8lab.bench.timing."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import fp8lab
from fp8lab import bench
from fp8lab.device import runtime
from fp8lab.bench import timing
from fp8lab.device.runtime import FULL_MASK, cuda, shfl_down_sync, shfl_xor_sync


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
    path = os.path.join(os.path.dirname(fp8lab.__file__), "device", "select.py")
    r = run_py("import sys, importlib.util as u; s = u.spec_from_file_location('b', %r); m = u.module_from_spec(s); "
               "s.loader.exec_module(m); print(m.probe_driver()); assert 'numba' not in sys.modules" % path)
    assert r.returncode == 0, r.stderr


def test_bad_backend_variable_is_a_clear_error():
    r = run_py("import fp8lab; fp8lab.backend", FP8LAB_BACKEND="cpu")
    assert r.returncode != 0 and "BackendError" in r.stderr
    assert "FP8LAB_BACKEND must be one of ('gpu', 'sim')" in r.stderr and "'cpu'" in r.stderr


def test_import_fp8lab_chooses_no_backend_until_used():
    """`import fp8lab` is light: the backend is chosen (and numba imported) when a kernel or fp8lab.backend is
    first used, so `fp8lab --backend` and FP8LAB_BACKEND set after the import still apply."""
    r = run_py("import sys, fp8lab; assert 'numba' not in sys.modules and 'fp8lab.device.runtime' not in sys.modules; "
               "import os; os.environ['FP8LAB_BACKEND'] = 'sim'; print(fp8lab.backend, 'numba' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["sim", "True"]
    assert sorted(fp8lab.__all__) == sorted(set(fp8lab.__all__)) and set(fp8lab.__all__) <= set(dir(fp8lab))
    for name in fp8lab.__all__:
        assert getattr(fp8lab, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'quantise'"):
        fp8lab.quantise


def test_forcing_the_simulator_works():
    r = run_py("import fp8lab; print(fp8lab.backend)", FP8LAB_BACKEND="sim")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "sim"


def test_numba_imported_first_in_the_other_mode_is_a_clear_error():
    other = "0" if runtime.IS_SIM else "1"
    want = "sim" if runtime.IS_SIM else "gpu"
    r = run_py("import numba.cuda; import fp8lab; fp8lab.quantize", NUMBA_ENABLE_CUDASIM=other, FP8LAB_BACKEND=want)
    assert r.returncode != 0
    assert "numba.cuda was imported before fp8lab" in r.stderr


@pytest.mark.skipif(not runtime.IS_SIM, reason="there is a GPU here")
def test_forcing_gpu_without_one_is_a_clear_error():
    r = run_py("import fp8lab; fp8lab.backend", FP8LAB_BACKEND="gpu")
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
    from fp8lab.training import loop

    assert runtime.per_backend({"sim": 1, "gpu": 2}) == (1 if runtime.IS_SIM else 2)
    t = loop.sizes("teacher")
    assert {"batch", "d_in", "d_out", "steps"} <= set(t) and t == loop.SIZES["teacher"][runtime.backend]
    t["batch"] = -1  # a copy: the table stays
    assert loop.sizes("teacher")["batch"] > 0
    with pytest.raises(ValueError, match="task must be one of"):
        loop.sizes("nope")


# ------------------------------------------------------------------------------------------------ the device pool


def test_block_cache_reuses_freed_blocks_and_releases_on_oom():
    from fp8lab.device import pool as _pool

    assert [_pool.bucket(n) for n in (1, 512, 513, 2**20, 2**20 + 1)] == [512, 512, 1024, 2**20, 2 << 20]
    live, freed = set(), []
    budget = {"bytes": 8 << 20}

    def alloc(n):
        if n > budget["bytes"]:
            raise MemoryError
        budget["bytes"] -= n
        p = object()
        live.add(p)
        return p

    def free(p):
        live.remove(p)
        freed.append(p)
        budget["bytes"] += 2 << 20  # every test block below is one 2 MiB bucket

    c = _pool.BlockCache(alloc, free)
    a, n = c.take(3 << 19)  # 1.5 MiB -> a 2 MiB block
    assert n == 2 << 20 and c.stats["driver_allocs"] == 1 and c.stats["in_use_bytes"] == n
    c.give(a, n)
    b, _ = c.take(2 << 20)
    assert b is a and c.stats == {"driver_allocs": 1, "reuses": 1, "cached_bytes": 0, "in_use_bytes": n}
    blocks = [c.take(2 << 20)[0] for _ in range(3)]  # the 8 MiB budget is used up
    for p in blocks:
        c.give(p, n)
    assert c.stats["cached_bytes"] == 3 * n
    big, m = c.take(5 << 20)  # does not fit: the cached blocks go back to the driver, then it does
    assert m == 6 << 20 and set(freed) == set(blocks) and c.stats["cached_bytes"] == 0 and c.blocks == {}
    with pytest.raises(MemoryError):
        c.take(64 << 20)


@pytest.mark.gpu
def test_public_api_allocates_nothing_in_steady_state(rng):
    """fl.quantize and fl.fp8_gemm allocate their outputs; after the first call the pool serves them."""
    from fp8lab.device import pool as _pool

    if runtime.IS_SIM:
        pytest.skip("needs a CUDA GPU (backend is the simulator); run `make test-gpu` on one")
    assert runtime.POOLED and _pool.cache() is not None
    x = cuda.to_device(rng.standard_normal((1000, 1300), dtype=np.float32))
    qa = fp8lab.quantize(x, granularity="tile")
    qb = fp8lab.quantize(cuda.to_device(rng.standard_normal((700, 1300), dtype=np.float32)), granularity="block")
    for _ in range(2):
        del qa
        qa = fp8lab.quantize(x, granularity="tile")
        y = fp8lab.fp8_gemm(qa, qb)
        del y
    before = dict(_pool.cache().stats)
    for _ in range(5):
        del qa
        qa = fp8lab.quantize(x, granularity="tile")
        y = fp8lab.fp8_gemm(qa, qb)
        del y
    after = _pool.cache().stats
    assert after["driver_allocs"] == before["driver_allocs"] and after["reuses"] >= before["reuses"] + 15
    ref = fp8lab.quantize(x.copy_to_host(), granularity="tile")
    assert (qa.data.copy_to_host() == ref.data).all() and (qa.scale.copy_to_host() == ref.scale).all()


# ------------------------------------------------------------------------- the simulator's slow-launch warning


class _Launched(Exception):
    """Raised by a patched launcher: the call got past its cost check without running anything slow."""


def _launched(*args, **kwargs):
    raise _Launched


def _slow_warnings(record):
    return [w for w in record if issubclass(w.category, runtime.SimulatorSlowWarning)]


@pytest.fixture
def sim_warnings(monkeypatch):
    """The warning logic as under the simulator (whatever the backend), with no op warned about yet."""
    monkeypatch.setattr(runtime, "backend", "sim")
    monkeypatch.setattr(runtime, "_SIM_WARNED", set())


def test_sim_cost_warning_warns_once_per_op_above_a_minute(sim_warnings):
    import warnings

    assert fp8lab.SimulatorSlowWarning is runtime.SimulatorSlowWarning and runtime.SIM_WARN_S == 60
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert not runtime.sim_cost_warning("fl.gemm", 59.0, "a size", "sizes like 8x8x8 take about 2 s")
        assert runtime.sim_cost_warning("fl.gemm", 200.0, "512x512x512", "sizes like 48x48x48 take about 2 s")
        assert not runtime.sim_cost_warning("fl.gemm", 9999.0, "4096x4096x4096", "...")  # once per op
        assert runtime.sim_cost_warning("fl.quantize", 3 * 3600 + 120, "4096x7168", "sizes like 128x128 take ...")
    (w1, w2) = _slow_warnings(record)
    assert str(w1.message) == ("fl.gemm on the simulator: about 3 min 20 s for 512x512x512 (estimated); sizes like "
                               "48x48x48 take about 2 s. On a GPU each launch takes milliseconds; set "
                               "FP8LAB_BACKEND=gpu on a machine with one.")
    assert "about 3 h 2 min for 4096x7168" in str(w2.message)


def test_sim_estimates_grow_with_the_sizes_and_name_quick_ones(sim_warnings):
    import warnings

    from fp8lab import quant
    from fp8lab.kernels import fp8_gemm as fg
    from fp8lab.kernels import gemm as G
    from fp8lab.training import loop

    def s(v, dims):
        return G.VERSIONS[v].sim_cost.seconds(dims)

    assert s(7, (512, 512, 512)) > 2 * runtime.SIM_WARN_S and s(7, (256, 256, 256)) < 60
    assert s(7, (64, 64, 64)) < 5 and s(7, (8, 8, 8)) < s(3, (8, 8, 8))
    assert s(7, (100, 100, 100)) == s(7, (128, 128, 104))  # padded to v7's 128 x 128 x 8
    for v, shape in G.SIM_CHECK.items():  # the shapes each version is checked at (tests, notebook 05) stay quick
        assert s(v, shape) < 10
    assert fg.VERSIONS[3].sim_cost.seconds((512, 512, 512)) > runtime.SIM_WARN_S
    assert fg.VERSIONS[1].cost("accum_bits").seconds((64, 64, 64)) > fg.VERSIONS[1].cost().seconds((64, 64, 64))
    assert 10 < 20 * loop.SIM_COST.seconds((8, 32, 16)) < runtime.SIM_WARN_S  # the default run: ~half a minute
    tile = quant.SIM_COST["fl.quantize"]["tile"]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        runtime.sim_check("fl.quantize", (4096, 7168), tile)
        runtime.sim_check("fl.train", (64, 512, 256), loop.SIM_COST, steps=600)
    q, t = (str(w.message) for w in _slow_warnings(record))
    n = int(q.split("sizes like ")[1].split("x")[0])
    assert tile.seconds((n, n)) <= runtime.SIM_QUICK_S < tile.seconds((2 * n, 2 * n))
    assert "for batch x d_in x d_out = 64x512x256, 600 steps (estimated)" in t and "s a step." in t


def test_public_calls_warn_before_launching_and_only_under_the_simulator(sim_warnings, monkeypatch):
    import warnings

    from fp8lab import quant
    from fp8lab.training import teacher
    from fp8lab.kernels import fp8_gemm as fg
    from fp8lab.kernels import gemm as G

    for module, name in ((G, "launch"), (fg.host, "launch"), (quant.qk, "TensorQuantizer"), (quant.qk, "dequantize"),
                         (quant.qf, "requantize_tile_to_col"), (teacher, "KernelStep"),
                         (teacher, "ReferenceStep")):
        monkeypatch.setattr(module, name, _launched)
    f32 = np.zeros((512, 512), np.float32)
    u8k = np.zeros((1024, 1024), np.uint8)  # fp8_gemm's default (wgmma's twin) simulates 512^3 in under a minute
    one = np.ones(1, np.float32)
    tile = fp8lab.QuantizedTensor(np.zeros((4096, 512), np.uint8), np.ones((4096, 4), np.float32), "e4m3", "tile")
    calls = {
        "fl.gemm": lambda: fp8lab.gemm(f32, f32),
        "fl.fp8_gemm": lambda: fp8lab.fp8_gemm(*[fp8lab.QuantizedTensor(u8k, one, "e4m3", "tensor")] * 2),
        "fl.quantize": lambda: fp8lab.quantize(np.zeros((2048, 2048), np.float32)),
        "fl.dequantize": lambda: fp8lab.dequantize(fp8lab.QuantizedTensor(np.zeros((4096, 4096), np.uint8), one,
                                                                          "e4m3", "tensor")),
        "fl.requantize_tile_to_col": lambda: fp8lab.requantize_tile_to_col(tile),
        "fl.train": lambda: fp8lab.train(steps=600, batch=64, d_in=512, d_out=256, progress=False),
    }
    for backend, warns in (("gpu", False), ("sim", True), ("sim", False)):  # a GPU never; the simulator once per op
        monkeypatch.setattr(runtime, "backend", backend)
        for op, call in calls.items():
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                with pytest.raises(_Launched):
                    call()
            got = _slow_warnings(record)
            assert [str(w.message).split(" on the simulator")[0] for w in got] == ([op] if warns else []), (backend, op)
            assert all(w.filename == __file__ for w in got), [w.filename for w in got]  # points at the caller
    with warnings.catch_warnings(record=True) as record:  # the NumPy reference engine launches nothing
        warnings.simplefilter("always")
        monkeypatch.setattr(runtime, "_SIM_WARNED", set())
        with pytest.raises(_Launched):
            fp8lab.train(steps=600, batch=64, d_in=512, d_out=256, engine="reference", progress=False)
    assert not _slow_warnings(record)
