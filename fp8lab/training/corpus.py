"""The capstone's data: character-level language modelling of Tiny Shakespeare (NumPy only, nothing downloaded).

The text is about 1.1 MB of Shakespeare's plays (public domain) as collected by Andrej Karpathy for char-rnn
(github.com/karpathy/char-rnn, data/tinyshakespeare/input.txt, 1,115,394 bytes, 65 distinct characters), shipped
gzipped in fp8lab/data. The first 90% of the characters train, the last 10% validate (contiguous, so no
validation sentence was seen in training).

A sample is a window of `context` characters and the character that follows it: the model predicts the next
character from the last `context` ones. Losses are in nats per character; `bits_per_char` converts (divide by ln 2).
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import math
import pathlib

import numpy as np

from .. import _validate as V

FILE = pathlib.Path(__file__).parents[1] / "data" / "tinyshakespeare.txt.gz"
VAL_FRACTION = 0.1
SPLITS = ("train", "val")


@functools.lru_cache(maxsize=1)
def text() -> str:
    """The whole corpus as one string."""
    with gzip.open(FILE, "rt", encoding="utf-8") as f:
        return f.read()


def bits_per_char(nats: float) -> float:
    """A cross-entropy in nats per character, in bits per character."""
    return nats / math.log(2)


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The vocabulary (sorted distinct characters) and the train / validation character ids (uint8)."""

    vocab: str
    train: np.ndarray
    val: np.ndarray

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, s: str) -> np.ndarray:
        """int32 ids of the characters of s; ValueError naming any character outside the vocabulary."""
        if not isinstance(s, str):
            raise TypeError(f"s must be a str, got {V.describe(s)}")
        index = {c: i for i, c in enumerate(self.vocab)}
        bad = sorted(set(s) - set(index))
        if bad:
            raise ValueError(f"s holds characters outside the corpus vocabulary: {''.join(bad)!r}")
        return np.fromiter((index[c] for c in s), np.int32, len(s))

    def decode(self, ids) -> str:
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or (ids.size and not (0 <= ids.min() <= ids.max()
                                                                              < self.vocab_size)):
            raise ValueError(f"ids must be a 1-D array of integers in [0, {self.vocab_size}), got "
                             f"{V.describe(ids)}")
        return "".join(self.vocab[i] for i in ids)

    def _ids(self, split: str) -> np.ndarray:
        V.choice("split", split, SPLITS)
        return self.train if split == "train" else self.val

    def windows(self, split: str, starts, context: int):
        """(ids (n, context) int32, targets (n,) int32) of the windows starting at `starts`."""
        ids = self._ids(split)
        starts = np.asarray(starts, np.int64)
        cols = starts[:, None] + np.arange(context)
        return ids[cols].astype(np.int32), ids[starts + context].astype(np.int32)

    def batch(self, rng: np.random.Generator, split: str, batch: int, context: int):
        """`batch` windows at random positions of the split: (ids (batch, context) int32, targets (batch,))."""
        batch = V.positive_int("batch", batch)
        context = V.positive_int("context", context)
        n = len(self._ids(split)) - context
        if n <= 0:
            raise ValueError(f"context must be shorter than the {split} split ({n + context} characters), "
                             f"got {context}")
        return self.windows(split, rng.integers(0, n, batch), context)

    def eval_windows(self, split: str, count: int, context: int):
        """`count` windows evenly spaced over the split: the same every call, so losses compare across runs."""
        count = V.positive_int("count", count)
        context = V.positive_int("context", context)
        n = len(self._ids(split)) - context
        return self.windows(split, np.linspace(0, n - 1, count).astype(np.int64), context)


@functools.lru_cache(maxsize=1)
def unigram_entropy() -> float:
    """The entropy of the training split's character frequencies, in nats per character: the loss of a model that
    knows how often each character occurs and nothing of the context (text sampled from it looks like noise)."""
    c = load()
    p = np.bincount(c.train, minlength=c.vocab_size) / len(c.train)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


@functools.lru_cache(maxsize=1)
def load() -> Corpus:
    """Tiny Shakespeare, split 90 / 10 (cached)."""
    t = text()
    vocab = "".join(sorted(set(t)))
    table = np.zeros(0x110000 if max(map(ord, vocab)) > 255 else 256, np.uint8)
    table[[ord(c) for c in vocab]] = np.arange(len(vocab), dtype=np.uint8)
    ids = table[np.frombuffer(t.encode("utf-32-le"), np.uint32)]
    cut = int(len(ids) * (1 - VAL_FRACTION))
    return Corpus(vocab, ids[:cut], ids[cut:])
