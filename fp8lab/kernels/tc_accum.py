"""The FP8 tensor-core accumulator, measured: D = C + A @ B.T for one 32-wide slice of K, one instruction per tile.

A (R, 32) and B (8, 32) are FP8 codes (B given as its transpose, the "col" layout of mma), C and D (R, 8) float32.
Crafted inputs (`probes`) then show what the hardware does inside one instruction: how many mantissa bits the sum keeps,
whether it rounds or truncates, and how products of different sizes are aligned, compared with fp8lab.numerics.accum's
model (`model_matches`). Under the simulator the twins compute FP32 sums in k order (`reference`).

version 1: mma.sync m16n8k32, one warp per 16 rows, fragments packed from global memory by each lane.
version 2: wgmma m64n8k32, one warpgroup per 64 rows, A and B staged in 128-byte-swizzled shared memory and read
           through descriptors.
"""

from __future__ import annotations

import json

import numpy as np

from .. import _validate as V
from ..numerics import accum, formats, spec
from .. import bench
from ..device import ptx, runtime
from ..device.runtime import cuda
from .versions import Version, check_device

_U8 = runtime.numba_type("uint8")
_SMEM2 = 64 * 128 + 8 * 128 + 1024  # A and B tiles (128-byte rows) + alignment slack
LAUNCH = {1: dict(rows=16, threads=32, smem=0), 2: dict(rows=64, threads=128, smem=_SMEM2)}
"""Per version: rows of A per instruction (a block each), threads per block, dynamic shared memory (bytes)."""


@cuda.jit(device=True)
def _pack4(x, r, k):
    """x[r, k:k+4] as one uint32, x[r, k] in the low byte (the fragment order of mma)."""
    return (np.uint32(x[r, k]) | (np.uint32(x[r, k + 1]) << np.uint32(8)) | (np.uint32(x[r, k + 2]) << np.uint32(16))
            | (np.uint32(x[r, k + 3]) << np.uint32(24)))


def make_kernel1(fmt_a: str, fmt_b: str):
    mma = ptx.mma_m16n8k32(fmt_a, fmt_b)

    @cuda.jit
    def mma_probe_kernel(a, b, c, d):
        """Block 32 threads, grid R / 16: lane (g, t) = (lane // 4, lane % 4) packs its fragments (PTX ISA,
        "Matrix Fragments for mma.m16n8k32") and receives D at rows g, g + 8, columns 2t, 2t + 1."""
        lane = cuda.threadIdx.x
        g, t = lane // 4, lane % 4
        r = cuda.blockIdx.x * 16 + g
        d0, d1, d2, d3 = mma(_pack4(a, r, 4 * t), _pack4(a, r + 8, 4 * t), _pack4(a, r, 16 + 4 * t),
                             _pack4(a, r + 8, 16 + 4 * t), _pack4(b, g, 4 * t), _pack4(b, g, 16 + 4 * t),
                             c[r, 2 * t], c[r, 2 * t + 1], c[r + 8, 2 * t], c[r + 8, 2 * t + 1])
        d[r, 2 * t] = d0
        d[r, 2 * t + 1] = d1
        d[r + 8, 2 * t] = d2
        d[r + 8, 2 * t + 1] = d3

    return mma_probe_kernel


def make_kernel2(fmt_a: str, fmt_b: str):
    wgmma = ptx.wgmma_m64k32(8, fmt_a, fmt_b)
    fence = ptx.wgmma_fence(4)
    wait = ptx.wgmma_wait_group(0, 4)

    @cuda.jit
    def wgmma_probe_kernel(a, b, c, d):
        """Block 128 threads (one warpgroup), grid R / 64: A (64 x 32) and B (8 x 32) stored K-major with the 128-byte
        swizzle, then one wgmma m64n8k32 with scale-d = 1 (D = C + A B); thread t holds D as wgmma_d_layout(8)."""
        smem = cuda.shared.array(0, _U8)
        acc = cuda.local.array(4, np.float32)
        tid = cuda.threadIdx.x
        r0 = cuda.blockIdx.x * 64
        base = ptx.shared_address(smem)
        pad = (1024 - base % 1024) % 1024
        for idx in range(tid, 64 * 32, 128):
            r, k = idx // 32, idx % 32
            smem[pad + ptx.swizzle_128b(r * 128 + k)] = a[r0 + r, k]
        for idx in range(tid, 8 * 32, 128):
            r, k = idx // 32, idx % 32
            smem[pad + 64 * 128 + ptx.swizzle_128b(r * 128 + k)] = b[r, k]
        ptx.fence_proxy_async()  # the stores above, visible to wgmma's async proxy
        cuda.syncthreads()
        w, lane = tid // 32, tid % 32
        row = r0 + 16 * w + lane // 4
        col = 2 * (lane % 4)
        acc[0] = c[row, col]
        acc[1] = c[row, col + 1]
        acc[2] = c[row + 8, col]
        acc[3] = c[row + 8, col + 1]
        desc_a = ptx.smem_descriptor(base + pad, 16, 1024, 1)
        desc_b = ptx.smem_descriptor(base + pad + 64 * 128, 16, 1024, 1)
        fence(acc)
        wgmma(acc, smem, desc_a, desc_b, 1)
        ptx.wgmma_commit_group()
        wait(acc)
        d[row, col] = acc[0]
        d[row, col + 1] = acc[1]
        d[row + 8, col] = acc[2]
        d[row + 8, col + 1] = acc[3]

    return wgmma_probe_kernel


