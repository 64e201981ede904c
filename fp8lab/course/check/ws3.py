"""ws3: the fused 1x128 tile-quantize kernel, checked bit for bit against fp8lab.numerics.spec.quantize(x, "tile")."""

from __future__ import annotations

import numpy as np

from ... import bench
from ...numerics import formats, spec
from ...device import runtime
from ...device.runtime import cuda
from ._core import fail, launch, question, require_kernel, tie_traps

__all__ = ["QUANT_TILE", "QUANT_WARPS", "E4M3_MAX", "AMAX_FLOOR", "tile_quantize_kernel"]

QUANT_TILE = 128  # elements of one row that share a scale (DeepSeek-V3's 1x128 activation tiles)
QUANT_WARPS = 2 if runtime.IS_SIM else 4  # warps per block, one tile per warp
E4M3_MAX = spec.FP8_MAX["e4m3"]  # np.float32(448.0)
AMAX_FLOOR = spec.AMAX_FLOOR  # np.float32(1e-12): an all-zero tile gets a finite scale, not 0 / 0
CODE_POISON = 0xFF  # E4M3 -NaN: no finite input encodes to it (saturation), so an unwritten code cannot pass


def _tile_quantize_cases(rng):
    """(name, x): float32 inputs with outliers, a partial last tile, an all-zero tile, a tile whose amax is
    below AMAX_FLOOR, a tile narrower than a warp, and values placed on E4M3 rounding ties."""
    T = QUANT_TILE
    f = np.float32
    out = []
    M, K = (3, 2 * T + 44) if runtime.IS_SIM else (512, 56 * T + 77)
    x = rng.standard_normal((M, K)) * np.exp2(rng.uniform(-6, 6, (M, 1)))  # rows of different magnitudes
    x = x.astype(np.float32)
    spikes = rng.random((M, K)) < 0.02
    x[spikes] *= rng.uniform(20, 100, int(spikes.sum())).astype(np.float32)  # outliers, like LLM activations
    j = int(rng.integers(T))
    x[0, j] = -1.5 * np.abs(x[0, :T]).max()  # tile (0, 0)'s largest magnitude is negative
    x[1, T:2 * T] = 0  # an all-zero tile, with some -0.0 (code 0x80)
    x[1, T:2 * T:3] = -0.0
    tile = x[2, :T]  # a view: values on rounding ties, where x / scale and x * inv disagree
    top = int(np.argmax(np.abs(tile)))
    for _ in range(100):  # for ~1 amax in 10, inv == 1 / scale so closely that no tie separates them: nudge it
        amax = np.abs(tile[top])
        traps = tie_traps(amax, rng, 12)
        if len(traps) >= 4:
            break
        tile[top] *= f(rng.uniform(1.01, 1.1))
    where = rng.permutation(np.flatnonzero(np.abs(tile) < amax))[:len(traps)]
    tile[where] = traps[:len(where)]
    n_full = K // T
    out.append((f"x ({M}, {K}): {n_full} full tiles per row and a partial one of {K - n_full * T} columns; "
                f"outliers; tile (1, 1) all zeros", x))
    K2 = 20  # narrower than a warp: lanes 20..31 have no element
    x = (rng.standard_normal((3, K2)) * 4).astype(np.float32)
    x[1] *= f(1e-14)  # 0 < amax < AMAX_FLOOR: the floor applies here too
    x[2, int(rng.integers(K2))] = -600  # an amax above 448: that element encodes to exactly -448 (0xFE)
    out.append((f"x (3, {K2}): one tile per row, narrower than a warp; row 1's amax below AMAX_FLOOR", x))
    return out


