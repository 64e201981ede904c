"""Attention (fp8lab/kernels/attention.py): the three forward versions and the backward against the float64 references of
the bfloat16-rounded inputs, within the elementwise float32 bound (`tolerance`), causal and not; the bound is tight
enough to see a missing bfloat16 rounding; bad input named. Outputs are poisoned with NaN before each launch (the
module's checks, which tests/test_contract.py runs, do the same on the simulator's small shapes); realistic shapes
(T not a multiple of 32, D of 64 and 128) are marked `gpu`.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab._validate import is_device_array
from fp8lab.bench import assert_close, poisoned
from fp8lab.device.runtime import cuda
from fp8lab.kernels import attention as A
from fp8lab.numerics import formats


def run_version(version, q, k, v, causal):
    """One version through its launcher on poisoned device outputs; host (o, lse) in (B, H, T, D) / (B, H, T)."""
    B, H, T, D = q.shape
    o, lse = poisoned((B * H, T, D), np.float32), poisoned((B * H, T), np.float32)
    A.VERSIONS[version].kernel(*(cuda.to_device(a.reshape(B * H, T, D)) for a in (q, k, v)), o, lse, causal)
    return o.copy_to_host().reshape(q.shape), lse.copy_to_host().reshape(q.shape[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("version", sorted(A.VERSIONS))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 257, 64), (1, 2, 1025, 128), (3, 2, 100, 32)])
def test_forward_realistic(rng, shape, causal, version):
    q, k, v, _ = A.make_inputs(rng, shape)
    tol = A.tolerance(q, k, v, causal=causal, p_bf16=A.VERSIONS[version].has("tensor_cores"))
    o, lse = run_version(version, q, k, v, causal)
    ref_o, ref_lse = A.reference(q, k, v, causal)
    assert_close("o", o, ref_o, atol=tol["o"], rtol=0)  # NaN fails
    assert_close("lse", lse, ref_lse, atol=tol["lse"], rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 3, 257, 64), (1, 2, 513, 128)])
def test_backward_realistic(rng, shape):
    q, k, v, do = A.make_inputs(rng, shape)
    o, lse = A.attention(q, k, v, return_lse=True)
    tol = A.tolerance(q, k, v, do)
    for name, g, r in zip(("dq", "dk", "dv"), A.attention_backward(q, k, v, o, do, lse),
                          A.reference_backward(q, k, v, do, True, o)):
        assert_close(name, g, r, atol=tol[name], rtol=0)


def test_the_bound_sees_a_missing_bfloat16_rounding(rng):
    """The kernels read q, k, v rounded to bfloat16: their o is within the bound of the rounded reference, and the
    same softmax over unrounded v lies far outside it (so the bound is not vacuous)."""
    q, k, v, _ = A.make_inputs(rng, (1, 1, 35, 32))
    tol = A.tolerance(q, k, v)
    o = A.attention(q, k, v, version=2)
    assert isinstance(o, np.ndarray) and o.shape == q.shape and o.dtype == np.float32
    ref, _ = A.reference(q, k, v)
    assert_close("o", o, ref, atol=tol["o"], rtol=0)
    p, _, _ = A._probs(*(formats.round_bf16(x).astype(np.float64) for x in (q, k)), True)
    assert (np.abs(p @ v.astype(np.float64) - ref) > 4 * tol["o"]).any()


def test_warps_sharing_a_block(rng):
    """The simulator's default is one warp a block; here version 3 with 2 and 3 warps (32 and 48 queries a block)
    and version 1's softmax with 2 rows a block, on poisoned outputs."""
    q, k, v, _ = A.make_inputs(rng, (1, 2, 37, 32))
    ref_o, ref_lse = A.reference(q, k, v)
    tol = A.tolerance(q, k, v, p_bf16=True)
    flat = [cuda.to_device(a.reshape(2, 37, 32)) for a in (q, k, v)]
    for warps in (2, 3):
        o, lse = poisoned((2, 37, 32), np.float32), poisoned((2, 37), np.float32)
        kernel = A.make_flash_mma_kernel(32)
        kernel[(-(-37 // (16 * warps)), 2), 32 * warps](*flat, o, lse, np.float32(1 / np.sqrt(32)), 1)
        assert_close(f"v3, {warps} warps", o.copy_to_host().reshape(q.shape), ref_o, atol=tol["o"], rtol=0)
        assert_close(f"v3 lse, {warps} warps", lse.copy_to_host().reshape(q.shape[:3]), ref_lse, atol=tol["lse"],
                     rtol=0)
    s = cuda.device_array((2, 37, 37), np.float32)
    A.scores_kernel[(2, 5, 2), (32, 8)](*flat[:2], s, np.float32(1 / np.sqrt(32)), 1)
    lse = poisoned((2, 37), np.float32)
    A.softmax_rows_kernel[3, 64](s, lse)
    assert_close("softmax rows, 2 warps", lse.copy_to_host().reshape(q.shape[:3]), ref_lse, atol=tol["lse"], rtol=0)


def test_device_arrays_in_device_arrays_out(rng):
    q, k, v, do = (cuda.to_device(a) for a in A.make_inputs(rng, (1, 2, 5, 8)))
    o, lse = A.attention(q, k, v, causal=False, version=1, return_lse=True)
    assert is_device_array(o) and o.shape == (1, 2, 5, 8) and lse.shape == (1, 2, 5)
    grads = A.attention_backward(q, k, v, o, do, lse, causal=False)
    assert all(is_device_array(g) and g.shape == (1, 2, 5, 8) for g in grads)


def _qkv(rng, shape=(1, 2, 5, 8)):
    return [rng.standard_normal(shape, dtype=np.float32) for _ in range(3)]


BAD = [
    (lambda q, k, v: A.attention(q[0], k[0], v[0]), ValueError, r"^q must be 4-D"),
    (lambda q, k, v: A.attention(np.zeros((1, 1, 2, 129), np.float32), *[np.zeros((1, 1, 2, 129), np.float32)] * 2),
     ValueError, r"^q must be \(B, H, T, D\) with B, H, T >= 1 and 1 <= D <= 128"),
    (lambda q, k, v: A.attention(q, k[:, :1], v), ValueError, r"^k must have shape \(1, 2, 5, 8\)"),
    (lambda q, k, v: A.attention(q, k, v.astype(np.float64)), TypeError, r"^v must have dtype float32"),
    (lambda q, k, v: A.attention(q, k, v, causal=1), TypeError, r"^causal must be a bool"),
    (lambda q, k, v: A.attention(*[np.zeros((65536, 1, 1, 8), np.float32)] * 3), ValueError,
     r"^q must have B \* H <= 65535"),
    (lambda q, k, v: A.attention(q, k, v, version=4), ValueError, r"^version must be None or an int in \(1, 2, 3\)"),
    (lambda q, k, v: A.attention_backward(q, k, v, q, q, q), ValueError, r"^lse must have shape \(1, 2, 5\)"),
    (lambda q, k, v: A.attention_backward(q, k, v, q[..., :4], q, q[..., 0]), ValueError,
     r"^o must have shape \(1, 2, 5, 8\)"),
]


@pytest.mark.parametrize("call, error, match", BAD)
def test_bad_input_is_refused_by_name(rng, call, error, match):
    with pytest.raises(error, match=match):
        call(*_qkv(rng))