VERSIONS = {  # kernel: the function that builds the probe kernel for (fmt_a, fmt_b)
    1: Version("mma.sync m16n8k32 (one warp, 16 rows)", make_kernel1, needs=ptx.MMA_FP8, traits={"tensor_cores"}),
    2: Version("wgmma m64n8k32 (one warpgroup, 64 rows)", make_kernel2, needs=ptx.WGMMA, traits={"tensor_cores"}),
}
BEST = 2


def kernel(version: int, fmt_a: str = "e4m3", fmt_b: str = "e4m3"):
    """The probe kernel of `version` for these formats, built once (runtime.cached)."""
    make = VERSIONS[version].kernel
    return runtime.cached((f"tc_accum.v{version}", fmt_a, fmt_b), lambda: make(fmt_a, fmt_b))


def _check(a_codes, b_codes, c, version):
    version = V.version("version", version, VERSIONS, default=BEST)
    a = V.array("a_codes", a_codes, dtype=np.uint8, ndim=2)
    b = V.array("b_codes", b_codes, dtype=np.uint8, shape=(8, 32))
    rows = LAUNCH[version]["rows"]
    if a.shape[1] != 32 or a.shape[0] % rows:
        raise ValueError(f"a_codes must have shape (R, 32) with R a multiple of {rows} (version {version}), "
                         f"got {a.shape}")
    c = V.array("c", c, dtype=np.float32, shape=(a.shape[0], 8))
    return a, b, c, version


def probe(a_codes, b_codes, c, version=None, fmt_a: str = "e4m3", fmt_b: str = "e4m3") -> np.ndarray:
    """D (R, 8) float32 = C + decode(a) @ decode(b).T, each 16 (version 1) or 64 (version 2) rows by one tensor-core
    instruction. a_codes (R, 32) uint8, b_codes (8, 32) uint8, c (R, 8) float32 (NumPy arrays)."""
    a, b, c, version = _check(a_codes, b_codes, c, version)
    check_device(VERSIONS, version)
    fmt_a, fmt_b = spec.fmt_name(fmt_a, "fmt_a"), spec.fmt_name(fmt_b, "fmt_b")
    d = bench.poisoned(c.shape, np.float32)
    args = (cuda.to_device(np.ascontiguousarray(a)), cuda.to_device(np.ascontiguousarray(b)),
            cuda.to_device(np.ascontiguousarray(c)), d)
    geometry = LAUNCH[version]
    runtime.launch_with_shared(kernel(version, fmt_a, fmt_b), a.shape[0] // geometry["rows"], geometry["threads"],
                               geometry["smem"], *args)
    return d.copy_to_host()


def reference(a_codes, b_codes, c, fmt_a: str = "e4m3", fmt_b: str = "e4m3") -> np.ndarray:
    """What the twins compute: C + the products in k order, each sum rounded to float32 (exact products)."""
    return ptx.mma_m16n8k32_reference(a_codes, b_codes, c, fmt_a, fmt_b)  # row by row, any number of rows


def exact(a_codes, b_codes, c, fmt_a: str = "e4m3", fmt_b: str = "e4m3") -> np.ndarray:
    """float64 C + A @ B.T (exact for E4M3 operands and float32 C of moderate range)."""
    A = formats.decode(np.asarray(a_codes, np.uint8), fmt_a).astype(np.float64)
    B = formats.decode(np.asarray(b_codes, np.uint8), fmt_b).astype(np.float64)
    return np.asarray(c, np.float64) + A @ B.T


