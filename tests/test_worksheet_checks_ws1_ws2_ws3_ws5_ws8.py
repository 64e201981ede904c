"""Worksheet checks ws1, ws2, ws3, ws5 and ws8: right answers pass, wrong answers are rejected with a specific message, placeholders
are "not attempted", outcomes go to the report file. Small shapes: runs on the simulator."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fp8lab.course import check
from fp8lab.numerics import formats
from fp8lab.device import ptx
from fp8lab.kernels.common import encode_e4m3_sat
from fp8lab.device.runtime import FULL_MASK, cuda, shfl_down_sync, shfl_xor_sync


# ----------------------------------------------------------------------------------------------------------------
# Wrong answers: each must be rejected with a specific message
# ----------------------------------------------------------------------------------------------------------------


def encode_ties_away(x):
    """Rounds ties away from zero (int(q + 0.5)): wrong on exact ties."""
    x = float(x)
    if math.isnan(x):
        return 0x7F
    s = 0x80 if math.copysign(1, x) < 0 else 0
    a = min(abs(x), 448.0)
    if a < 2.0**-6:
        return s | int(a * 2**9 + 0.5)
    m, e = math.frexp(a)
    return s | min(((e + 5) << 3) + int(m * 16 + 0.5), 0x7E)


def encode_no_saturation(x):
    """Right everywhere except overflow, where it returns NaN (like ml_dtypes) instead of saturating."""
    from fp8lab.numerics import formats

    return int(formats.encode(np.float32(x), formats.E4M3, saturate=False))


def decode_no_subnormals(code):
    s, e, m = code >> 7, (code >> 3) & 0xF, code & 7
    if e == 0xF and m == 7:
        return math.nan
    v = (1 + m / 8) * 2.0 ** (e - 7)  # forgets that e == 0 means 0.mmm * 2^-6
    return -v if s else v


def decode_unsigned_zero(code):
    s, e, m = code >> 7, (code >> 3) & 0xF, code & 7
    if e == 0xF and m == 7:
        return math.nan
    v = m * 2.0**-9 if e == 0 else (8 + m) * 2.0 ** (e - 10)
    return -v if s and v else v  # 0x80 -> +0.0


THREADS = check.RMSNORM_THREADS
EPS = check.RMSNORM_EPS
TILE = check.GEMM_TILE
QT = check.QUANT_TILE
PER_LANE = QT // 32
E4M3_MAX = check.E4M3_MAX
AMAX_FLOOR = check.AMAX_FLOOR


@cuda.jit
def rmsnorm_without_eps(y, g, z, rstd):
    partial = cuda.shared.array(THREADS, np.float32)
    m = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    N = y.shape[1]
    ss = np.float32(0)
    for n in range(tid, N, cuda.blockDim.x):
        ss += y[m, n] * y[m, n]
    partial[tid] = ss
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            partial[tid] += partial[tid + s]
        cuda.syncthreads()
        s //= 2
    mean = partial[0] / np.float32(N)
    r = np.float32(1) / math.sqrt(mean) if mean > 0 else np.float32(0)
    if tid == 0:
        rstd[m] = r
    for n in range(tid, N, cuda.blockDim.x):
        z[m, n] = y[m, n] * r * g[n]


@cuda.jit
def rmsnorm_one_element_per_thread(y, g, z, rstd):
    partial = cuda.shared.array(THREADS, np.float32)
    m = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    N = y.shape[1]
    v = y[m, tid] if tid < N else np.float32(0)  # assumes N <= blockDim.x
    partial[tid] = v * v
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            partial[tid] += partial[tid + s]
        cuda.syncthreads()
        s //= 2
    r = np.float32(1) / math.sqrt(partial[0] / np.float32(N) + EPS)
    if tid == 0:
        rstd[m] = r
    if tid < N:
        z[m, tid] = v * r * g[tid]


@cuda.jit
def gemm_skips_last_k_tile(a, b, c):
    ta = cuda.shared.array((TILE, TILE), np.float32)
    tb = cuda.shared.array((TILE, TILE), np.float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    m = cuda.blockIdx.y * TILE + ty
    n = cuda.blockIdx.x * TILE + tx
    n_load = cuda.blockIdx.x * TILE + ty
    M, K = a.shape
    N = b.shape[0]
    acc = np.float32(0)
    for k0 in range(0, K - K % TILE, TILE):  # drops the partial tile
        ta[ty, tx] = a[m, k0 + tx] if m < M else np.float32(0)
        tb[ty, tx] = b[n_load, k0 + tx] if n_load < N else np.float32(0)
        cuda.syncthreads()
        for kk in range(TILE):
            acc += ta[ty, kk] * tb[tx, kk]
        cuda.syncthreads()
    if m < M and n < N:
        c[m, n] = acc


@cuda.jit
def gemm_naive(a, b, c):
    n, m = cuda.grid(2)
    if m < c.shape[0] and n < c.shape[1]:
        acc = np.float32(0)
        for k in range(a.shape[1]):
            acc += a[m, k] * b[n, k]
        c[m, n] = acc


@cuda.jit
def tile_quantize_without_amax_floor(x, codes, scale):
    vals = cuda.local.array(PER_LANE, np.float32)
    K = x.shape[1]
    ntk = scale.shape[1]
    lane = cuda.threadIdx.x % 32
    w = cuda.grid(1) // 32
    if w < scale.size:
        r, t = w // ntk, w % ntk
        amax = np.float32(0)
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            vals[j] = x[r, c] if c < K else np.float32(0)
            amax = max(amax, abs(vals[j]))
        offset = 16
        while offset > 0:
            amax = max(amax, shfl_xor_sync(FULL_MASK, amax, offset))
            offset //= 2
        inv = E4M3_MAX / amax  # an all-zero tile: 448 / 0 = Inf, and 0 * Inf = NaN
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            if c < K:
                codes[r, c] = encode_e4m3_sat(vals[j] * inv)
        if lane == 0:
            scale[r, t] = amax / E4M3_MAX


@cuda.jit
def tile_quantize_shfl_down(x, codes, scale):
    vals = cuda.local.array(PER_LANE, np.float32)
    K = x.shape[1]
    ntk = scale.shape[1]
    lane = cuda.threadIdx.x % 32
    w = cuda.grid(1) // 32
    if w < scale.size:
        r, t = w // ntk, w % ntk
        amax = np.float32(0)
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            vals[j] = x[r, c] if c < K else np.float32(0)
            amax = max(amax, abs(vals[j]))
        offset = 16
        while offset > 0:
            amax = max(amax, shfl_down_sync(FULL_MASK, amax, offset))  # only lane 0 ends with the tile's max
            offset //= 2
        safe = amax if amax > AMAX_FLOOR else AMAX_FLOOR
        inv = E4M3_MAX / safe
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            if c < K:
                codes[r, c] = encode_e4m3_sat(vals[j] * inv)
        if lane == 0:
            scale[r, t] = safe / E4M3_MAX


@cuda.jit
def tile_quantize_divides_by_scale(x, codes, scale):
    vals = cuda.local.array(PER_LANE, np.float32)
    K = x.shape[1]
    ntk = scale.shape[1]
    lane = cuda.threadIdx.x % 32
    w = cuda.grid(1) // 32
    if w < scale.size:
        r, t = w // ntk, w % ntk
        amax = np.float32(0)
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            vals[j] = x[r, c] if c < K else np.float32(0)
            amax = max(amax, abs(vals[j]))
        offset = 16
        while offset > 0:
            amax = max(amax, shfl_xor_sync(FULL_MASK, amax, offset))
            offset //= 2
        safe = amax if amax > AMAX_FLOOR else AMAX_FLOOR
        s = safe / E4M3_MAX
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            if c < K:
                codes[r, c] = encode_e4m3_sat(vals[j] / s)  # rounds differently from vals[j] * (448 / safe)
        if lane == 0:
            scale[r, t] = s


@cuda.jit
def tile_quantize_signed_max(x, codes, scale):
    vals = cuda.local.array(PER_LANE, np.float32)
    K = x.shape[1]
    ntk = scale.shape[1]
    lane = cuda.threadIdx.x % 32
    w = cuda.grid(1) // 32
    if w < scale.size:
        r, t = w // ntk, w % ntk
        amax = np.float32(0)
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            vals[j] = x[r, c] if c < K else np.float32(0)
            amax = max(amax, vals[j])  # forgets abs(): a negative outlier is missed
        offset = 16
        while offset > 0:
            amax = max(amax, shfl_xor_sync(FULL_MASK, amax, offset))
            offset //= 2
        safe = amax if amax > AMAX_FLOOR else AMAX_FLOOR
        inv = E4M3_MAX / safe
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            if c < K:
                codes[r, c] = encode_e4m3_sat(vals[j] * inv)
        if lane == 0:
            scale[r, t] = safe / E4M3_MAX


WRONG = [
    (check.encode_e4m3, encode_ties_away, "ties to even"),
    (check.encode_e4m3, encode_no_saturation, "[overflow]"),
    (check.decode_e4m3, decode_no_subnormals, "exponent field 0 means subnormal"),
    (check.decode_e4m3, decode_unsigned_zero, "0x80 is -0.0"),
    (check.rmsnorm_forward_kernel, rmsnorm_without_eps, "eps = RMSNORM_EPS inside the sqrt"),
    (check.rmsnorm_forward_kernel, rmsnorm_one_element_per_thread, "range(cuda.threadIdx.x, N, cuda.blockDim.x)"),
    (check.tiled_gemm_kernel, gemm_skips_last_k_tile, "the last, partial tile of K is missing"),
    (check.tiled_gemm_kernel, gemm_naive, "uses no shared memory"),
    (check.tile_quantize_kernel, tile_quantize_without_amax_floor, "at most AMAX_FLOOR: floor it first"),
    (check.tile_quantize_kernel, tile_quantize_shfl_down, "shfl_down_sync leaves it in lane 0 only"),
    (check.tile_quantize_kernel, tile_quantize_divides_by_scale, "not divide by scale"),
    (check.tile_quantize_kernel, tile_quantize_signed_max, "take abs() of each element before the max"),
]


# the simulator runs kernels on NumPy scalars, which warn where a GPU silently gives Inf/NaN (no amax floor)
@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("checker, answer, says", WRONG, ids=[w[1].__name__ for w in WRONG])
def test_wrong_answer_is_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(answer, rng=rng)
    msg = str(info.value)
    assert says in msg, msg
    assert "hint:" in msg and "passed" not in capsys.readouterr().out


def test_not_attempted_function_and_kernel():
    def encode_e4m3(x):
        raise NotImplementedError("your answer goes here: replace this line")

    @cuda.jit
    def tiled_gemm_kernel(a, b, c):
        raise NotImplementedError("your answer goes here: replace this line")

    @cuda.jit
    def tile_quantize_kernel(x, codes, scale):
        raise NotImplementedError("your answer goes here: replace this line")

    for checker, answer in ((check.encode_e4m3, encode_e4m3), (check.tiled_gemm_kernel, tiled_gemm_kernel),
                            (check.tile_quantize_kernel, tile_quantize_kernel)):
        with pytest.raises(check.NotAttempted, match="^not attempted yet"):
            checker(answer)


def test_check_report_file(tmp_path, monkeypatch, capsys):
    report = tmp_path / "r.jsonl"
    monkeypatch.setenv(check.REPORT_ENV, str(report))
    check.decode_e4m3(lambda c: float(formats.value_table()[c]))
    with pytest.raises(check.CheckFailed):
        check.decode_e4m3(decode_no_subnormals)
    recs = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(r["check"], r["status"]) for r in recs] == [("decode_e4m3", "passed"), ("decode_e4m3", "failed")]
    assert capsys.readouterr().out.startswith("passed: decode_e4m3")


# ------------------------------------------------------------------------------------ ws8: inline PTX and twins


def _a_fragment_rows_swapped(lane, i):
    g, t = lane >> 2, lane & 3
    r = i >> 2
    return g + 8 * (r >> 1), 4 * t + (i & 3) + 16 * (r & 1)  # registers 1 and 2 exchanged


def _cvt_twin(hi, lo):
    def code(x):
        return int(formats.encode(np.float32(x), saturate=True))

    return (code(hi) << 8) | code(lo)


def _cvt_twin_swapped(hi, lo):
    return _cvt_twin(lo, hi)


def _cvt_intrinsic(text, constraints):
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def cvt(typingctx, hi, lo):
        sig = types.uint16(hi, lo)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(16), [ir.FloatType(), ir.FloatType()])
            return builder.call(ir.InlineAsm(fnty, text, constraints), list(args))

        return sig, codegen

    return intrinsic(cvt)


def test_ws8_right_answers_pass(rng, capsys):
    layout = ptx.mma_m16n8k32_layout()["a"]
    check.mma_a_fragment(lambda lane, i: tuple(int(v) for v in layout[lane, i]))
    check.cvt_e4m3x2_intrinsic(_cvt_intrinsic("cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=h,f,f"), _cvt_twin, rng=rng)
    assert capsys.readouterr().out.count("passed:") == 2


@pytest.mark.parametrize("answer, says", [
    ((_cvt_intrinsic("cvt.rn.satfinite.e4m3x2.f32 $0, $2, $1;", "=h,f,f"), _cvt_twin), "hi, then lo"),
    ((_cvt_intrinsic("cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=r,f,f"), _cvt_twin), "16-bit register"),
    ((_cvt_intrinsic("cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=h,f,f"), _cvt_twin_swapped), "upper byte"),
], ids=["operands swapped", "wrong constraint", "twin swapped"])
def test_ws8_wrong_answers_are_rejected(answer, says, rng):
    from fp8lab.device import runtime

    if not runtime.IS_SIM and says != "upper byte":
        pytest.skip("on a GPU a wrong asm shows up as wrong results or a compile error, checked by the run")
    with pytest.raises(check.CheckFailed) as info:
        check.cvt_e4m3x2_intrinsic(*answer, rng=rng)
    assert says in str(info.value) and "hint:" in str(info.value)


def test_ws8_wrong_fragment_and_placeholder():
    with pytest.raises(check.CheckFailed, match="lane 0, value 4"):
        check.mma_a_fragment(_a_fragment_rows_swapped)

    def a_fragment(lane, i):
        raise NotImplementedError("your answer goes here")

    with pytest.raises(check.NotAttempted):
        check.mma_a_fragment(a_fragment)
