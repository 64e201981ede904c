"""fp8lab.kernels.wgmma_tile: the single-tile wgmma kernel of lecture 07.

Fresh random operands, shapes that are not tile multiples (M past 64, N past 128, K past a K-group and not a multiple
of 32), outputs poisoned with NaN. Under the simulator the wgmma twin adds each K-group's products in k order in
FP32, as `reference` does, so the results must agree bit for bit; a kernel that skips the swizzle, a descriptor
step or the barrier must fail. On a GPU (marked gpu): realistic shapes against float64 within `error_bound`.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.bench import poisoned
from fp8lab.course import notebook
from fp8lab.device import runtime
from fp8lab.kernels import wgmma_tile as W
from fp8lab.numerics import formats


@pytest.mark.parametrize("M, N, K", [(70, 130, 300), (1, 1, 1), (64, 128, 256), (65, 129, 97)])
def test_bit_exact_with_reference(rng, M, N, K):
    a, sa, b, sb = W.random_operands(rng, M, N, K)
    y = poisoned((M, N), np.float32)
    W.gemm(a, sa, b, sb, out=y)
    y = y.copy_to_host()
    assert not np.isnan(y).any()
    if runtime.IS_SIM:
        assert np.array_equal(y, W.reference(a, sa, b, sb))
    ex = formats.decode(a).astype(np.float64) @ formats.decode(b).astype(np.float64).T * float(sa[0, 0] * sb[0, 0])
    assert (np.abs(y - ex) <= W.error_bound(a, sa, b, sb)).all()


def test_reference_is_the_product(rng):
    """The spec itself: close to float64 (FP32 sums), and per K-group (K = 300 is 3 groups)."""
    a, sa, b, sb = W.random_operands(rng, 9, 11, 300)
    ex = formats.decode(a).astype(np.float64) @ formats.decode(b).astype(np.float64).T * float(sa[0, 0] * sb[0, 0])
    ref = W.reference(a, sa, b, sb)
    assert ref.dtype == np.float32 and (np.abs(ref - ex) <= W.error_bound(a, sa, b, sb)).all()
    assert not np.array_equal(ref, W.reference(a[:, :128], sa, b[:, :128], sb))


@pytest.mark.parametrize("old, new, what", [
    ("smem[pad + ptx.swizzle_128b(i)] = v", "smem[pad + i] = v", "a stored without the swizzle"),
    ("desc_a + 2 * kk, desc_b + 2 * kk", "desc_a, desc_b + 2 * kk", "a's descriptor not stepped along K"),
    ("wgmma(part, smem, desc_a + 2 * kk, desc_b + 2 * kk, kk)",
     "wgmma(part, smem, desc_a + 2 * kk, desc_b + 2 * kk, 1)", "part not restarted at each K-group"),
])
def test_broken_copies_fail(rng, old, new, what):
    """try_kernel with a broken editable copy: the module's checks reject it (and the library's kernel comes back)."""
    src = notebook.editable_source("fp8lab.kernels.wgmma_tile.wgmma_tile_kernel")
    assert old in src, what
    ns: dict = {}
    exec(compile(src.replace(old, new), "<cell>", "exec"), ns)
    with pytest.raises(AssertionError, match="wgmma_tile"):
        notebook.try_kernel(W, 1, ns["wgmma_tile_kernel"], rng=rng)
    assert W.VERSIONS[1].kernel is W.wgmma_tile_kernel


@pytest.mark.parametrize("args, error, says", [
    (lambda a, sa, b, sb: (a.astype(np.float32), sa, b, sb), TypeError, "a_codes"),
    (lambda a, sa, b, sb: (a, sa, b[:, :-1], sb), ValueError, "share K"),
    (lambda a, sa, b, sb: (a, np.ones(3, np.float32), b, sb), ValueError, "sa must be one per-tensor scale"),
])
def test_bad_input_names_the_argument(rng, args, error, says):
    a, sa, b, sb = W.random_operands(rng, 3, 4, 40)
    with pytest.raises(error, match=says):
        W.gemm(*args(a, sa, b, sb))


def test_bad_out_names_the_argument(rng):
    a, sa, b, sb = W.random_operands(rng, 3, 4, 40)
    with pytest.raises(ValueError, match="out must be a float32 device array of shape"):
        W.gemm(a, sa, b, sb, out=poisoned((4, 3), np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(4096, 4096, 4096), (1000, 777, 1100), (4096, 7168, 2048)])
def test_gpu_realistic_shapes(rng, M, N, K):
    assert not runtime.IS_SIM
    a, sa, b, sb = W.random_operands(rng, M, N, K)
    y = poisoned((M, N), np.float32)
    W.gemm(a, sa, b, sb, out=y)
    y = y.copy_to_host()
    assert not np.isnan(y).any()
    ex = formats.decode(a).astype(np.float64) @ formats.decode(b).astype(np.float64).T * float(sa[0, 0] * sb[0, 0])
    assert (np.abs(y - ex) <= W.error_bound(a, sa, b, sb)).all()