def model(a_codes, b_codes, c, bits: int, fmt_a: str = "e4m3", fmt_b: str = "e4m3") -> np.ndarray:
    """fp8lab.numerics.accum's limited accumulator for one group of 32 products: C and the products aligned to the
    largest exponent, truncated to `bits` mantissa bits, added exactly, the sum truncated (float32 result)."""
    A = formats.decode(np.asarray(a_codes, np.uint8), fmt_a).astype(np.float64)
    B = formats.decode(np.asarray(b_codes, np.uint8), fmt_b).astype(np.float64)
    p = A[:, None, :] * B[None, :, :]  # (R, 8, 32)
    return accum.limited_step(np.asarray(c, np.float64), p, bits).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Crafted inputs
# ----------------------------------------------------------------------------------------------------------------

ONE = int(formats.encode(np.float32(1.0)))  # E4M3 code of 1.0 (0x38)


def _code(x) -> int:
    return int(formats.encode(np.float32(x)))


def probes(rng, rows: int = 64 * 24) -> dict:
    """Families of inputs (B = 1 except in "random", so D[i, j] = C[i, j] + sum_k A[i, k]), R rows each, multiple of 64:
    "shift": one product p at k = 0 next to C = 2^s (s = 0..31 over the columns and rows): which bits of p survive,
    and is the cut a truncation or a rounding; "spread": C = 0, one large product 2^8 at k = kb and n small ones
    (2^8 / 2^gap) elsewhere: are small products aligned to the largest of the 32 before they are added;
    "random": N(0, 1)-like and uniform positive codes with C = 0 and C random: error statistics."""
    out = {}
    b = np.full((8, 32), ONE, np.uint8)
    # shift: row i: p = value, C[i, j] = sign * 2^(s) with s = 4 * (i % 8) + j / 2 ... one s per column
    vals = [1.0, 1.125, 1.25, 1.5, 1.75, 1.875, -1.0, -1.5, 0.5, 0.75]
    a = np.zeros((rows, 32), np.uint8)
    c = np.zeros((rows, 8), np.float32)
    for i in range(rows):
        v = vals[i % len(vals)]
        a[i, 0] = _code(v)
        shifts = (i // len(vals)) % 4 * 8 + np.arange(8)  # 0..31
        c[i] = np.float32(2.0) ** shifts.astype(np.float32)
    out["shift"] = (a, b, c)
    # spread: one big product (2^8) at kb, n small ones of 2^(8 - gap) at other positions, C = 0 or 2^8 at j odd
    a = np.zeros((rows, 32), np.uint8)
    c = np.zeros((rows, 8), np.float32)
    for i in range(rows):
        gap = 10 + i % 8  # 2^8 / 2^gap: 2^-2 .. 2^-9 (E4M3 subnormals at the low end)
        kb = int(rng.integers(0, 32))
        n = int(rng.integers(1, 32))
        others = rng.permutation([k for k in range(32) if k != kb])[:n]
        a[i, kb] = _code(256.0)
        a[i, others] = _code(2.0 ** (8 - gap))
        c[i, 1::2] = np.float32(2.0 ** int(rng.integers(-4, 10)))
    out["spread"] = (a, b, c)
    # random: E4M3 codes of N(0, 1) * 448 / 4 and of U[0, 1) * 448, C = 0 (columns 0-3) or N(0, 1) * 2^10
    top = float(spec.FP8_MAX["e4m3"])
    x = rng.standard_normal((rows // 2, 32)) * (top / 4)
    y = rng.random((rows - rows // 2, 32)) * top
    a = formats.encode(np.concatenate([x, y]).astype(np.float32))
    c = np.zeros((rows, 8), np.float32)
    c[:, 4:] = (rng.standard_normal((rows, 4)) * 1024).astype(np.float32)
    b = formats.encode((rng.random((8, 32)) * 2).astype(np.float32))  # B varied too
    out["random"] = (a, b, c)
    return out


def model_matches(a, b, c, d, bits_range=range(10, 24)) -> dict:
    """For each candidate: the fraction of outputs d equals bit for bit. Candidates: "fp32" (k-order FP32 sums),
    f"model{bits}" (fp8lab.numerics.accum with that many mantissa bits), and "round-exact" (the float64 sum rounded once
    to float32)."""
    d = np.asarray(d, np.float32)
    res = {"fp32": float(np.mean(reference(a, b, c) == d)),
           "round-exact": float(np.mean(exact(a, b, c).astype(np.float32) == d))}
    for bits in bits_range:
        res[f"model{bits}"] = float(np.mean(model(a, b, c, bits) == d))
    return res


def shift_table(a, c, d) -> list:
    """For the "shift" family: per product value and C = 2^s, what was added (d - C) against the product."""
    rows = []
    A = formats.decode(a[:, 0]).astype(np.float64)
    for v in sorted(set(A.tolist())):
        sel = A == v
        added = (d[sel].astype(np.float64) - c[sel].astype(np.float64))
        s = np.log2(c[sel]).round().astype(int)
        lost = sorted(set(s[added == 0].tolist()))
        rows.append({"product": v, "first_shift_lost": lost[0] if lost else None,
                     "added_by_shift": {int(k): float(added[s == k][0]) for k in sorted(set(s.ravel().tolist()))}})
    return rows


# ----------------------------------------------------------------------------------------------------------------
# python -m fp8lab.kernels.tc_accum
# ----------------------------------------------------------------------------------------------------------------


def checks(rng, only=None) -> list:
    """Both versions (those in `only`: bench.selected) on the crafted families (and fresh random ones): under the
    simulator bit for bit against `reference` (the twins' FP32 k order); on a GPU within the 13-bit model's bound
    of float64."""
    out = []
    fam = probes(rng, 64 if runtime.IS_SIM else 64 * 8)
    for name, (a, b, c) in fam.items():
        ex = exact(a, b, c)
        for v in (v for v in VERSIONS if bench.selected(only, v)):
            d = probe(a, b, c, version=v)
            if np.isnan(d).any():
                raise AssertionError(f"v{v} {name}: NaN in the output (an element was not written)")
            if runtime.IS_SIM:
                ref = reference(a, b, c)
                if not np.array_equal(d, ref):
                    raise AssertionError(f"v{v} {name}: twin differs from the k-order FP32 reference")
                how = "bit-exact (twin)"
            else:
                A = np.abs(formats.decode(a).astype(np.float64))
                scale = np.abs(c).astype(np.float64) + A @ np.abs(formats.decode(b).astype(np.float64)).T
                err = np.abs(d - ex)
                # a limited accumulator of >= 13 bits truncates each of 33 terms by < 2^-12 of the largest
                if not (err <= 2.0**-7 * scale + 1e-30).all():
                    raise AssertionError(f"v{v} {name}: error {err.max():.3g} beyond 2^-7 of sum |terms|")
                how = "within 2^-7 of sum |terms| (float64)"
            out.append((f"v{v} {VERSIONS[v]}: {name} ({a.shape[0]} rows)", how))
    return out


def record(rng, versions=None) -> dict:
    """Everything measured here, JSON-ready: per family and version (of `versions`; None: all), the candidates'
    match fractions; the shift table; the raw inputs and outputs of the "spread" family."""
    data = {"device": runtime.device_info().get("name", "?"), "families": {}}
    for name, (a, b, c) in probes(rng).items():
        fam = data["families"][name] = {}
        for v in (VERSIONS if versions is None else versions):
            d = probe(a, b, c, version=v)
            fam[f"v{v}"] = {"matches": model_matches(a, b, c, d)}
            if name == "shift":
                fam[f"v{v}"]["table"] = shift_table(a, c, d)
            fam[f"v{v}"]["d"] = d.tolist()
        fam["a"], fam["b"], fam["c"] = a.tolist(), b.tolist(), c.tolist()
    return data


OPTIONS = {"--record": dict(metavar="FILE", help="write the measurements (and the raw probes) as JSON to FILE")}


def timings(rng, args) -> list:
    """The accumulator experiment on the GPU: which model each instruction (of the versions in args.only) matches on
    each family."""
    versions = [v for v in VERSIONS if bench.selected(getattr(args, "only", None), v)]
    data = record(rng, versions)
    if getattr(args, "record", None):
        with open(args.record, "w") as f:
            json.dump(data, f)
    cands = list(next(iter(data["families"].values()))[f"v{versions[0]}"]["matches"])
    cells = [[f"{name}, v{v}"] + [f"{fam[f'v{v}']['matches'][k]:.3f}" for k in cands]
             for name, fam in data["families"].items() for v in versions]
    tables = [bench.Table("Fraction of outputs equal bit for bit to each candidate (fp32 = k-order FP32 sums, "
                          "modelN = fp8lab.numerics.accum with N mantissa bits)", None, header=["family"] + cands,
                          cells=cells)]
    for v in versions:
        tab = data["families"]["shift"][f"v{v}"]["table"]
        tables.append(bench.Table(f"v{v}: C = 2^s plus one product p: the first s at which p is lost", None,
                                  header=["p", "first s lost"], cells=[[r["product"], r["first_shift_lost"]]
                                                                       for r in tab]))
    return tables


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
