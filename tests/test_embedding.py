"""Token embedding (fp8lab/kernels/embedding.py): the gather and both backward versions against the NumPy spec.

Fresh random inputs, odd widths, a small vocabulary with many repeats (V = 7, M = 300) and ids that leave rows
unused, outputs poisoned with NaN before every launch (the unused rows of dtable too: they must become 0).
Versions 2 and 3 are compared bit for bit with their order of additions and run again for the same bits; version
1, whose atomic adds land in a racy order, within the float32 summation bound of the exact sum. Small shapes run
everywhere (the simulator); realistic ones, the capstone's M = 16384 tokens of width D = 1024, are marked `gpu`.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.bench import assert_close, poisoned
from fp8lab.kernels import embedding as emb
from fp8lab.device.runtime import cuda

V_SMALL, M_SMALL = 7, 300
UNUSED = (1, 5)  # rows of the V = 7 table that no token uses


def shapes(*small):
    """(vocab, tokens, D): the small ones, then the capstone's sizes on a GPU (V = 65: ~250 tokens per row, the
    hard case for atomics; V = 32000: most rows get 0 or 1 token; an odd shape with partial tiles and chunks)."""
    big = [(65, 16384, 1024), (32000, 16384, 1024), (65, 16381, 1027)]
    return ([pytest.param(s, id=f"V{s[0]}-M{s[1]}-D{s[2]}") for s in small]
            + [pytest.param(s, id=f"V{s[0]}-M{s[1]}-D{s[2]}", marks=pytest.mark.gpu) for s in big])


SHAPES = shapes((V_SMALL, M_SMALL, 100), (V_SMALL, M_SMALL, 129))


def unused_rows(vocab):
    return UNUSED if vocab == V_SMALL else (0, vocab // 2, vocab - 1)


def run_backward(dout, ids, vocab, version, scratch=None):
    """The backward on device arrays into a NaN-poisoned dtable; returns it on the host."""
    dtable = poisoned((vocab, dout.shape[1]), np.float32)
    emb.backward(cuda.to_device(dout), cuda.to_device(ids), dtable, version, scratch=scratch)
    return dtable.copy_to_host()


def assert_v1_correct(got, dout, ids, vocab, unused):
    assert_close("backward v1", got, emb.reference_exact(dout, ids, vocab), atol=emb.error_bound(dout, ids, vocab),
                 rtol=0)  # NaN fails; rows without tokens have bound 0: exactly 0
    assert (got[list(unused)] == 0).all()


# ------------------------------------------------------------------------------------------------------------ gather


@pytest.mark.parametrize("shape", SHAPES)
def test_gather_exact(rng, shape):
    vocab, M, D = shape
    table, ids, _ = emb.problem(rng, vocab, M, D, unused_rows(vocab))
    out = poisoned((M, D), np.float32)
    assert emb.gather(cuda.to_device(table), cuda.to_device(ids), out) is out
    emb.assert_bits_equal("gather", out.copy_to_host(), emb.reference_gather(table, ids))


def test_gather_numpy_in_numpy_out(rng):
    table, ids, _ = emb.problem(rng, 11, 40, 33)
    out = np.full((40, 33), np.nan, np.float32)
    assert emb.gather(table, ids.astype(np.int64).tolist(), out) is out  # any integer ids on the host
    emb.assert_bits_equal("gather", out, table[ids])


def test_gather_unchecked_bad_id_gives_a_nan_row(rng):
    """check_range=False skips the host check of device ids; the kernel still reads nothing outside the table."""
    table, ids, _ = emb.problem(rng, V_SMALL, 40, 37)
    ids[[3, 17]] = [V_SMALL, -1]
    out = poisoned((40, 37), np.float32)
    emb.gather(cuda.to_device(table), cuda.to_device(ids), out, check_range=False)
    got = out.copy_to_host()
    assert np.isnan(got[[3, 17]]).all()
    good = np.setdiff1d(np.arange(40), [3, 17])
    emb.assert_bits_equal("gather", got[good], table[ids[good]])


# ---------------------------------------------------------------------------------------------------------- backward


def test_reference_adds_in_token_order_in_float32(rng):
    """The spec against an independent oracle: NumPy's cumsum adds one element at a time, in order."""
    _, ids, dout = emb.problem(rng, V_SMALL, M_SMALL, 50, UNUSED)
    ref = emb.reference(dout, ids, V_SMALL)
    assert ref.dtype == np.float32 and (ref[list(UNUSED)] == 0).all()
    for v in set(range(V_SMALL)) - set(UNUSED):
        emb.assert_bits_equal(f"row {v}", ref[v], np.cumsum(dout[ids == v], axis=0, dtype=np.float32)[-1])


@pytest.mark.parametrize("shape", SHAPES)
def test_backward_v1_within_the_rounding_bound(rng, shape):
    """Atomic adds: the order is a race, so the bits may differ from run to run; the error may not exceed the
    float32 summation bound of any order (emb.error_bound)."""
    vocab, M, D = shape
    unused = unused_rows(vocab)
    _, ids, dout = emb.problem(rng, vocab, M, D, unused)
    assert_v1_correct(run_backward(dout, ids, vocab, 1), dout, ids, vocab, unused)


