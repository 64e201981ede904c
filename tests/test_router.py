"""DeepSeek-V3's router on the device (fp8lab/kernels/router.py): the top-k experts by sigmoid + bias equal
fp8lab.comm.moe.route's (ties to the lower id), gates within a float32 ulp; the auxiliary-loss-free bias update bit
for bit; bad input named. Fresh random logits each run; the realistic size (256 experts, top-8) is marked `gpu`.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab._validate import is_device_array
from fp8lab.bench import assert_close, poisoned
from fp8lab.device.runtime import cuda
from fp8lab.kernels import router as R


@pytest.mark.parametrize("T, E, k", [(37, 9, 3), (5, 40, 1), (3, 64, 16),
                                     pytest.param(16381, 256, 8, marks=pytest.mark.gpu)])
def test_route_matches_the_reference(rng, T, E, k):
    logits = rng.standard_normal((T, E), dtype=np.float32) * np.float32(3)
    logits[0, 1:3] = logits[0, 0]  # ties: the lower ids first
    for bias in (None, (rng.standard_normal(E) * 0.2).astype(np.float32)):
        ids, gates = R.route(cuda.to_device(logits), k, bias)
        assert is_device_array(ids) and ids.dtype == np.int32 and ids.shape == (T, k)
        want_ids, want_gates = R.reference(logits, k, bias)
        assert np.array_equal(ids.copy_to_host(), want_ids)
        assert_close("gates", gates.copy_to_host(), want_gates, atol=0, rtol=2.0**-23)
        assert np.allclose(gates.copy_to_host().sum(axis=1), 1, rtol=1e-6)


@pytest.mark.parametrize("warps", [1, 2])
def test_route_kernel_on_poisoned_outputs_with_warps_sharing_a_block(rng, warps):
    """The kernel through its launch configuration by hand: outputs poisoned first, one warp per token and (under the
    simulator too) two tokens per block, grid-stride over more tokens than the grid holds."""
    T, E, k = 13, 40, 3
    logits = rng.standard_normal((T, E), dtype=np.float32) * np.float32(3)
    ids = cuda.to_device(np.full((T, k), -1, np.int32))
    gates = poisoned((T, k), np.float32)
    R.route_kernel[2, warps * 32](cuda.to_device(logits), cuda.to_device(np.zeros(E, np.float32)), k, ids, gates)
    want_ids, want_gates = R.reference(logits, k)
    assert np.array_equal(ids.copy_to_host(), want_ids)
    assert_close("gates", gates.copy_to_host(), want_gates, atol=0, rtol=2.0**-23)


def test_update_bias_moves_loads_toward_the_mean(rng):
    counts = np.array([10, 3, 7, 0, 5], np.int64)  # mean 5: expert 4 stays
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    bias = rng.standard_normal(5).astype(np.float32)
    d = cuda.to_device(bias)
    R.update_bias(d, cuda.to_device(offsets), 0.01)
    got = d.copy_to_host()
    assert np.array_equal(got, R.reference_update_bias(bias, counts, 0.01))
    assert got[0] < bias[0] and got[1] > bias[1] and got[3] > bias[3] and got[4] == bias[4]


BAD = [
    (lambda: R.route(np.zeros((4, 257), np.float32), 2), ValueError,
     r"^logits must be \(T, E\) with T >= 1 and 1 <= E"),
    (lambda: R.route(np.zeros((4, 8), np.float32), 9), ValueError, r"^top_k must be at most the number of experts"),
    (lambda: R.route(np.zeros((4, 64), np.float32), 17), ValueError, r"^top_k must be at most .* and at most 16"),
    (lambda: R.route(np.zeros((4, 8), np.float64), 2), TypeError, r"^logits must have dtype float32"),
    (lambda: R.route(np.zeros((4, 8), np.float32), 2, np.zeros(7, np.float32)), ValueError,
     r"^bias must have shape \(8,\)"),
    (lambda: R.update_bias(cuda.to_device(np.zeros(3, np.float32)), cuda.to_device(np.zeros(4, np.int32)), -1),
     ValueError, r"^gamma must be a finite number >= 0"),
    (lambda: R.update_bias(cuda.to_device(np.zeros(3, np.float32)), cuda.to_device(np.zeros(3, np.int32)), 0.1),
     ValueError, r"^offsets must have shape \(4,\)"),
    (lambda: R.update_bias(np.zeros(3, np.float32), np.zeros(4, np.int32), 0.1), TypeError,
     r"^bias and offsets must be device arrays"),
    (lambda: R.route(np.full((2, 8), np.nan, np.float32), 2), ValueError, r"^logits must be finite"),
    (lambda: R.route(np.zeros((2, 8), np.float32), 2, np.full(8, np.inf, np.float32)), ValueError,
     r"^bias must be finite"),
]


@pytest.mark.parametrize("call, error, match", BAD)
def test_bad_input_is_refused_by_name(call, error, match):
    with pytest.raises(error, match=match):
        call()
