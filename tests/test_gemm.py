"""The SIMT float32 GEMM ladder (fp8lab.kernels.gemm) against its float64 reference, and `gemm`'s input checks.

Fresh random inputs, shapes that are not multiples of any version's tiles, outputs poisoned with NaN before the
launch, NaN counted as failure. Small shapes run everywhere (the simulator in CI); realistic shapes are marked
`gpu`.

Error bound: each output is a float32 sum of K float32 products. Every product and every addition rounds with
relative error at most u = 2^-24, so in any order, fused multiply-add or not, |got - exact| <= gamma_K *
sum_k |a_mk| |b_kn| with gamma_K = K u / (1 - K u) (Higham, Accuracy and Stability of Numerical Algorithms, 3.1).
K * 2^-23 = 2 K u covers gamma_K for any K here; the float64 reference is exact to far below that.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.device import runtime
from fp8lab.bench import poisoned
from fp8lab.kernels import gemm as G
from fp8lab.kernels.common import vec_ok
from fp8lab.device.runtime import cuda


def assert_within_bound(got, a, b):
    assert not np.isnan(got).any(), "NaN in output (an element was never written?)"
    err = np.abs(got.astype(np.float64) - G.reference(a, b))
    bound = G.error_bound(a, b)  # K * 2^-23 * (|a| @ |b|), see the module docstring
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert (err <= bound).all(), f"error {err[worst]:.3g} above bound {bound[worst]:.3g} at {worst}"


def run(version, M, N, K, rng):
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    out = poisoned((M, N), np.float32)
    G.launch(cuda.to_device(a), cuda.to_device(b), out, version)
    return out.copy_to_host(), a, b


# Every version on SIM_CHECK's odd shapes: gemm.checks, run by tests/test_contract.py::test_module_checks_pass.


def test_v6_vector_path(rng):
    # K and N multiples of 4: the float4 loads run (the software twin in the simulator), except at the edges
    a_ok = cuda.to_device(np.zeros((130, 20), np.float32))
    assert vec_ok(a_ok) == 1 and vec_ok(cuda.to_device(np.zeros((5, 17), np.float32))) == 0
    assert_within_bound(*run(6, 130, 132, 20, rng))


def test_v7_vector_path_and_double_buffer(rng):
    # several k-steps (both shared buffers in turn), float4 loads inside, scalar loads at every edge
    assert_within_bound(*run(7, 131, 136, 44, rng))


@pytest.mark.parametrize("version", sorted(G.VERSIONS))
def test_k_of_one_and_thin_shapes(rng, version):
    assert_within_bound(*run(version, 3, 5, 1, rng))


def test_gemm_public_function_numpy_and_device(rng):
    a = rng.standard_normal((9, 13), dtype=np.float32)
    b = rng.standard_normal((13, 7), dtype=np.float32)
    c = G.gemm(a, b, version=2)
    assert isinstance(c, np.ndarray) and c.dtype == np.float32 and c.shape == (9, 7)
    assert_within_bound(c, a, b)
    d = G.gemm(cuda.to_device(a), cuda.to_device(b), version=2)
    assert not isinstance(d, np.ndarray)
    assert_within_bound(d.copy_to_host(), a, b)
    out = poisoned((9, 7), np.float32)
    assert G.gemm(a, b, version=1, out=out) is out
    assert_within_bound(out.copy_to_host(), a, b)
    host_out = np.full((9, 7), np.nan, np.float32)
    assert G.gemm(a, b, version=3, out=host_out) is host_out
    assert_within_bound(host_out, a, b)
    assert G.BEST in G.VERSIONS


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(a=np.ones((4, 5)), b=np.ones((5, 3), np.float32)), TypeError, "a"),               # float64
    (dict(a=np.ones((4, 5), np.float32), b=np.ones((5, 3), np.int32)), TypeError, "b"),
    (dict(a=np.ones(5, np.float32), b=np.ones((5, 3), np.float32)), ValueError, "a"),        # 1-D
    (dict(a=np.ones((4, 5), np.float32), b=np.ones((5, 3, 1), np.float32)), ValueError, "b"),
    (dict(a=np.ones((4, 5), np.float32), b=np.ones((6, 3), np.float32)), ValueError, "a and b"),
    (dict(a=np.ones((0, 5), np.float32), b=np.ones((5, 3), np.float32)), ValueError, "a"),   # empty
    (dict(a=np.ones((4, 5), np.float32), b=np.ones((5, 0), np.float32)), ValueError, "b"),
    (dict(a="x", b=np.ones((5, 3), np.float32)), TypeError, "a"),
    (dict(a=np.ones((4, 5), np.float32), b=np.ones((5, 3), np.float32), version=8), ValueError, "version"),
    (dict(a=np.ones((4, 5), np.float32), b=np.ones((5, 3), np.float32), version="5"), TypeError, "version"),
    (dict(a=np.ones((4, 5), np.float32), b=np.ones((5, 3), np.float32), version=True), TypeError, "version"),
    (dict(a=np.ones((4, 5), np.float32), b=np.ones((5, 3), np.float32), out=np.ones((3, 4), np.float32)),
     ValueError, "out"),
    (dict(a=np.ones((4, 5), np.float32), b=np.ones((5, 3), np.float32), out=np.ones((4, 3))), TypeError, "out"),
])
def test_bad_inputs_name_the_argument(kwargs, exc, name):
    with pytest.raises(exc, match=rf"^{name} must"):
        G.gemm(**kwargs)


def test_occupancy_from_launch_config():
    # v1: 1024 threads and ptxas's 31 registers (1024 per warp after rounding): 2 blocks, every warp slot used
    o = G.occupancy(1, G.PTXAS_REGS_SM90[1])
    assert o["blocks_per_sm"] == 2 and o["occupancy"] == 1.0
    # v5: 126 registers -> 4096 per warp, 8 warps: 2 blocks of 256 threads, a quarter of the SM's 64 warps
    o = G.occupancy(5, G.PTXAS_REGS_SM90[5])
    assert o["limited_by"] == "registers" and o["blocks_per_sm"] == 2 and o["occupancy"] == 0.25
    assert G.LAUNCH[5]["smem"] == 8192 and G.LAUNCH[4]["threads"] == 512


@pytest.mark.gpu
@pytest.mark.parametrize("version", sorted(G.VERSIONS))
def test_every_version_realistic_odd_shape(rng, version):
    assert_within_bound(*run(version, 1027, 2049, 515, rng))


@pytest.mark.gpu
def test_best_version_4096_cubed(rng):
    assert_within_bound(*run(G.BEST, 4096, 4096, 4096, rng))


@pytest.mark.gpu
@pytest.mark.parametrize("version", [6, 7])
def test_float4_matches_scalar_path(rng, version):
    # the inline-PTX loads (aligned, K and N multiples of 4) give the same bits as the scalar fallback
    a = rng.standard_normal((1000, 516), dtype=np.float32)
    b = rng.standard_normal((516, 1028), dtype=np.float32)
    da, db = cuda.to_device(a), cuda.to_device(b)
    assert vec_ok(da) == 1 and vec_ok(db) == 1
    vec, scalar = poisoned((1000, 1028), np.float32), poisoned((1000, 1028), np.float32)
    G.launch(da, db, vec, version)
    grid, block = G.grid(version, 1000, 1028)
    G.VERSIONS[version].kernel[grid, block](da, db, scalar, 0, 0)
    assert np.array_equal(vec.copy_to_host(), scalar.copy_to_host())
    assert_within_bound(vec.copy_to_host(), a, b)


@pytest.mark.gpu
def test_registers_and_occupancy_on_gpu(rng):
    assert not runtime.IS_SIM
    for v, k in ((v, row.kernel) for v, row in G.VERSIONS.items()):
        run(v, 33, 35, 17, rng)  # compiles the kernel for C-contiguous float32 operands if not yet done
        regs = k.get_regs_per_thread()  # an int, or {signature: int} when several were compiled
        regs = max(regs.values()) if isinstance(regs, dict) else regs
        got, recorded = G.occupancy(v, regs), G.occupancy(v, G.PTXAS_REGS_SM90[v])
        print(f"v{v}: {regs} registers (recorded {G.PTXAS_REGS_SM90[v]}), occupancy {got['occupancy']:.0%}")
        # The recorded counts stand in for the GPU's under the simulator (notebook 05's occupancy table): the
        # compiled kernel must lead to the same conclusion (resident blocks, occupancy, binding limit) ...
        for key in ("blocks_per_sm", "occupancy", "limited_by"):
            assert got[key] == recorded[key], f"v{v}: {key} {got[key]} with {regs} registers, " \
                                              f"{recorded[key]} with the recorded {G.PTXAS_REGS_SM90[v]}"
        # ... and the count itself may drift with the ptxas release only by a few registers
        assert abs(regs - G.PTXAS_REGS_SM90[v]) <= 8, f"v{v}: {regs} registers, recorded {G.PTXAS_REGS_SM90[v]}"


@pytest.mark.parametrize("K, M, N", [(70, 67, 33), (33, 5, 40), (1, 3, 2)]
                         + [pytest.param(16387, 65, 515, marks=pytest.mark.gpu),
                            pytest.param(65536, 65, 2048, marks=pytest.mark.gpu)])
def test_atb_splits_k_and_adds_the_splits(rng, K, M, N):
    """c = a^T b for tall a, b (the output head's weight gradient), K split over blocks (2 splits under the
    simulator where K allows, more on a GPU), c and the partial sums poisoned: within the FP32 bound."""
    assert G.check_atb(K, M, N, rng) <= 1
    assert G.atb_splits(K, M, N) == min(2 if runtime.IS_SIM else G.atb_splits(K, M, N), -(-K // G.ATB_K))


def test_atb_refuses_a_partial_buffer_too_small(rng):
    a, b = cuda.to_device(np.ones((70, 4), np.float32)), cuda.to_device(np.ones((70, 3), np.float32))
    with pytest.raises(ValueError, match=r"^partial must have shape \(>= 2, 4, 3\)"):
        G.atb_launch(a, b, cuda.device_array((4, 3), np.float32), cuda.device_array((1, 4, 3), np.float32))
