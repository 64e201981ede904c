"""ws9: a single-tile wgmma GEMM (lecture 07 (e)): where the 128-byte swizzle puts a byte, and the kernel itself,
checked bit for bit against fp8lab.kernels.wgmma_tile's reference under the simulator (within its error bound on a
GPU), with a diagnosis of the usual mistakes."""

from __future__ import annotations

import inspect

import numpy as np

from ... import bench
from ...device import ptx, runtime
from ...device.runtime import cuda
from ...kernels import wgmma_tile
from ...numerics import formats
from ._core import NotAttempted, call_answer, fail, launch, not_attempted_message, question, require_kernel, \
    still_a_placeholder

__all__ = ["WGMMA_TILE_M", "WGMMA_TILE_N", "WGMMA_THREADS", "WGMMA_SMEM", "swizzled_offset", "wgmma_tile_kernel"]

WGMMA_TILE_M, WGMMA_TILE_N, WGMMA_THREADS = wgmma_tile.TILE_M, wgmma_tile.TILE_N, wgmma_tile.THREADS
WGMMA_SMEM = wgmma_tile.SMEM  # dynamic shared memory per block: a's tile, b's tile, 1024 bytes of alignment slack


@question
def swizzled_offset(fn, rng=None):
    """Check `fn(r, k) -> int`: the byte offset at which a tile of 128-byte rows stored with the 128-byte swizzle
    holds byte k (0..127) of row r (0..127): the 16-byte chunk k // 16 moves to chunk (k // 16) ^ (r % 8) (PTX ISA,
    "Shared Memory Matrix Layout")."""
    q = "swizzled_offset"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    for r in range(128):
        for k in range(128):
            got = call_answer(q, fn, (r, k), "fn(r, k) takes two ints and returns one int")
            want = int(ptx.swizzle_128b_np(r * 128 + k))
            if got != want:
                if got == r * 128 + k:
                    hint = "that is the plain layout: the swizzle moves the 16-byte chunk k // 16 to (k // 16) ^ (r % 8)"
                elif got == r * 128 + ((k // 16) ^ r) * 16 + k % 16:
                    hint = "the pattern repeats every 8 rows (1024 bytes): XOR the chunk with r % 8, not with r"
                elif got == r * 128 + (k ^ (r % 8)):
                    hint = "XOR the 16-byte chunk index, not the byte: chunk (k // 16) ^ (r % 8), then k % 16 inside it"
                else:
                    hint = "the row stays at r * 128; only the 16-byte chunk moves, to (k // 16) ^ (r % 8)"
                fail(q, [f"row {r}, byte {k}: got {got!r}, expected {want}"], hint)
    return "every byte of 128 rows where the 128-byte swizzle stores it (ptx.swizzle_128b_np)"


def _tile_variant(a, sa, b, sb, *, first_slice=False, restart=True, scaled=True, partial_group=True) -> np.ndarray:
    """What a single-tile wgmma kernel computes, float32 in the twin's order, with one of the usual mistakes:
    first_slice (each K-group's four k-slices all read its first 32 codes), not restart (scale-d never 0 after the
    first K-group: each group adds the previous ones again), not scaled (no sa * sb), not partial_group (the last,
    partial K-group left out)."""
    A, B = formats.decode(np.asarray(a, np.uint8)), formats.decode(np.asarray(b, np.uint8))
    K = A.shape[1]
    tk = wgmma_tile.TILE_K
    total = np.zeros((A.shape[0], B.shape[0]), np.float32)
    part = np.zeros_like(total)
    for k0 in range(0, K if partial_group else K - K % tk, tk):
        if restart:
            part = np.zeros_like(total)
        for kk in range(tk // 32):
            for j in range(32):
                k = k0 + (j if first_slice else 32 * kk + j)
                if k < K:
                    part = part + np.outer(A[:, k], B[:, k])
        total = total + part
    if scaled:
        total = total * (np.float32(sa.reshape(-1)[0]) * np.float32(sb.reshape(-1)[0]))
    return total


def _close(got, ref, a, sa, b, sb) -> bool:
    if runtime.IS_SIM:
        return bool(np.array_equal(got, ref))
    return bool((np.abs(got.astype(np.float64) - ref) <= wgmma_tile.error_bound(a, sa, b, sb)).all())


@question
def wgmma_tile_kernel(kernel, rng=None):
    """Check a kernel `(a, sa, b, sb, c)`: c = sa * sb * decode(a) @ decode(b).T, a (M, K) and b (N, K) E4M3 codes,
    sa and sb (1, 1) float32, c (M, N) float32; launched on a grid of (ceil(N / WGMMA_TILE_N), ceil(M / WGMMA_TILE_M))
    blocks of WGMMA_THREADS threads (one warpgroup) with WGMMA_SMEM bytes of dynamic shared memory. It must issue
    wgmma. Under the simulator the result must equal fp8lab.kernels.wgmma_tile.reference bit for bit (the wgmma twin
    adds each K-group in k order); on a GPU it must lie within wgmma_tile.error_bound of float64."""
    q = "wgmma_tile_kernel"
    py = require_kernel(q, kernel)
    rng = np.random.default_rng() if rng is None else rng
    try:
        src = inspect.getsource(py)
    except (OSError, TypeError):
        src = "wgmma("
    if "wgmma(" not in src:
        fail(q, ["the kernel issues no wgmma (no call `wgmma(` in its source)"],
             "this question asks for the tensor-core version: four wgmma(part, smem, desc_a + 2 * kk, desc_b + 2 * kk, "
             "kk) per K-group")
    shapes = [((70, 130, 300), "two tiles each way, a partial last K-group"), ((5, 9, 33), "smaller than one tile")]
    if not runtime.IS_SIM:
        shapes.append(((1000, 777, 1100), "many tiles"))
    for (M, N, K), name in shapes:
        a, sa, b, sb = wgmma_tile.random_operands(rng, M, N, K)
        c = bench.poisoned((M, N), np.float32)
        grid = ((N + WGMMA_TILE_N - 1) // WGMMA_TILE_N, (M + WGMMA_TILE_M - 1) // WGMMA_TILE_M)
        case = f"M={M}, N={N}, K={K} ({name})"
        launch(q, case, kernel, (grid, WGMMA_THREADS, 0, WGMMA_SMEM), cuda.to_device(a), cuda.to_device(sa),
               cuda.to_device(b), cuda.to_device(sb), c)
        got = c.copy_to_host()
        ref = wgmma_tile.reference(a, sa, b, sb)
        if np.isnan(got).any():
            fail(q, [f"case {case}: {int(np.isnan(got).sum())} of {got.size} outputs are still the NaN poison"],
                 "every thread stores its 64 values: store_tile(c, total, row0, n0, tid % 4, M, N) with row0 = m0 + "
                 "16 (tid // 32) + (tid % 32) // 4")
        if _close(got, ref, a, sa, b, sb):
            continue
        n_bad, bad = bench.first_mismatches(got, ref, atol=0, rtol=0, limit=2)
        lines = [f"case {case}: {n_bad} of {got.size} outputs differ from the reference, e.g."]
        lines += [f"  c{list(i)}: got {g!r}, expected {r!r}" for i, g, r in bad]
        diagnoses = [
            (dict(scaled=False), "the product is right but unscaled: multiply by sa[0, 0] * sb[0, 0] before storing"),
            (dict(first_slice=True), "every k-slice read the first 32 codes: slice kk starts 32 bytes further, "
                                     "desc + 2 * kk (addresses are stored >> 4)"),
            (dict(restart=False), "each K-group added the earlier ones again: give the first wgmma of a K-group "
                                  "scale-d = 0 (kk), so that part restarts"),
            (dict(partial_group=False), "the last, partial K-group is missing: loop k0 over range(0, K, TILE_K) and "
                                        "store zeros past K"),
        ]
        hint = ("check the stores into shared memory (byte k of row r at swizzle_128b(r * 128 + k), zeros past the "
                "edges), fence_proxy_async and a barrier before the wgmma, and a barrier before the next K-group "
                "overwrites the tiles")
        for kwargs, why in diagnoses:
            if _close(got, _tile_variant(a, sa, b, sb, **kwargs), a, sa, b, sb):
                hint = why
                break
        fail(q, lines, hint)
    how = "bit for bit with the reference (the wgmma twin)" if runtime.IS_SIM else "within error_bound of float64"
    return f"c = sa sb a b^T {how} on odd shapes (64 x 128 tiles, partial K-groups, NaN-poisoned output)"
