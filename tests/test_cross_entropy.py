"""Softmax cross-entropy and its gradient (fp8lab.kernels.cross_entropy): every version against the float64 NumPy
spec on fresh random logits with a spread of magnitudes (rows offset by +-80, +100, -120), odd M and V, outputs
poisoned with NaN before the launch; the cross-warp paths, determinism, NaN / -Inf / bad-target behaviour and bad
input. Small shapes run everywhere (the simulator); realistic ones (M = 16384 tokens, V up to 32771) are marked
`gpu`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8lab.device import runtime
from fp8lab.bench import poisoned
from fp8lab.kernels import cross_entropy as ce
from fp8lab.device.runtime import cuda

VERSIONS = sorted(ce.VERSIONS)


def sizes(small, big):
    return [pytest.param(small, id="small"), pytest.param(big, id="big", marks=pytest.mark.gpu)]


def loss_fn(M, V, **kwargs):
    """A CrossEntropyLoss whose three outputs are poisoned (NaN) before its first launch."""
    f = ce.CrossEntropyLoss(M, V, dlogits=poisoned((M, V), np.float32), **kwargs)
    repoison(f)
    return f


def repoison(f):
    f.row_loss.copy_to_device(np.full(f.M, np.nan, np.float32))
    f.loss.copy_to_device(np.full(1, np.nan, np.float32))
    f.dlogits.copy_to_device(np.full((f.M, f.V), np.nan, np.float32))


def outputs(f):
    return f.loss.copy_to_host(), f.row_loss.copy_to_host(), f.dlogits.copy_to_host()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("shape", sizes((7, 65), (16384, 65)) + sizes((5, 97), (4099, 256))
                         + sizes((3, 300), (1027, 32771)) + sizes((6, 20), (3001, 20)))
def test_every_version_matches_the_reference(rng, version, shape):
    """V = 300 and 32771 are longer than version 3's registers (256 logits a warp): several chunks, re-read for the
    gradient. V = 20 leaves lanes with no logit, whose empty (-Inf, 0) normalizers must merge without a NaN."""
    M, V = shape
    x, t = ce.inputs(rng, M, V)
    f = loss_fn(M, V)
    f(cuda.to_device(x), cuda.to_device(t), version=version)
    ce.assert_matches(f"v{version}", f, x, t)  # tolerances: ce.LOSS_TOL, ce.GRAD_ATOL


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sizes((9, 97, 96), (4097, 1000, 1024)))
def test_cross_warp_paths(rng, version, case):
    """Several warps per block (one under the simulator by default): the (max, sum) and max merges through shared
    memory in versions 1-2, several rows per block in version 3; 96 threads are 3 warps, not a power of two."""
    M, V, threads = case
    x, t = ce.inputs(rng, M, V)
    f = loss_fn(M, V, threads=threads)
    f(x, t, version=version)
    ce.assert_matches(f"v{version}, {threads} threads", f, x, t)


@pytest.mark.parametrize("threads", [None, 64])
@pytest.mark.parametrize("version", VERSIONS)
def test_large_offsets_need_the_max(rng, version, threads):
    """Rows around +100 and -120: exp of the raw logits overflows to Inf or underflows to 0 in float32. With 64
    threads the max crosses warps (padding lanes must not contribute 0 to a max of negative logits)."""
    M, V = 6, 70
    x = rng.standard_normal((M, V), dtype=np.float32) * np.float32(2)
    x[0::2] += np.float32(100)
    x[1::2] -= np.float32(120)
    t = rng.integers(0, V, M).astype(np.int32)
    with np.errstate(over="ignore"):
        naive = np.exp(x).sum(axis=1)
    assert np.isinf(naive[0::2]).all() and (naive[1::2] == 0).all()  # so the test means something
    f = loss_fn(M, V, threads=threads)
    f(x, t, version=version)
    ce.assert_matches(f"v{version}", f, x, t)


def test_deterministic_and_the_ticket_resets(rng):
    """The same inputs give the same bits, launch after launch and across versions with different grids (each
    launch must leave the integer ticket at 0 for the next)."""
    M, V = 13, 97  # 4 blocks under the simulator: the last-block sum adds several partials
    x, t = ce.inputs(rng, M, V)
    dx, dt = cuda.to_device(x), cuda.to_device(t)
    f = loss_fn(M, V)
    first = {}
    for round_ in range(2):
        for v in VERSIONS:
            repoison(f)
            f(dx, dt, version=v)
            got = outputs(f)
            if round_ == 0:
                first[v] = got
                assert not any(np.isnan(a).any() for a in got), f"v{v}: NaN in an output"
            else:
                for name, a, b in zip(("loss", "row_loss", "dlogits"), got, first[v]):
                    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"v{v}: {name} changed bits"
    assert ce.reference(x, t)[0] == pytest.approx(float(first[1][0][0]), rel=ce.LOSS_TOL)


@pytest.mark.parametrize("version", VERSIONS)
def test_nan_and_minus_inf_logits(rng, version):
    """A NaN logit makes its row's loss and gradient NaN (and the mean); a -Inf logit is a probability of 0, as in
    the float64 reference; other rows are untouched."""
    M, V = 5, 40
    x, t = ce.inputs(rng, M, V)
    x[1, (t[1] + 3) % V] = np.nan
    masked = [(t[3] + 1) % V, (t[3] + 7) % V]
    x[3, masked] = -np.inf
    f = loss_fn(M, V)
    f(x, t, version=version)
    loss, rows, grad = outputs(f)
    assert np.isnan(loss[0]) and np.isnan(rows[1]) and np.isnan(grad[1]).all()
    keep = [0, 2, 3, 4]
    ref_rows, ref_grad = ce.reference_rows(x, t)
    assert np.isnan(ref_rows[1])
    assert not np.isnan(rows[keep]).any() and not np.isnan(grad[keep]).any()
    np.testing.assert_allclose(rows[keep], ref_rows[keep], rtol=ce.LOSS_TOL, atol=ce.LOSS_TOL)
    np.testing.assert_allclose(grad[keep], ref_grad[keep], rtol=ce.LOSS_TOL, atol=ce.GRAD_ATOL / M)
    assert (grad[3, masked] == 0).all()


@pytest.mark.parametrize("version", VERSIONS)
def test_device_target_out_of_range_gives_its_row_nan(rng, version):
    """Device targets are not read back (that would synchronize every step): a bad one shows as NaN."""
    M, V = 6, 33
    x, t = ce.inputs(rng, M, V)
    t[2], t[4] = V, -1
    f = loss_fn(M, V)
    f(cuda.to_device(x), cuda.to_device(t), version=version)
    loss, rows, grad = outputs(f)
    assert np.isnan(loss[0]) and np.isnan(rows[[2, 4]]).all() and np.isnan(grad[[2, 4]]).all()
    keep = [0, 1, 3, 5]
    ref_rows, ref_grad = ce.reference_rows(x[keep], t[keep])
    np.testing.assert_allclose(rows[keep], ref_rows, rtol=ce.LOSS_TOL, atol=ce.LOSS_TOL)
    np.testing.assert_allclose(grad[keep] * M, ref_grad * len(keep), rtol=ce.LOSS_TOL, atol=ce.GRAD_ATOL)


def test_convenience_function_and_bits(rng):
    """Equal logits (not zeros): the loss is ln V nats, log2 V bits per character, whatever the targets."""
    M, V = 4, 65
    x = np.full((M, V), 3.7, np.float32)
    t = list(rng.integers(0, V, M))  # a list of Python ints is accepted
    loss, dlogits = ce.cross_entropy(x, t)
    assert isinstance(loss, float) and dlogits.shape == (M, V) and dlogits.dtype == np.float32
    assert loss == pytest.approx(math.log(V), rel=ce.LOSS_TOL)
    assert ce.nats_to_bits(loss) == pytest.approx(math.log2(V), rel=ce.LOSS_TOL)
    assert ce.nats_to_bits(math.log(2)) == pytest.approx(1.0)
    np.testing.assert_allclose(dlogits, ce.reference(x, t)[1], rtol=ce.LOSS_TOL, atol=ce.GRAD_ATOL / M)
    np.testing.assert_allclose(dlogits.sum(axis=1), 0, atol=ce.GRAD_ATOL)  # softmax sums to 1, onehot too


def test_reference_gradient_is_the_derivative_of_the_mean_loss(rng):
    """The spec checked by central differences in float64, independently of every kernel."""
    M, V = 3, 6
    x = rng.standard_normal((M, V)) * 2
    t = rng.integers(0, V, M)
    _, grad = ce.reference_rows(x, t)
    h = 1e-6
    num = np.empty_like(x)
    for i in range(M):
        for j in range(V):
            xp, xm = x.copy(), x.copy()
            xp[i, j] += h
            xm[i, j] -= h
            num[i, j] = (ce.reference_rows(xp, t)[0].mean() - ce.reference_rows(xm, t)[0].mean()) / (2 * h)
    np.testing.assert_allclose(grad, num, atol=1e-8)


def test_default_version_and_launch_configuration():
    assert ce.default_version(65) == ce.default_version(ce.V3_MAX) == 3 == ce.BEST
    assert ce.default_version(ce.V3_MAX + 1) == 2
    f = ce.CrossEntropyLoss(1000, 65)
    for v in VERSIONS:
        blocks, threads = f.config(v)
        assert threads % 32 == 0 and 1 <= blocks <= f.M
        assert blocks <= runtime.MAX_BLOCKS or not runtime.IS_SIM


def _call(M=5, V=7, logits=None, targets=None, **kwargs):
    x = np.ones((M, V), np.float32) if logits is None else logits
    t = np.arange(M) % V if targets is None else targets
    ce.CrossEntropyLoss(M, V)(x, t, **kwargs)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: _call(logits=np.ones((5, 7))), TypeError, "logits must have dtype float32"),
    (lambda: _call(logits=np.ones(35, np.float32)), ValueError, "logits must be 2-D"),
    (lambda: _call(logits=np.ones((5, 8), np.float32)), ValueError, r"logits must have shape \(5, 7\)"),
    (lambda: _call(targets=np.arange(5, dtype=np.float32)), TypeError, "targets must have an integer dtype"),
    (lambda: _call(targets=np.ones(5, bool)), TypeError, "targets must have an integer dtype"),
    (lambda: _call(targets=np.arange(6)), ValueError, r"targets must have shape \(5,\)"),
    (lambda: _call(targets=np.zeros((5, 1), np.int32)), ValueError, r"targets must have shape \(5,\)"),
    (lambda: _call(targets=np.array([0, 1, 7, 2, 3])), ValueError,
     r"targets must lie in \[0, 7\).*1 value\(s\) outside, the first \(7\) at index 2"),
    (lambda: _call(targets=np.array([0, -1, 2, 3, 4], np.int8)), ValueError, r"targets must lie in \[0, 7\)"),
    (lambda: _call(targets=cuda.to_device(np.arange(5, dtype=np.int64))), TypeError,
     "targets must have dtype int32"),
    (lambda: _call(targets="abc"), TypeError, "targets must have an integer dtype"),
    (lambda: _call(version=4), ValueError, r"version must be None or an int in \(1, 2, 3\)"),
    (lambda: _call(version="2"), TypeError, "version must be"),
    (lambda: ce.CrossEntropyLoss(0, 7), ValueError, "M must be a positive int"),
    (lambda: ce.CrossEntropyLoss(5, 7, threads=48), ValueError, "threads must be a multiple of 32"),
    (lambda: ce.CrossEntropyLoss(5, 7, dlogits=np.zeros((5, 7), np.float32)), TypeError,
     "dlogits must be a CUDA device array"),
    (lambda: ce.CrossEntropyLoss(5, 7, dlogits=cuda.device_array((7, 5), np.float32)), ValueError,
     r"dlogits must have shape \(5, 7\)"),
    (lambda: ce.cross_entropy(np.ones((0, 7), np.float32), []), ValueError, "logits must not be empty"),
    (lambda: ce.reference(np.ones((2, 3), np.float32), [0, 3]), ValueError, r"targets must lie in \[0, 3\)"),
])
def test_bad_input(call, exc, words):
    with pytest.raises(exc, match=words):
        call()