@question
def tile_quantize_kernel(kernel, rng=None):
    """Check a kernel `(x, codes, scale)`: x float32 (M, K) -> codes uint8 (M, K), E4M3 codes, and scale float32
    (M, ceil(K / QUANT_TILE)), one scale per 1 x QUANT_TILE tile of a row; bit-exact with
    `fp8lab.numerics.spec.quantize(x, "tile")`. Launch: blocks of QUANT_WARPS * 32 threads, grid
    ceil(M * ceil(K / QUANT_TILE) / QUANT_WARPS) blocks; warp w = cuda.grid(1) // 32 takes tile
    (w // ntk, w % ntk) with ntk = scale.shape[1]; warps past the last tile do nothing."""
    q = "tile_quantize_kernel"
    require_kernel(q, kernel)
    rng = np.random.default_rng() if rng is None else rng
    T = QUANT_TILE
    threads = QUANT_WARPS * runtime.WARP_SIZE
    for name, x in _tile_quantize_cases(rng):
        M, K = x.shape
        ntk = -(-K // T)
        codes = cuda.to_device(np.full((M, K), CODE_POISON, np.uint8))
        scale = bench.poisoned((M, ntk), np.float32)
        blocks = -(-(M * ntk) // QUANT_WARPS)
        launch(q, name, kernel, (blocks, threads), cuda.to_device(x), codes, scale)
        got_c, got_s = codes.copy_to_host(), scale.copy_to_host()
        ref_c, ref_s, _ = spec.quantize(x, "tile", "e4m3", T, "amax")
        bad_c = np.zeros((M, ntk * T), bool)
        bad_c[:, :K] = got_c != ref_c
        bad_tile = (got_s != ref_s) | bad_c.reshape(M, ntk, T).any(axis=2)  # NaN != anything
        if bad_tile.any():
            r, t = (int(i) for i in np.argwhere(bad_tile)[0])
            c0, c1 = t * T, min(t * T + T, K)
            xs = x[r, c0:c1]
            lines = [f"case {name}:",
                     f"  {int(bad_tile.sum())} of {bad_tile.size} tiles are wrong; the first is tile ({r}, {t}) = "
                     f"x[{r}, {c0}:{c1}] ({c1 - c0} elements, amax {float(np.abs(xs).max())!r})"]
            if got_s[r, t] != ref_s[r, t]:
                lines.append(f"  scale[{r}, {t}]: got {float(got_s[r, t])!r}, expected {float(ref_s[r, t])!r}")
            wrong = np.flatnonzero(got_c[r, c0:c1] != ref_c[r, c0:c1])
            if len(wrong):
                lines.append(f"  {len(wrong)} of {c1 - c0} codes of the tile are wrong, e.g.")
            for i in wrong[:3]:
                g, e = int(got_c[r, c0 + i]), int(ref_c[r, c0 + i])
                lines.append(f"    codes[{r}, {c0 + i}] for x = {float(xs[i])!r}: got 0x{g:02X} "
                             f"({formats.describe_code(g)}), expected 0x{e:02X} ({formats.describe_code(e)})")
            fail(q, lines, _tile_quantize_hint(xs, got_s[r, t], ref_s[r, t], got_c[r, c0:c1], ref_c[r, c0:c1]))
    return (f"codes and scales are bit-exact with spec.quantize(x, 'tile') (outliers, a partial tile, "
            f"an all-zero tile, amax below AMAX_FLOOR, a tile narrower than a warp, rounding ties)")


def _tile_quantize_hint(xs, got_s, ref_s, got_c, ref_c) -> str:
    f = np.float32
    amax = f(np.abs(xs).max())
    poisoned = got_c == CODE_POISON
    if np.isnan(got_s) and poisoned.all():
        return ("this tile was never processed (its scale and codes still hold the poison): warp w = "
                "cuda.grid(1) // 32 (counting warps over the whole grid, not blocks) takes tile "
                "(w // ntk, w % ntk), with ntk = scale.shape[1] tiles per row")
    if amax <= AMAX_FLOOR and not np.isnan(got_s):
        return (f"this tile's amax is {float(amax)!r}, at most AMAX_FLOOR: floor it first, safe = amax if amax > "
                "AMAX_FLOOR else AMAX_FLOOR (for an all-zero tile 448 / 0 is Inf and 0 * Inf is NaN), then "
                "scale = safe / E4M3_MAX and inv = E4M3_MAX / safe")
    if poisoned.any():
        cols = np.flatnonzero(poisoned)
        return (f"{len(cols)} codes of this tile are 0xFF, the poison (never written?), first at column "
                f"{int(cols[0])} of the tile: lane l writes columns k0 + l + 32 * j for j = 0..3, wherever "
                f"the column is < K")
    if np.isnan(got_s):
        return "scale[r, t] was never written: one lane (lane 0) of the warp stores scale = safe / E4M3_MAX"
    if got_s != ref_s:
        signed = f(np.max(xs))
        if got_s == f(E4M3_MAX / amax):
            return ("you stored 448 / amax: scale is the DEQUANTIZATION factor, scale = amax / E4M3_MAX "
                    "(x ~= decode(code) * scale); the codes use its inverse, inv = E4M3_MAX / amax")
        if signed != amax and got_s == f(signed / E4M3_MAX):
            return ("amax is the largest |x|: take abs() of each element before the max "
                    "(this tile's extreme is negative)")
        if got_s < ref_s:
            return ("scale too small: the amax missed elements. Each lane covers columns k0 + lane + 32 * j for "
                    "j = 0..3, and the warp max takes all 5 shuffle steps (offsets 16, 8, 4, 2, 1)")
        return "scale = max(|x| over the tile's columns) / E4M3_MAX, in float32; a tile is 128 columns of one row"
    bad = got_c != ref_c
    xb = xs[bad]
    with np.errstate(over="ignore", invalid="ignore"):
        by_div = formats.encode((xb / f(ref_s)).astype(np.float32), formats.E4M3)
    if np.array_equal(got_c[bad], by_div):
        return ("the scale is right but these codes sit on E4M3 rounding ties: multiply by inv = E4M3_MAX / safe "
                "(computed once per tile, as the package does), not divide by scale. In float32, x / scale and "
                "x * inv can round differently, and on a tie that changes the code")
    got_v = np.abs(formats.decode(got_c[bad], formats.E4M3))
    ref_v = np.abs(formats.decode(ref_c[bad], formats.E4M3))
    if (got_v >= ref_v).all():
        return ("the scale is right but these codes are too large: some lanes scaled by a smaller amax than the "
                "tile's. After the warp max EVERY lane must hold the tile's amax: shfl_xor_sync with offsets "
                "16, 8, 4, 2, 1 (a butterfly) gives it to every lane; shfl_down_sync leaves it in lane 0 only")
    return ("codes[r, c] = encode_e4m3_sat(x[r, c] * inv), inv = E4M3_MAX / safe in float32 (use the np.float32 "
            "constants: on a GPU, 448.0 / amax is computed in float64)")