@pytest.mark.parametrize("version", emb.SORTED)
@pytest.mark.parametrize("shape", SHAPES + [pytest.param((65, 262144, 128), id="V65-M262144-D128-skewed",
                                                                     marks=pytest.mark.gpu)])
def test_backward_sorted_versions_bit_exact_and_deterministic(rng, shape, version):
    """Versions 2 and 3 bit for bit their spec (token order; version 3 in segments), twice on one scratch, then on
    new ids; the large preset's shape with one id a fifth of the tokens (a row of many segments) on a GPU."""
    vocab, M, D = shape
    unused = unused_rows(vocab)
    top = 0.2 if M == 262144 else None
    _, ids, dout = emb.problem(rng, vocab, M, D, unused, top=top)
    ref = emb.reference_of(version)
    scratch = emb.Scratch(vocab, M, D if version == 3 else None)
    first = run_backward(dout, ids, vocab, version, scratch)
    emb.assert_bits_equal(f"backward v{version}", first, ref(dout, ids, vocab))
    assert (first[list(unused)] == 0).all()
    emb.assert_bits_equal(f"backward v{version}, run again", run_backward(dout, ids, vocab, version, scratch), first)
    # the same scratch on other ids (a training step later): nothing of the last call leaks in
    _, ids2, dout2 = emb.problem(rng, vocab, M, D, top=top)
    emb.assert_bits_equal(f"backward v{version}, new ids", run_backward(dout2, ids2, vocab, version, scratch),
                          ref(dout2, ids2, vocab))


def test_reference_in_segments_adds_each_segment_then_the_segments(rng):
    """Version 3's spec against NumPy's cumsum (one element at a time, in order) per segment, then over segments;
    it differs from token order (another order of float32 additions) on some rows."""
    _, ids, dout = emb.problem(rng, V_SMALL, M_SMALL, 50, UNUSED)
    ref = emb.reference(dout, ids, V_SMALL, segment=8)
    for v in set(range(V_SMALL)) - set(UNUSED):
        rows = dout[ids == v]
        runs = np.stack([np.cumsum(rows[i:i + 8], axis=0, dtype=np.float32)[-1] for i in range(0, len(rows), 8)])
        emb.assert_bits_equal(f"row {v}", ref[v], np.cumsum(runs, axis=0, dtype=np.float32)[-1])
    assert not np.array_equal(ref, emb.reference(dout, ids, V_SMALL))
    with pytest.raises(ValueError, match="version must be one of"):
        emb.reference_of(1)


@pytest.mark.parametrize("version", sorted(emb.VERSIONS))
def test_backward_mostly_unused_rows(rng, version):
    """More rows than tokens: most rows of dtable get no token and must come out 0, not NaN."""
    vocab, M, D = 50, 40, 33
    _, ids, dout = emb.problem(rng, vocab, M, D)
    unused = np.setdiff1d(np.arange(vocab), ids)
    assert len(unused) > 10
    got = run_backward(dout, ids, vocab, version)
    if version == 1:
        assert_v1_correct(got, dout, ids, vocab, unused)
    else:
        emb.assert_bits_equal(f"backward v{version}", got, emb.reference_of(version)(dout, ids, vocab))


def test_backward_numpy_in_numpy_out_and_int64_device_ids(rng):
    _, ids, dout = emb.problem(rng, V_SMALL, 70, 20, UNUSED)
    dtable = np.full((V_SMALL, 20), np.nan, np.float32)
    assert emb.backward(dout, ids.astype(np.uint8), dtable) is dtable  # BEST, scratch made for the call
    emb.assert_bits_equal("backward, NumPy", dtable, emb.reference_of(emb.BEST)(dout, ids, V_SMALL))
    d = poisoned((V_SMALL, 20), np.float32)
    emb.backward(cuda.to_device(dout), cuda.to_device(ids.astype(np.int64)), d, emb.BEST)
    emb.assert_bits_equal("backward, int64 device ids", d.copy_to_host(), dtable)


@pytest.mark.parametrize("version", sorted(emb.VERSIONS))
def test_backward_unchecked_bad_ids_are_skipped(rng, version):
    """check_range=False: a token whose id is outside [0, V) adds nothing and writes nothing outside dtable."""
    _, ids, dout = emb.problem(rng, V_SMALL, 70, 20)
    bad = np.zeros(70, bool)
    bad[[0, 33, 69]] = True
    ids[bad] = [-3, V_SMALL, 1000]
    dtable = poisoned((V_SMALL, 20), np.float32)
    emb.backward(cuda.to_device(dout), cuda.to_device(ids), dtable, version, check_range=False)
    got = dtable.copy_to_host()
    if version == 1:
        assert_v1_correct(got, dout[~bad], ids[~bad], V_SMALL, ())
    else:
        emb.assert_bits_equal(f"backward v{version}", got, emb.reference_of(version)(dout[~bad], ids[~bad], V_SMALL))


def test_module_checks(rng):
    assert len(emb.checks(rng)) == 1 + len(emb.VERSIONS)  # the gather, then each backward version


