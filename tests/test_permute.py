"""Routed experts' token permutation (fp8lab/kernels/permute.py): permute's rows, 128-row group starts and slots,
unpermute and both backwards, bit for bit the NumPy references (copies and sums in a fixed order); the sort's
outputs poisoned before the launch; an expert with no token; bad input named. Realistic routing is marked `gpu`.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab._validate import is_device_array
from fp8lab.bench import poisoned
from fp8lab.device.runtime import cuda
from fp8lab.kernels import permute as P


@pytest.mark.parametrize("T, k, E, D", [(70, 3, 5, 33), (40, 1, 3, 8),
                                        pytest.param(16381, 8, 64, 1031, marks=pytest.mark.gpu),
                                        pytest.param(4096, 8, 256, 512, marks=pytest.mark.gpu)])
def test_permute_is_the_stable_sort_by_expert(rng, T, k, E, D):
    x = rng.standard_normal((T, D), dtype=np.float32)
    ids, _ = P.make_routing(rng, T, k, E)
    ids[ids == 1] = 0 if k == 1 else ids[ids == 1]  # k = 1: expert 1 gets no token (an empty group)
    want_rows, want_off, want_slots = P.reference(x, ids, E)
    scratch = P.Scratch(T, k, E)
    rows, slots = poisoned((scratch.most_rows, D), np.float32), cuda.to_device(np.full((T, k), -7, np.int32))
    P.launch_permute(cuda.to_device(x), cuda.to_device(ids.reshape(-1)), scratch, rows, slots)
    off = scratch.starts.copy_to_host()
    assert np.array_equal(off, want_off) and (np.diff(off) % P.GROUP_ROWS == 0).all()
    got = rows.copy_to_host()[:off[-1]]
    assert np.array_equal(got, want_rows) and np.array_equal(slots.copy_to_host(), want_slots)  # padding rows: 0
    if k == 1:
        assert off[1] == off[2]  # the empty group takes no rows


def test_unpermute_and_backwards_match_the_references(rng):
    T, k, E, D = 50, 2, 4, 20
    x = rng.standard_normal((T, D), dtype=np.float32)
    ids, gates = P.make_routing(rng, T, k, E)
    rows, off, slots = P.permute(x, ids, E)
    assert isinstance(rows, np.ndarray) and rows.shape == (off[-1], D) and off.dtype == np.int64
    y = rng.standard_normal(rows.shape, dtype=np.float32)
    assert np.array_equal(P.unpermute(y, slots, gates), P.reference_unpermute(y, slots, gates))
    dout = rng.standard_normal((T, D), dtype=np.float32)
    dy, dgates = P.unpermute_backward(dout, y, slots, gates)
    owned = np.zeros(len(y), bool)
    owned[slots.reshape(-1)] = True
    assert (dy[~owned] == 0).all()
    for j in range(k):
        assert np.array_equal(dy[slots[:, j]], gates[:, j, None] * dout)
    np.testing.assert_allclose(dgates, np.einsum("td,tjd->tj", dout, y[slots]), rtol=1e-5, atol=1e-5)
    assert np.array_equal(P.permute_backward(y, slots), P.reference_permute_backward(y, slots))
    # permute's adjoint: <permute(x), r> = <x, permute_backward(r)> up to rounding
    r = rng.standard_normal(rows.shape, dtype=np.float32)
    np.testing.assert_allclose((rows * r).sum(), (x * P.permute_backward(r, slots)).sum(), rtol=1e-4)
    d_rows, d_off, d_slots = P.permute(cuda.to_device(x), cuda.to_device(ids), E)
    assert is_device_array(d_rows) and np.array_equal(d_rows.copy_to_host(), rows)


def test_unpermute_kernels_write_every_output(rng):
    """unpermute's and permute_backward's kernels on outputs poisoned with NaN, more tokens than blocks."""
    T, k, E, D = 30, 2, 3, 12
    ids, gates = P.make_routing(rng, T, k, E)
    _, _, slots = P.reference(np.zeros((T, D), np.float32), ids, E)
    y = rng.standard_normal((int(slots.max()) + 1, D), dtype=np.float32)
    out = poisoned((T, D), np.float32)
    P.unpermute_kernel[7, P.THREADS](cuda.to_device(y), cuda.to_device(slots), cuda.to_device(gates), out)
    assert np.array_equal(out.copy_to_host(), P.reference_unpermute(y, slots, gates))
    dx = poisoned((T, D), np.float32)
    P.gather_grad_kernel[7, P.THREADS](cuda.to_device(y), cuda.to_device(slots), dx)
    assert np.array_equal(dx.copy_to_host(), P.reference_permute_backward(y, slots))


def _args(rng):
    x = rng.standard_normal((6, 4), dtype=np.float32)
    ids, gates = P.make_routing(rng, 6, 2, 3)
    return x, ids, gates


BAD = [
    (lambda x, ids, g: P.permute(x, ids, 2), ValueError, r"^expert_ids must lie in \[0, 2\)"),
    (lambda x, ids, g: P.permute(x, np.zeros((6, 2), np.int32), 3), ValueError, r"^expert_ids must name k different"),
    (lambda x, ids, g: P.permute(x, ids[:5], 3), ValueError, r"^expert_ids must be an integer array of shape \(6, k\)"),
    (lambda x, ids, g: P.permute(x, ids.astype(np.float32), 3), ValueError, r"^expert_ids must be an integer array"),
    (lambda x, ids, g: P.permute(x.astype(np.float64), ids, 3), TypeError, r"^x must have dtype float32"),
    (lambda x, ids, g: P.permute(x, ids, 3, scratch=P.Scratch(6, 2, 4)), ValueError,
     r"^scratch must be a Scratch\(6, 2, 3\)"),
    (lambda x, ids, g: P.unpermute(x, ids, g[:, :1]), ValueError, r"^gates must have shape \(6, 2\)"),
    (lambda x, ids, g: P.unpermute(x, ids.astype(np.int64), g), TypeError, r"^slots must have dtype int32"),
    (lambda x, ids, g: P.unpermute_backward(x[:, :3], x, ids, g), ValueError, r"^dout must have shape \(6, 4\)"),
    (lambda x, ids, g: P.unpermute(x, ids + 5, g), ValueError, r"^slots must lie in \[0, 6\)"),
    (lambda x, ids, g: P.permute_backward(x, ids - 3), ValueError, r"^slots must lie in \[0, 6\)"),
    (lambda x, ids, g: P.unpermute_backward(x, x, np.zeros((6, 2), np.int32), g), ValueError,
     r"^slots must all be different"),
]


@pytest.mark.parametrize("call, error, match", BAD)
def test_bad_input_is_refused_by_name(rng, call, error, match):
    with pytest.raises(error, match=match):
        call(*_args(rng))
