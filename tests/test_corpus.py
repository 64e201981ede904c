"""The capstone's corpus: Tiny Shakespeare shipped in the package, split, encoded and windowed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8lab.training import corpus


def test_text_is_the_shipped_tiny_shakespeare():
    t = corpus.text()
    assert len(t) == 1_115_394 and t.startswith("First Citizen:\nBefore we proceed any further")
    c = corpus.load()
    assert c.vocab_size == 65 and c.vocab == "".join(sorted(set(t)))
    assert len(c.train) + len(c.val) == len(t) and len(c.val) == len(t) - int(len(t) * 0.9)
    assert c.decode(c.train[:14]) == "First Citizen:" and c.decode(c.val[-5:]) == t[-5:]


def test_encode_decode_round_trip():
    c = corpus.load()
    s = "To be, or not to be: that is the question."
    ids = c.encode(s)
    assert ids.dtype == np.int32 and c.decode(ids) == s


def test_windows_and_targets_follow_the_text(rng):
    c = corpus.load()
    ids, tgt = c.batch(rng, "train", 37, 9)
    assert ids.shape == (37, 9) and tgt.shape == (37,) and ids.dtype == tgt.dtype == np.int32
    t = corpus.text()
    for row, nxt in zip(ids[:5], tgt[:5]):
        window = c.decode(row) + c.decode([nxt])
        assert window in t
    a = c.eval_windows("val", 50, 8)
    b = c.eval_windows("val", 50, 8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_bits_per_char():
    assert corpus.bits_per_char(math.log(2)) == pytest.approx(1.0)


@pytest.mark.parametrize("call,exc,words", [
    (lambda c, r: c.batch(r, "test", 4, 8), ValueError, "split"),
    (lambda c, r: c.batch(r, "train", 0, 8), ValueError, "batch"),
    (lambda c, r: c.batch(r, "train", 4, 2.5), TypeError, "context"),
    (lambda c, r: c.batch(r, "val", 4, 10**7), ValueError, "context"),
    (lambda c, r: c.encode("naïve"), ValueError, "outside the corpus vocabulary"),
    (lambda c, r: c.encode(b"abc"), TypeError, "s must be a str"),
    (lambda c, r: c.decode([0, 65]), ValueError, "ids must be"),
])
def test_bad_input_names_the_argument(rng, call, exc, words):
    with pytest.raises(exc, match=words):
        call(corpus.load(), rng)