# --------------------------------------------------------------------------------------------------------- bad input


def _args(rng):
    table, ids, dout = emb.problem(rng, V_SMALL, 5, 8)
    return table, ids, dout


GATHER_BAD = [
    (lambda t, i: (t, i.astype(np.float32), np.zeros((5, 8), np.float32)), {}, TypeError, r"^ids must have an integer"),
    (lambda t, i: (t, cuda.to_device(i.astype(np.int16)), np.zeros((5, 8), np.float32)), {}, TypeError,
     r"^ids must have dtype int32 or int64 on the device"),
    (lambda t, i: (t, i.reshape(5, 1), np.zeros((5, 8), np.float32)), {}, ValueError, r"^ids must be 1-D"),
    (lambda t, i: (t, i[:0], np.zeros((0, 8), np.float32)), {}, ValueError, r"^ids must not be empty"),
    (lambda t, i: (t, np.r_[i[:4], V_SMALL], np.zeros((5, 8), np.float32)), {}, ValueError,
     r"^ids must lie in \[0, 7\) \(the rows of table\), got 1 value\(s\) outside, the first \(7\) at index 4"),
    (lambda t, i: (t, np.r_[-1, i[1:]], np.zeros((5, 8), np.float32)), {}, ValueError, r"^ids must lie in \[0, 7\)"),
    (lambda t, i: (t, cuda.to_device(np.r_[i[:4], 9].astype(np.int32)), np.zeros((5, 8), np.float32)), {},
     ValueError, r"^ids must lie in \[0, 7\)"),  # device ids are range-checked by default
    (lambda t, i: (t.astype(np.float64), i, np.zeros((5, 8), np.float32)), {}, TypeError,
     r"^table must have dtype float32"),
    (lambda t, i: (t[0], i, np.zeros((5, 8), np.float32)), {}, ValueError, r"^table must be 2-D"),
    (lambda t, i: (t, i, np.zeros((5, 9), np.float32)), {}, ValueError, r"^out must have shape \(5, 8\)"),
    (lambda t, i: (t, i, np.zeros((5, 8), np.float64)), {}, TypeError, r"^out must have dtype float32"),
    (lambda t, i: (t, i, np.zeros((5, 8), np.float32)), dict(check_range=1), TypeError, r"^check_range must be a bool"),
]


@pytest.mark.parametrize("make, kwargs, exc, match", GATHER_BAD)
def test_gather_bad_input(rng, make, kwargs, exc, match):
    table, ids, _ = _args(rng)
    with pytest.raises(exc, match=match):
        emb.gather(*make(table, ids), **kwargs)


BACKWARD_BAD = [
    (lambda d, i, g: (d.astype(np.float64), i, g), {}, TypeError, r"^dout must have dtype float32"),
    (lambda d, i, g: (d[:4], i, g), {}, ValueError, r"^dout must have shape \(5, 8\) \(one row per id\)"),
    (lambda d, i, g: (d, i, g[:, :7]), {}, ValueError, r"^dtable must have shape \(7, 8\)"),
    (lambda d, i, g: (d, i, g[0]), {}, ValueError, r"^dtable must be 2-D"),
    (lambda d, i, g: (d, i, g[:5]), {}, ValueError, r"^ids must lie in \[0, 5\) \(the rows of dtable\)"),
    (lambda d, i, g: (d, i.astype(bool), g), {}, TypeError, r"^ids must have an integer dtype"),
    (lambda d, i, g: (d, i, g), dict(version=4), ValueError, r"^version must be None or an int in \(1, 2, 3\)"),
    (lambda d, i, g: (d, i, g), dict(version="2"), TypeError, r"^version must be"),
    (lambda d, i, g: (d, i, g), dict(scratch=(8, 5)), ValueError,
     r"^scratch must be a Scratch for vocab = 7 and tokens >= 5, got one for vocab = 8"),
    (lambda d, i, g: (d, i, g), dict(scratch=(7, 4)), ValueError, r"^scratch must be a Scratch"),
    (lambda d, i, g: (d, i, g), dict(scratch="scratch"), TypeError, r"^scratch must be a Scratch or None"),
]


@pytest.mark.parametrize("make, kwargs, exc, match", BACKWARD_BAD)
def test_backward_bad_input(rng, make, kwargs, exc, match):
    _, ids, dout = _args(rng)
    ids[0] = V_SMALL - 1  # in range for V = 7, not for a 5-row dtable
    if isinstance(kwargs.get("scratch"), tuple):  # (vocab, tokens): made here, not at collection
        kwargs = dict(kwargs, scratch=emb.Scratch(*kwargs["scratch"]))
    with pytest.raises(exc, match=match):
        emb.backward(*make(dout, ids, np.zeros((V_SMALL, 8), np.float32)), **kwargs)


def test_scratch_bad_sizes():
    with pytest.raises(ValueError, match=r"^vocab must be a positive int"):
        emb.Scratch(0, 5)
    with pytest.raises(TypeError, match=r"^tokens must be a positive int"):
        emb.Scratch(7, 5.0)
    with pytest.raises(ValueError, match=r"^width must be a positive int"):
        emb.Scratch(7, 5, 0)
