"""Worksheet checks ws9 (the single-tile wgmma GEMM): right answers pass, wrong answers are rejected with the hint of
their mistake, placeholders are "not attempted". The kernels are the library's editable copy of
fp8lab.kernels.wgmma_tile.wgmma_tile_kernel (the worksheet's answer) and that copy with one mistake each; under the
simulator the wgmma twin runs them (small shapes)."""

from __future__ import annotations

import json

import pytest

from fp8lab.course import check
from fp8lab.course.notebook import editable_source
from fp8lab.device import ptx
from fp8lab.device.runtime import cuda

SOURCE = editable_source("fp8lab.kernels.wgmma_tile.wgmma_tile_kernel")


def kernel_with(old: str = "", new: str = ""):
    """The library's kernel compiled from its editable copy, with `old` replaced by `new` (which must occur)."""
    assert old in SOURCE, old
    ns: dict = {}
    exec(compile(SOURCE.replace(old, new) if old else SOURCE, "<ws9 answer>", "exec"), ns)
    return ns["wgmma_tile_kernel"]


# --------------------------------------------------------------------------------------------- swizzled_offset

def test_swizzled_offset_right_answer_passes(capsys):
    check.swizzled_offset(lambda r, k: int(ptx.swizzle_128b_np(r * 128 + k)))
    assert "passed: swizzled_offset" in capsys.readouterr().out


@pytest.mark.parametrize("fn, says", [
    (lambda r, k: r * 128 + k, "plain layout"),
    (lambda r, k: r * 128 + ((k // 16) ^ r) * 16 + k % 16, "r % 8, not with r"),
    (lambda r, k: r * 128 + (k ^ (r % 8)), "not the byte"),
    (lambda r, k: ((k // 16) ^ (r % 8)) * 16 + k % 16, "row stays at r * 128"),
])
def test_swizzled_offset_wrong_answers_get_their_hint(fn, says):
    with pytest.raises(check.CheckFailed, match="swizzled_offset") as e:
        check.swizzled_offset(fn)
    assert says in str(e.value)


def test_swizzled_offset_placeholder_is_not_attempted():
    def swizzled_offset(r, k):
        raise NotImplementedError("your answer goes here: replace this line")

    with pytest.raises(check.NotAttempted, match="not attempted yet"):
        check.swizzled_offset(swizzled_offset)


# ------------------------------------------------------------------------------------------- wgmma_tile_kernel

def test_kernel_right_answer_passes(rng, capsys):
    check.wgmma_tile_kernel(kernel_with(), rng=rng)
    assert "passed: wgmma_tile_kernel" in capsys.readouterr().out


@pytest.mark.parametrize("old, new, says", [
    ("total[o] = total[o] * s", "total[o] = total[o]", "unscaled"),
    ("desc_a + 2 * kk, desc_b + 2 * kk", "desc_a, desc_b", "first 32 codes"),
    ("desc_b + 2 * kk, kk)", "desc_b + 2 * kk, k0 + kk)", "scale-d = 0"),
    ("for k0 in range(0, K, TILE_K):", "for k0 in range(0, K - K % TILE_K, TILE_K):", "partial K-group"),
    ("smem[pad + ptx.swizzle_128b(i)] = v", "smem[pad + i] = v", "swizzle_128b(r * 128 + k)"),
    ("store_tile(c, total, row0, n0, tid % 4, M, N)", "pass", "NaN poison"),
])
def test_kernel_wrong_answers_get_their_hint(rng, old, new, says):
    with pytest.raises(check.CheckFailed, match="wgmma_tile_kernel") as e:
        check.wgmma_tile_kernel(kernel_with(old, new), rng=rng)
    assert says in str(e.value), str(e.value)


def test_kernel_without_wgmma_is_refused(rng):
    @cuda.jit
    def simt_kernel(a, sa, b, sb, c):
        m, n = cuda.grid(2)
        if m < c.shape[0] and n < c.shape[1]:
            c[m, n] = 0.0

    with pytest.raises(check.CheckFailed, match="issues no wgmma"):
        check.wgmma_tile_kernel(simt_kernel, rng=rng)


def test_kernel_placeholder_is_not_attempted(rng):
    @cuda.jit
    def wgmma_tile_kernel(a, sa, b, sb, c):
        raise NotImplementedError("your answer goes here: replace this line")

    with pytest.raises(check.NotAttempted, match="not attempted yet"):
        check.wgmma_tile_kernel(wgmma_tile_kernel, rng=rng)


def test_kernel_not_a_kernel_is_refused():
    with pytest.raises(check.CheckFailed, match="expected a kernel made with @cuda.jit"):
        check.wgmma_tile_kernel(lambda a, sa, b, sb, c: None)


def test_outcomes_are_recorded(tmp_path, monkeypatch, rng, capsys):
    report = tmp_path / "report.jsonl"
    monkeypatch.setenv(check.REPORT_ENV, str(report))
    check.swizzled_offset(lambda r, k: int(ptx.swizzle_128b_np(r * 128 + k)))
    with pytest.raises(check.CheckFailed):
        check.swizzled_offset(lambda r, k: r * 128 + k)
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(r["check"], r["status"]) for r in rows] == [("swizzled_offset", "passed"), ("swizzled_offset", "failed")]
