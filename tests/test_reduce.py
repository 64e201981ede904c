"""The CUDA primer's kernels (fp8lab/kernels/reduce.py): the sum ladder, thread_ids, axpy.

Fresh random inputs of lengths that are not multiples of a block or of the grid, outputs poisoned before every
launch; a sum is checked against the float64 sum within float32's summation bound, and must be finite.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.bench import poisoned
from fp8lab.kernels import reduce as R
from fp8lab.device.runtime import cuda


@pytest.mark.parametrize("version", sorted(R.VERSIONS))
@pytest.mark.parametrize("n", [1, 31, 33, 1000, 2 * R.THREADS * R.BLOCKS + 7,
                               pytest.param(50_000_017, marks=pytest.mark.gpu)])
def test_sum_within_the_float32_bound(rng, version, n):
    x = R.make_input(rng, n)
    out = poisoned(1, np.float32)
    R.launch(cuda.to_device(x), out, version=version)
    got = float(out.copy_to_host()[0])
    assert np.isfinite(got) and abs(got - R.reference(x)) <= R.error_bound(x)


@pytest.mark.parametrize("blocks", [1, 3])
def test_any_grid_covers_any_length(rng, blocks):
    """A grid smaller than the vector: the grid-stride loop takes each thread over several elements."""
    x = R.make_input(rng, 777)
    for v in R.VERSIONS:
        out = poisoned(1, np.float32)
        R.launch(cuda.to_device(x), out, version=v, blocks=blocks)
        assert abs(float(out.copy_to_host()[0]) - R.reference(x)) <= R.error_bound(x)
    assert abs(R.reduce_sum(x) - R.reference(x)) <= R.error_bound(x)  # host input, BEST


def test_sum_is_exact_on_small_integers(rng):
    """Integers below 2^24 whose partial sums stay below 2^24 add exactly in float32, in any order."""
    x = rng.integers(-100, 100, 5000).astype(np.float32)
    for v in R.VERSIONS:
        assert R.reduce_sum(x, version=v) == float(x.astype(np.int64).sum())


@pytest.mark.parametrize("blocks, threads, n", [(3, 64, None), (2, 96, 150), (1, 32, 5)])
def test_thread_ids(blocks, threads, n):
    ids = R.thread_ids(blocks, threads, n)
    assert np.array_equal(ids, R.reference_thread_ids(blocks, threads, n))
    assert ids.shape == (blocks * threads if n is None else n, len(R.ID_FIELDS))


def test_axpy(rng):
    x, y = R.make_input(rng, 1001), R.make_input(rng, 1001)
    for blocks in (None, 1, 5):
        y_d = cuda.to_device(y)
        # a power of two: a x is exact, so a GPU's fused multiply-add and NumPy's multiply-then-add agree
        R.axpy(-2.0, cuda.to_device(x), y_d, blocks=blocks)
        assert np.array_equal(y_d.copy_to_host(), R.reference_axpy(-2.0, x, y))


def test_bad_input():
    x = cuda.to_device(np.ones(10, np.float32))
    out = cuda.device_array(1, np.float32)
    with pytest.raises(TypeError, match="x must be a CUDA device array"):
        R.launch(np.ones(10, np.float32), out)
    with pytest.raises(ValueError, match=r"x must be a 1-D float32 device array, got .*float64"):
        R.launch(cuda.to_device(np.ones(10)), out)
    with pytest.raises(ValueError, match=r"out must be a 1-D float32 device array of shape \(1,\)"):
        R.launch(x, cuda.device_array(2, np.float32))
    with pytest.raises(ValueError, match="version must be None or an int in"):
        R.launch(x, out, version=4)
    with pytest.raises(ValueError, match="blocks must be a positive int"):
        R.launch(x, out, blocks=0)
    with pytest.raises(ValueError, match="threads must be at most 1024"):
        R.thread_ids(1, 2048)
    with pytest.raises(ValueError, match="x and y must have one shape"):
        R.axpy(1.0, x, cuda.device_array(11, np.float32))
    with pytest.raises(TypeError, match="y must be a 1-D float32 CUDA device array"):
        R.axpy(1.0, x, np.ones(10, np.float32))
