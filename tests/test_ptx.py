"""fp8lab.device.ptx: the inline-PTX FP8 conversion against the software spec, and the PTX helpers.

What is checked:
- on a GPU (`gpu` marker): `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32` through `encode_*_sat_hw` and the packed
  intrinsics gives the codes of `formats.encode(x, fmt, saturate=True)` bit for bit, over every float16 bit
  pattern (as float32) and a million fresh random float32 (ties and their neighbours, subnormals, overflow,
  +-Inf, NaNs with payloads). For NaN inputs the PTX ISA promises only "a NaN", so there the check is that the
  code decodes to NaN; the codes the hardware chose are printed (run with -s to see them). The packed result
  holds the first source operand's code in its upper byte (PTX ISA, cvt);
- on a GPU: the PTX of kernels that use them contains the instructions;
- everywhere (simulator included): the same kernel source runs, the simulator's twins give the software codes,
  `find_instructions` works on a PTX sample, `ptx_of` returns PTX or None with a warning and never raises.

Random inputs come from the `rng` fixture (tests/conftest.py: fixed seeds, fresh ones under `make test-fuzz`).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fp8lab.numerics import formats
from fp8lab.device import ptx, runtime
from fp8lab.numerics.formats import E4M3, E5M2
from fp8lab.kernels import cast
from fp8lab.device.runtime import cuda

POISON = -1  # outside 0..0xFFFF: an unwritten element cannot pass

HW_SIGNATURE = "void(float32[::1], float32[::1], int32[:, ::1])"


@cuda.jit
def hw_codes_kernel(x, y, out):
    """out[0, i] = encode_e4m3_sat_hw(x[i]); out[1, i] = encode_e5m2_sat_hw(x[i]);
    out[2, i] = cvt_e4m3x2_satfinite(x[i], y[i]); out[3, i] = cvt_e5m2x2_satfinite(x[i], y[i]) (grid-stride)."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < x.size:
        out[0, i] = ptx.encode_e4m3_sat_hw(x[i])
        out[1, i] = ptx.encode_e5m2_sat_hw(x[i])
        out[2, i] = ptx.cvt_e4m3x2_satfinite(x[i], y[i])
        out[3, i] = ptx.cvt_e5m2x2_satfinite(x[i], y[i])
        i += step


def run_hw_codes(x: np.ndarray, y: np.ndarray, blocks: int, threads: int) -> np.ndarray:
    out = np.full((4, x.size), POISON, np.int32)
    d_out = cuda.to_device(out)
    hw_codes_kernel[blocks, threads](cuda.to_device(x), cuda.to_device(y), d_out)
    return d_out.copy_to_host()


def boundary_float32() -> np.ndarray:
    """Every E4M3 and E5M2 value and rounding tie (overflow ties included), each with its float32 neighbours
    (+-3 ulp), float32 extremes and specials; both signs. All exact in float32."""
    base = []
    for fmt in (E4M3, E5M2):
        t = formats.value_table(fmt).astype(np.float64)
        grid = np.unique(t[np.isfinite(t) & (t >= 0)])
        beyond = grid[-1] + (grid[-1] - grid[-2])  # the first value past max normal: 480, 65536
        grid = np.append(grid, beyond)
        base += [grid, (grid[:-1] + grid[1:]) / 2]
    base.append([np.finfo(np.float32).max, np.finfo(np.float32).tiny, np.finfo(np.float32).smallest_subnormal,
                 1e30, 2.0**-126 * 0.75, 1.0, 3.0])
    b = np.concatenate([np.asarray(v, np.float64) for v in base]).astype(np.float32)
    bits = b.view(np.uint32).astype(np.int64)[:, None] + np.arange(-3, 4)
    bits = bits[(bits >= 0) & (bits < 0x7F800000)].astype(np.uint32)  # stay in the positive finite range
    mags = np.unique(bits.view(np.float32))
    specials = np.array([np.inf, np.nan, np.float32(0.0)], np.float32)
    nan_payload = np.array([0x7FC00001, 0x7F800001, 0x7FFFFFFF], np.uint32).view(np.float32)
    pos = np.concatenate([mags, specials, nan_payload])
    return np.concatenate([pos, -pos])


def random_float32(rng: np.random.Generator, n: int) -> np.ndarray:
    """n float32: boundaries, log-uniform magnitudes over the whole float32 range (subnormals and overflow
    included), and uniformly random bit patterns (about 0.4% NaNs with payloads, some Infs); shuffled."""
    b = boundary_float32()
    k = (n - b.size) // 2
    with np.errstate(over="ignore"):
        logu = (np.exp2(rng.uniform(-152, 129, k)) * rng.choice([-1.0, 1.0], k)).astype(np.float32)
    bits = rng.integers(0, 2**32, n - b.size - k, dtype=np.uint32).view(np.float32)
    x = np.concatenate([b, logu, bits])
    return x[rng.permutation(x.size)]


def check_codes(got: np.ndarray, x: np.ndarray, fmt, what: str) -> list[int]:
    """got (int32 codes) == formats.encode(x, fmt, saturate=True) wherever x is not NaN; NaN inputs must give NaN
    codes. Returns the sorted NaN codes seen, for the report."""
    assert ((got >= 0) & (got <= 255)).all(), f"{what}: unwritten or out-of-range codes"
    codes = got.astype(np.uint8)
    want = formats.encode(x, fmt, saturate=True)
    nan = np.isnan(x)
    bad = np.flatnonzero((codes != want) & ~nan)
    if bad.size:
        lines = [
            f"  x={x[i]!r} (bits 0x{x[i:i + 1].view(np.uint32)[0]:08X}): hardware 0x{codes[i]:02X}, "
            f"software 0x{want[i]:02X}"
            for i in bad[:8]
        ]
        raise AssertionError(f"{what}: {bad.size} of {x.size} codes differ, first ones:\n" + "\n".join(lines))
    nan_codes = codes[nan]
    assert np.isnan(formats.decode(nan_codes, fmt)).all(), f"{what}: a NaN input gave a non-NaN code"
    return sorted(set(nan_codes.tolist()))


def check_all(x: np.ndarray, y: np.ndarray, out: np.ndarray, what: str) -> None:
    nan_codes = {}
    nan_codes["e4m3"] = check_codes(out[0], x, E4M3, f"{what}: encode_e4m3_sat_hw")
    nan_codes["e5m2"] = check_codes(out[1], x, E5M2, f"{what}: encode_e5m2_sat_hw")
    for row, fmt in ((2, E4M3), (3, E5M2)):
        assert ((out[row] >= 0) & (out[row] <= 0xFFFF)).all(), f"{what}: unwritten packed codes"
        # PTX ISA: the first source operand's code goes to the upper byte, the second's to the lower byte.
        check_codes(out[row] >> 8, x, fmt, f"{what}: cvt_{fmt.name}x2_satfinite upper byte (first operand)")
        check_codes(out[row] & 0xFF, y, fmt, f"{what}: cvt_{fmt.name}x2_satfinite lower byte (second operand)")
    print(f"{what}: NaN inputs gave codes " + ", ".join(
        f"{k} {[hex(c) for c in v]}" for k, v in nan_codes.items()) + " (software: 0x7F/0xFF, 0x7E/0xFE)")


# ---------------------------------------------------------------------------------------------------------------
# Everywhere (simulator: the software twins; GPU: the hardware)
# ---------------------------------------------------------------------------------------------------------------


# Edge values with their codes written out from the spec (OCP OFP8 v1.0, with PTX cvt.rn.satfinite's saturation:
# |x| > max normal, +-Inf included, gives +-max normal), not computed by formats.encode.
EDGES = np.array([1.0, -0.0, 448.0, 464.0, 465.0, np.inf, -np.inf, 2.0**-6, 0.875 * 2.0**-6, 2.0**-9, 2.0**-10,
                  3 * 2.0**-10, 57344.0, 61440.0, 2.0**-16, 2.0**-17, 3 * 2.0**-17, -1e30], np.float32)
EDGE_CODES = {
    # 464 ties 448 / (480) -> 448 (even); 465, Inf -> 448 (satfinite); 2^-10 ties 0 / 2^-9 -> 0; 3 * 2^-10 -> 2
    "e4m3": [0x38, 0x80, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x08, 0x07, 0x01, 0x00, 0x02, 0x7E, 0x7E, 0x00, 0x00, 0x00,
             0xFE],
    # 57344 = max; 61440 ties to the even 2^16, which overflows -> 57344 (satfinite); 2^-17 ties 0 / 2^-16 -> 0
    "e5m2": [0x3C, 0x80, 0x5F, 0x5F, 0x5F, 0x7B, 0xFB, 0x24, 0x23, 0x18, 0x14, 0x1A, 0x7B, 0x7B, 0x01, 0x00, 0x02,
             0xFB],
}


def test_backend_flag_and_twins():
    # HARDWARE picks the code a kernel runs: the PTX instructions on a GPU, the twins under the simulator
    assert runtime.backend in ("gpu", "sim")
    assert ptx.HARDWARE == (runtime.backend == "gpu")
    # ... and either way every hw name gives the spec's codes on the edge values (hand-written, not encode's)
    y = EDGES[::-1].copy()
    out = run_hw_codes(EDGES, y, blocks=1, threads=32)
    for row, packed, fmt in ((0, 2, "e4m3"), (1, 3, "e5m2")):
        want = np.array(EDGE_CODES[fmt])
        assert out[row].tolist() == want.tolist(), f"encode_{fmt}_sat_hw ({runtime.backend})"
        # the first operand's code in the upper byte, the second's in the lower byte (PTX ISA, cvt)
        assert (out[packed] >> 8).tolist() == want.tolist(), f"cvt_{fmt}x2_satfinite upper byte"
        assert (out[packed] & 0xFF).tolist() == want[::-1].tolist(), f"cvt_{fmt}x2_satfinite lower byte"
        assert formats.encode(EDGES, fmt, saturate=True).tolist() == want.tolist(), f"formats.encode {fmt}"


def test_same_kernel_source_gives_software_codes(rng):
    """Boundaries, ties and specials through every hw name; on the simulator these are the twins."""
    x = boundary_float32()
    x = x[rng.permutation(x.size)]
    y = x[rng.permutation(x.size)]
    out = run_hw_codes(x, y, blocks=2, threads=64)
    check_all(x, y, out, f"{x.size} boundary values ({runtime.backend})")


@pytest.mark.parametrize("kernel", [cast.encode_e4m3_sat_hw_kernel, cast.encode_e4m3_sat_sw_kernel],
                         ids=["hw", "sw"])
def test_encode_kernel_matches_encode(rng, kernel):
    x = np.concatenate([boundary_float32()[:200], (rng.standard_normal(200) * 100).astype(np.float32)])
    codes = cuda.to_device(np.full(x.size, 0xA5, np.uint8))
    kernel[2, 64](cuda.to_device(x), codes)
    check_codes(codes.copy_to_host().astype(np.int32), x, E4M3, f"kernels.cast {kernel}")


SAMPLE_PTX = """
.version 8.5
.target sm_90
.address_size 64
	ld.global.f32 	%f2, [%rd20];
	mov.f32 	%f1, 0f00000000;
	// begin inline asm
	cvt.rn.satfinite.e4m3x2.f32 %rs1, %f1, %f2;
	// end inline asm
	cvt.rn.satfinite.e5m2x2.f32 %rs2, %f1, %f2;
	cvt.s64.s32 	%rd13, %r1;
	st.global.u8 	[%rd23], %rs1;
"""


def test_find_instructions():
    assert ptx.find_instructions(SAMPLE_PTX, "cvt.rn.satfinite") == [
        "cvt.rn.satfinite.e4m3x2.f32 %rs1, %f1, %f2;",
        "cvt.rn.satfinite.e5m2x2.f32 %rs2, %f1, %f2;",
    ]
    assert ptx.find_instructions(SAMPLE_PTX, ptx.CVT_E4M3X2) == ["cvt.rn.satfinite.e4m3x2.f32 %rs1, %f1, %f2;"]
    assert len(ptx.find_instructions(SAMPLE_PTX, "cvt")) == 3
    assert ptx.find_instructions(SAMPLE_PTX, "mma.sync") == []
    with pytest.raises(TypeError, match=r"ptx_text must be a str"):
        ptx.find_instructions(None, "cvt")
    with pytest.raises(ValueError, match=r"prefix must be a non-empty str"):
        ptx.find_instructions(SAMPLE_PTX, "")


def test_ptx_of_returns_text_or_none_with_reason():
    """Never raises: PTX text with the instruction, or None and a warning that says how to get PTX. Under the
    simulator without the compiler wheels this returns at once (no subprocess)."""
    ok, why = ptx.ptx_status()
    assert isinstance(why, str) and why
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = ptx.ptx_of(cast.encode_e4m3_sat_hw_kernel, cast.ENCODE_KERNEL_SIGNATURE)
    if not ok:
        assert text is None
        assert any(issubclass(w.category, ptx.PTXUnavailableWarning) and "pip install" in str(w.message)
                   for w in caught)
        return
    if text is None:  # a compiler is there but failed: the warning must say what happened
        messages = [str(w.message) for w in caught if issubclass(w.category, ptx.PTXUnavailableWarning)]
        pytest.fail("ptx_of returned None although ptx_status() said yes: " + " | ".join(messages))
    assert ".target sm_" in text
    assert ptx.find_instructions(text, ptx.CVT_E4M3X2), "the kernel's PTX has no cvt.rn.satfinite.e4m3x2.f32"


def test_ptx_of_unimportable_function_under_simulator():
    if ptx.HARDWARE:
        pytest.skip("on a GPU every function compiles in-process")

    def local_kernel(x):  # defined inside a test: a subprocess cannot import it
        pass

    with pytest.warns(ptx.PTXUnavailableWarning):
        assert ptx.ptx_of(local_kernel, "void(float32[::1])") is None


# ---------------------------------------------------------------------------------------------------------------
# GPU only: the hardware against the software, exhaustively
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_hardware_equals_software_every_float16():
    if not ptx.HARDWARE:
        pytest.skip("needs a CUDA GPU (sm_89+): the simulator runs the software twins")
    x = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    y = x[::-1].copy()  # the second operand sees every pattern too, paired with a different first one
    out = run_hw_codes(x, y, blocks=256, threads=256)
    check_all(x, y, out, "every float16 pattern")


@pytest.mark.gpu
def test_hardware_equals_software_random_float32(rng):
    if not ptx.HARDWARE:
        pytest.skip("needs a CUDA GPU (sm_89+): the simulator runs the software twins")
    x = random_float32(rng, 1_000_000)
    y = random_float32(rng, 1_000_000)
    assert np.isnan(x).sum() > 1000 and np.isinf(x).any() and (np.abs(x) > 464).sum() > 1000
    out = run_hw_codes(x, y, blocks=1024, threads=256)
    check_all(x, y, out, f"{x.size} random float32")


@pytest.mark.gpu
def test_ptx_contains_the_cvt_instructions():
    if not ptx.HARDWARE:
        pytest.skip("needs a CUDA GPU")
    text = ptx.ptx_of(cast.encode_e4m3_sat_hw_kernel, cast.ENCODE_KERNEL_SIGNATURE)
    lines = ptx.find_instructions(text, "cvt.rn.satfinite")
    assert lines and all(line.startswith(ptx.CVT_E4M3X2) for line in lines), lines
    text = ptx.ptx_of(hw_codes_kernel, HW_SIGNATURE)
    assert ptx.find_instructions(text, ptx.CVT_E4M3X2) and ptx.find_instructions(text, ptx.CVT_E5M2X2)
    text = ptx.ptx_of(ptx.encode_e5m2_sat_hw, "int64(float32)")
    assert ptx.find_instructions(text, ptx.CVT_E5M2X2)
    # The kernel launched for real also compiled to it (inspect_asm of the launched overload).
    x = np.ones(8, np.float32)
    codes = cuda.to_device(np.zeros(8, np.uint8))
    cast.encode_e4m3_sat_hw_kernel[1, 32](cuda.to_device(x), codes)
    assert (codes.copy_to_host() == 0x38).all()
    launched = cast.encode_e4m3_sat_hw_kernel.inspect_asm()
    assert any(ptx.find_instructions(t, ptx.CVT_E4M3X2) for t in launched.values())


# ---------------------------------------------------------------------------------------------------------------
# Decoding: cvt.rn.f16x2.{e4m3x2,e5m2x2} (two codes -> two float16, widened to float32)
# ---------------------------------------------------------------------------------------------------------------


@cuda.jit
def decode_pairs_kernel(codes16, out):
    """out[0, :, i] = decode_e4m3x2(codes16[i]) (low byte first), out[1, :, i] = decode_e5m2x2(codes16[i])."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < codes16.size:
        lo, hi = ptx.decode_e4m3x2(codes16[i])
        out[0, 0, i] = lo
        out[0, 1, i] = hi
        lo, hi = ptx.decode_e5m2x2(codes16[i])
        out[1, 0, i] = lo
        out[1, 1, i] = hi
        i += step


def check_decode_pairs(codes16: np.ndarray, blocks: int, threads: int) -> None:
    out = cuda.to_device(np.full((2, 2, codes16.size), np.nan, np.float32))
    decode_pairs_kernel[blocks, threads](cuda.to_device(codes16), out)
    got = out.copy_to_host()
    for f, fmt in enumerate((E4M3, E5M2)):
        for half, byte in enumerate((codes16 & 0xFF, codes16 >> 8)):
            want = formats.decode(byte.astype(np.uint8), fmt)
            nan = np.isnan(got[f, half]) & np.isnan(want)  # a NaN's sign is not kept: the instruction
            # gives float16's canonical NaN for 0x7F and 0xFF alike (the PTX ISA promises only "NaN")
            same = nan | ((got[f, half] == want) & (np.signbit(got[f, half]) == np.signbit(want)))  # -0.0 too
            assert same.all(), f"{fmt.name} byte {half}: code pair 0x{int(codes16[~same][0]):04x} decodes wrong"


def test_decode_x2_twin_every_byte_in_both_halves():
    # every code in the low byte and in the high byte (simulator: the software twin; GPU: the instruction)
    codes = np.arange(256, dtype=np.uint16)
    check_decode_pairs(codes | (codes[::-1] << 8), blocks=2, threads=128)


@pytest.mark.gpu
def test_decode_x2_hardware_every_pair():
    if not ptx.HARDWARE:
        pytest.skip("needs a CUDA GPU (sm_89+): the simulator runs the software twins")
    check_decode_pairs(np.arange(2**16, dtype=np.uint16), blocks=256, threads=256)
    text = ptx.ptx_of(decode_pairs_kernel, "void(uint16[::1], float32[:, :, ::1])")
    assert ptx.find_instructions(text, ptx.CVT_F16X2_E4M3X2) and ptx.find_instructions(text, ptx.CVT_F16X2_E5M2X2)


# ------------------------------------------------------------------------------------------------ mma.sync m16n8k32


def _mma_operands(rng, integers: bool):
    """FP8 codes of A (16, 32) and B^T (8, 32), never NaN; integers=True: small integers, so that every sum is
    exact in any accumulator of 12 bits or more (hardware and twin must then agree exactly)."""
    if integers:
        a, b = rng.integers(-8, 9, (16, 32)), rng.integers(-8, 9, (8, 32))
    else:
        a, b = rng.standard_normal((16, 32)) * 4, rng.standard_normal((8, 32)) * 4
    return formats.encode(a.astype(np.float32), E4M3), formats.encode(b.astype(np.float32), E4M3)


def _make_mma_kernel(mma):
    """One warp: each lane passes its registers (a_regs[lane], b_regs[lane]) and its C fragment to `mma` (any m16n8
    mma.sync with 4 A and 2 B registers) and stores its D fragment."""

    @cuda.jit
    def kernel(a_regs, b_regs, c, d):
        lane = cuda.threadIdx.x
        g, t = lane >> 2, lane & 3
        d0, d1, d2, d3 = mma(
            a_regs[lane, 0], a_regs[lane, 1], a_regs[lane, 2], a_regs[lane, 3], b_regs[lane, 0], b_regs[lane, 1],
            c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1])
        d[g, 2 * t] = d0
        d[g, 2 * t + 1] = d1
        d[g + 8, 2 * t] = d2
        d[g + 8, 2 * t + 1] = d3

    return kernel


_mma_kernel = _make_mma_kernel(ptx.mma_m16n8k32_e4m3)


def _run_mma(a, b, c):
    ar, br = ptx.pack_mma_m16n8k32(a, b)
    d = cuda.to_device(np.full((16, 8), np.nan, np.float32))
    _mma_kernel[1, 32](cuda.to_device(ar), cuda.to_device(br), cuda.to_device(c), d)
    return d.copy_to_host()


def test_mma_layout_covers_every_element_once():
    lay = ptx.mma_m16n8k32_layout()
    for key, shape in (("a", (16, 32)), ("b", (32, 8)), ("c", (16, 8))):
        seen = np.zeros(shape, int)
        np.add.at(seen, (lay[key][..., 0].ravel(), lay[key][..., 1].ravel()), 1)
        assert (seen == 1).all(), key
    # lane 5 (group 1, thread 1): A value 0 at (1, 4), value 4 at (9, 4), value 8 at (1, 20); D values at (1, 2),
    # (1, 3), (9, 2), (9, 3) (PTX ISA, "Matrix Fragments for mma.m16n8k32")
    assert lay["a"][5, [0, 4, 8]].tolist() == [[1, 4], [9, 4], [1, 20]]
    assert lay["b"][5, [0, 3, 4]].tolist() == [[4, 1], [7, 1], [20, 1]]
    assert lay["c"][5].tolist() == [[1, 2], [1, 3], [9, 2], [9, 3]]
    with pytest.raises(ValueError, match="a_codes must have shape"):
        ptx.pack_mma_m16n8k32(np.zeros((16, 16), np.uint8), np.zeros((8, 32), np.uint8))


@pytest.mark.parametrize("integers", [True, False])
def test_mma_m16n8k32_matches_the_reference(rng, integers):
    """The twin under the simulator, the tensor core on a GPU: D = A @ B.T + C for one warp's fragments."""
    a, b = _mma_operands(rng, integers)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    if integers:
        c = np.round(c * 8).astype(np.float32)
    got = _run_mma(a, b, c)
    ref = ptx.mma_m16n8k32_reference(a, b, c)
    assert not np.isnan(got).any(), "NaN in output (unwritten element?)"
    if integers or not ptx.HARDWARE:
        assert np.array_equal(got, ref), np.argwhere(got != ref)[:5]
    else:  # the hardware accumulates with fewer bits than FP32 (DeepSeek-V3: about 14)
        np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())


_mma_bf16_kernel = _make_mma_kernel(ptx.mma_m16n8k16_bf16)


def test_mma_m16n8k16_bf16_layout_and_result(rng):
    """The BF16 m16n8k16's fragments cover A, B and C once each (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
    floating point type": lane 5 holds A values at (1, 2), (1, 3), (9, 2), (9, 3), (1, 10) ...); D = A @ B.T + C
    from one warp's fragments: the twin bit for bit the reference (k order), the tensor core exact on small
    integers (every partial sum an integer below 2**12) and within the FP32 bound on Gaussian values."""
    lay = ptx.mma_m16n8k16_layout()
    for key, shape in (("a", (16, 16)), ("b", (16, 8)), ("c", (16, 8))):
        seen = np.zeros(shape, int)
        np.add.at(seen, (lay[key][..., 0].ravel(), lay[key][..., 1].ravel()), 1)
        assert (seen == 1).all(), key
    assert lay["a"][5, :5].tolist() == [[1, 2], [1, 3], [9, 2], [9, 3], [1, 10]]
    assert lay["b"][5].tolist() == [[2, 1], [3, 1], [10, 1], [11, 1]]
    for integers in (True, False):
        if integers:
            a, b = rng.integers(-8, 9, (16, 16)), rng.integers(-8, 9, (8, 16))
            c = rng.integers(-64, 65, (16, 8)).astype(np.float32)
        else:
            a, b, c = rng.standard_normal((16, 16)), rng.standard_normal((8, 16)), rng.standard_normal((16, 8))
        a_bits = (formats.round_bf16(a.astype(np.float32)).view(np.uint32) >> 16).astype(np.uint16)
        b_bits = (formats.round_bf16(b.astype(np.float32)).view(np.uint32) >> 16).astype(np.uint16)
        ar, br = ptx.pack_mma_m16n8k16(a_bits, b_bits)
        d = cuda.to_device(np.full((16, 8), np.nan, np.float32))
        _mma_bf16_kernel[1, 32](cuda.to_device(ar), cuda.to_device(br), cuda.to_device(c.astype(np.float32)), d)
        got, ref = d.copy_to_host(), ptx.mma_m16n8k16_reference(a_bits, b_bits, c.astype(np.float32))
        assert not np.isnan(got).any(), "NaN in output (unwritten element?)"
        if integers or not ptx.HARDWARE:
            assert np.array_equal(got, ref), np.argwhere(got != ref)[:5]
        else:
            av = np.abs((a_bits.astype(np.uint32) << 16).view(np.float32)).astype(np.float64)
            bv = np.abs((b_bits.astype(np.uint32) << 16).view(np.float32)).astype(np.float64)
            bound = 18 * 2.0**-24 * (av @ bv.T + np.abs(c))
            assert (np.abs(got - ref) <= bound).all()
    with pytest.raises(ValueError, match="a_bits must have shape"):
        ptx.pack_mma_m16n8k16(np.zeros((16, 8), np.uint16), np.zeros((8, 16), np.uint16))


@pytest.mark.gpu
def test_mma_m16n8k32_hardware_many_fragments(rng):
    """The tensor core against the reference on 200 fresh fragments: exact on small integers (every partial sum
    is an integer below 2**12), close on Gaussian values."""
    for trial in range(200):
        integers = trial % 2 == 0
        a, b = _mma_operands(rng, integers)
        c = np.round(rng.standard_normal((16, 8)) * 8).astype(np.float32)
        got, ref = _run_mma(a, b, c), ptx.mma_m16n8k32_reference(a, b, c)
        if integers:
            assert np.array_equal(got, ref), (trial, np.argwhere(got != ref)[:5])
        else:
            np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())


# ------------------------------------------------------------------------------- cp.async, ldmatrix, wgmma helpers

_U8 = runtime.numba_type("uint8")
_WAIT0 = ptx.cp_async_wait_group(0)


@cuda.jit
def _descriptor_kernel(addr, out, swz):
    i = cuda.grid(1)
    if i < addr.size:
        out[i] = ptx.smem_descriptor(addr[i], 16, 1024, 1)
        swz[i] = ptx.swizzle_128b(addr[i])


def test_smem_descriptor_fields_round_trip():
    desc = ptx.smem_descriptor_np(0x1A400, 16, 1024, 1)
    f = ptx.smem_descriptor_fields(desc)
    assert f == {"start_address": 0x1A400, "leading_byte_offset": 16, "stride_byte_offset": 1024, "base_offset": 0,
                 "swizzle": "128-byte"}
    assert ptx.smem_descriptor_np(0x1A400 + 32, 16, 1024, 1) == desc + 2  # a k-slice of 32 bytes: start + 2


def test_device_descriptor_and_swizzle_equal_the_host_ones(rng):
    addr = rng.integers(0, 227 * 1024, 300).astype(np.int64) & ~15
    out = cuda.device_array(300, np.uint64)
    swz = cuda.device_array(300, np.int64)
    _descriptor_kernel[3, 128](cuda.to_device(addr), out, swz)
    assert [int(x) for x in out.copy_to_host()] == [ptx.smem_descriptor_np(int(a), 16, 1024, 1) for a in addr]
    assert np.array_equal(swz.copy_to_host(), ptx.swizzle_128b_np(addr))


def test_swizzle_128b_permutes_each_atom_and_spreads_banks():
    off = np.arange(4096)
    sw = ptx.swizzle_128b_np(off)
    assert sorted(sw.tolist()) == off.tolist()  # a permutation
    assert ((sw // 1024) == (off // 1024)).all() and ((sw // 128) == (off // 128)).all()  # rows stay rows
    for chunk in range(8):  # the same 16-byte chunk of 8 consecutive rows: 8 different bank groups
        banks = {(int(ptx.swizzle_128b_np(r * 128 + chunk * 16)) // 4) % 32 // 4 for r in range(8)}
        assert len(banks) == 8


def test_wgmma_d_layout_covers_every_element_once():
    for n in (8, 128):
        lay = ptx.wgmma_d_layout(n).reshape(-1, 2)
        assert len({tuple(x) for x in lay.tolist()}) == 64 * n
        assert lay[:, 0].max() == 63 and lay[:, 1].max() == n - 1
    lay = ptx.wgmma_d_layout(8)
    assert lay[0].tolist() == [[0, 0], [0, 1], [8, 0], [8, 1]] and lay[37].tolist() == [[17, 2], [17, 3], [25, 2], [25, 3]]


@cuda.jit
def _ldmatrix_kernel(src, out):
    smem = cuda.shared.array(0, _U8)
    lane = cuda.threadIdx.x
    ptx.cp_async_16(smem, lane * 16, src, lane, 0, 16)  # row `lane`: 16 bytes
    ptx.cp_async_commit()
    _WAIT0()
    cuda.syncthreads()
    r0, r1, r2, r3 = ptx.ldmatrix_x4(smem, lane * 16)  # lane l gives row l: matrix l // 8, row l % 8
    out[lane, 0] = r0
    out[lane, 1] = r1
    out[lane, 2] = r2
    out[lane, 3] = r3


def test_cp_async_and_ldmatrix_match_the_ptx_isa(rng):
    src = rng.integers(0, 256, (32, 16), dtype=np.uint8)
    out = cuda.device_array((32, 4), np.uint32)
    _ldmatrix_kernel[1, 32, 0, 512](cuda.to_device(src), out)
    got = out.copy_to_host()
    words = src.view(np.uint32)  # (32, 4): row r's four 4-byte words
    for lane in range(32):
        for q in range(4):  # register q: matrix q, row lane // 4, word lane % 4
            assert got[lane, q] == words[8 * q + lane // 4, lane % 4]


# ---------------------------------------------------------------------------------------------------------------
# Bit casts: f32_as_u32 / u32_as_f32 (mov.b32): the same 32 bits, no conversion
# ---------------------------------------------------------------------------------------------------------------

BITCAST_SIGNATURE = "void(float32[::1], uint32[::1], int64[::1], uint32[:, ::1], float32[:, ::1])"
BITS_POISON = 0xDEADBEEF  # outputs start as patterns the inputs below never hold
F32_POISON = 0x7FBADBAD  # a NaN with a payload no input has


@cuda.jit
def bitcast_kernel(x, u, s, bits_out, vals_out):
    """bits_out[0] = f32_as_u32(x), bits_out[1] = f32_as_u32(u32_as_f32(u)); vals_out[0] = u32_as_f32(u),
    vals_out[1] = u32_as_f32(s) (int64: its low 32 bits), vals_out[2] = u32_as_f32(f32_as_u32(x)) (grid-stride)."""
    i = cuda.grid(1)
    while i < x.size:
        bits_out[0, i] = ptx.f32_as_u32(x[i])
        bits_out[1, i] = ptx.f32_as_u32(ptx.u32_as_f32(u[i]))
        vals_out[0, i] = ptx.u32_as_f32(u[i])
        vals_out[1, i] = ptx.u32_as_f32(s[i])
        vals_out[2, i] = ptx.u32_as_f32(ptx.f32_as_u32(x[i]))
        i += cuda.gridsize(1)


SPECIAL_BITS = np.array([
    0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FC00001, 0x7FFFFFFF,  # signalling and quiet NaNs with payloads
    0x7F800000, 0x00000000, 0x00000001, 0x00400000, 0x007FFFFF,  # Inf, +0.0, subnormals (smallest, middle, largest)
    0x00800000, 0x3F800000, 0x7F7FFFFF,  # smallest normal, 1.0, largest finite
], np.uint32)
SPECIAL_BITS = np.concatenate([SPECIAL_BITS, SPECIAL_BITS | np.uint32(0x80000000)])  # -NaNs, -Inf, -0.0, ...


def bitcast_inputs(rng, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 and u uint32 holding the special patterns then random ones (any pattern: NaNs with payloads
    included), s int64 of both signs and beyond 32 bits (its low 32 bits are u)."""
    bits = np.concatenate([SPECIAL_BITS, rng.integers(0, 2**32, n - SPECIAL_BITS.size, dtype=np.uint32)])
    bits = bits[(bits != BITS_POISON) & (bits != F32_POISON)]
    u = bits[rng.permutation(bits.size)]
    high = rng.integers(-(2**31), 2**31, u.size, dtype=np.int64) << 32  # any upper half, negative s included
    s = high | u.astype(np.int64)
    s[:3] = [-1, -(2**31), 2**32 + 5]  # 0xFFFFFFFF, 0x80000000, 5
    return bits.view(np.float32), u, s


def run_bitcasts(x, u, s, blocks: int, threads: int):
    bits_out = cuda.to_device(np.full((2, x.size), BITS_POISON, np.uint32))
    vals_out = cuda.to_device(np.full((3, x.size), F32_POISON, np.uint32).view(np.float32))
    bitcast_kernel[blocks, threads](cuda.to_device(x), cuda.to_device(u), cuda.to_device(s), bits_out, vals_out)
    return bits_out.copy_to_host(), vals_out.copy_to_host().view(np.uint32)


def check_bitcasts(x, u, s, bits, vals) -> None:
    from fp8lab.bench import assert_codes_equal

    assert_codes_equal("f32_as_u32(x)", bits[0], x.view(np.uint32))
    assert_codes_equal("f32_as_u32(u32_as_f32(u))", bits[1], u)
    assert_codes_equal("u32_as_f32(u) bits", vals[0], u)
    assert_codes_equal("u32_as_f32(int64 s) bits: the low 32 bits", vals[1], (s & 0xFFFFFFFF).astype(np.uint32))
    assert_codes_equal("u32_as_f32(f32_as_u32(x)) bits", vals[2], x.view(np.uint32))


def test_bitcasts_keep_every_bit(rng):
    """NaN payloads (signalling ones too), -0.0, +-Inf and subnormals pass through both casts unchanged."""
    x, u, s = bitcast_inputs(rng, 200)
    assert s[0] == -1 and s[2] == 2**32 + 5
    bits, vals = run_bitcasts(x, u, s, blocks=2, threads=32)
    check_bitcasts(x, u, s, bits, vals)
    # spelled out, not through a view: the values the casts must give
    assert bits[0][np.flatnonzero(x.view(np.uint32) == 0x80000000)[0]] == 0x80000000  # -0.0
    assert vals[1][:3].tolist() == [0xFFFFFFFF, 0x80000000, 5]
    assert np.isnan(x[:5]).all() and x.view(np.uint32)[:5].tolist() == SPECIAL_BITS[:5].tolist()


def test_bitcast_twins_are_numpy_views():
    if ptx.HARDWARE:
        pytest.skip("the twins run under the simulator")
    x = np.array([1.0, -0.0], np.float32)
    assert ptx.f32_as_u32(x[0]) == 0x3F800000 and ptx.f32_as_u32(x[1]) == 0x80000000
    assert isinstance(ptx.f32_as_u32(x[0]), np.uint32) and isinstance(ptx.u32_as_f32(np.uint32(1)), np.float32)
    assert ptx.u32_as_f32(np.uint32(0x7F800001)).view(np.uint32) == 0x7F800001  # a signalling NaN, not quietened
    assert ptx.u32_as_f32(-1).view(np.uint32) == 0xFFFFFFFF


@pytest.mark.gpu
def test_bitcasts_hardware_random_patterns(rng):
    if not ptx.HARDWARE:
        pytest.skip("needs a CUDA GPU: the simulator runs the twins")
    x, u, s = bitcast_inputs(rng, 1 << 22)
    bits, vals = run_bitcasts(x, u, s, blocks=1024, threads=256)
    check_bitcasts(x, u, s, bits, vals)
    text = ptx.ptx_of(bitcast_kernel, BITCAST_SIGNATURE)
    assert ptx.find_instructions(text, "mov.b32"), "the kernel's PTX has no mov.b32"


# ---------------------------------------------------------------------------------------------------------------
# The read-only-path load, 1-D shared loads, L2 bulk prefetch (norm_quant version 3): they move every bit
# ---------------------------------------------------------------------------------------------------------------

F32 = runtime.numba_type("float32")


@cuda.jit
def row_access_kernel(x, out, outs):
    """Thread t of row i: x[i, 4t:4t+4] through ld_global_nc_v4_f32 to out (inside a loop over two passes, as
    version 3 loads it) and into dynamic shared memory by plain stores, back by ld_shared_v4_f32_1d from another
    thread's float4 to outs; thread 0 prefetches the row into L2 first."""
    smem = cuda.shared.array(0, F32)
    i = cuda.blockIdx.x
    t = cuda.threadIdx.x
    if t == 0:
        ptx.prefetch_l2_bulk(x, i, 0, x.shape[1] * 4)
    for _ in range(2):
        a0, a1, a2, a3 = ptx.ld_global_nc_v4_f32(x, i, 4 * t)
        out[i, 4 * t] = a0
        out[i, 4 * t + 1] = a1
        out[i, 4 * t + 2] = a2
        out[i, 4 * t + 3] = a3
    smem[4 * t] = a0
    smem[4 * t + 1] = a1
    smem[4 * t + 2] = a2
    smem[4 * t + 3] = a3
    cuda.syncthreads()
    k = 4 * (cuda.blockDim.x - 1 - t)
    b0, b1, b2, b3 = ptx.ld_shared_v4_f32_1d(smem, k)
    outs[i, k] = b0
    outs[i, k + 1] = b1
    outs[i, k + 2] = b2
    outs[i, k + 3] = b3


def test_nc_load_shared_1d_load_and_prefetch_move_every_bit(rng):
    """The same bits come back (NaN payloads, -0.0, a subnormal too), on both backends."""
    rows, cols = 3, 128
    bits = rng.integers(0, 2**32, (rows, cols), dtype=np.uint32)
    bits[0, :4] = [0x7F800001, 0xFFC00000, 0x80000000, 0x00000001]  # NaNs with payloads, -0.0, a subnormal
    out, outs = (cuda.to_device(np.full((rows, cols), 0xDEADBEEF, np.uint32).view(np.float32)) for _ in range(2))
    runtime.launch_with_shared(row_access_kernel, rows, cols // 4, cols * 4, cuda.to_device(bits.view(np.float32)),
                               out, outs)
    assert np.array_equal(out.copy_to_host().view(np.uint32), bits), "ld.global.nc.L1::evict_last.v4.f32"
    assert np.array_equal(outs.copy_to_host().view(np.uint32), bits), "ld.shared.v4.f32 (1-D)"


def test_ptx_subprocess_bootstrap_finds_the_backend_modules():
    """ptx_of's compiler subprocess loads fp8lab.device.select and fp8lab.device.pool by file path before fp8lab's
    __init__ runs: run it up to the point where it looks up the function (a name that does not exist), which comes
    after that bootstrap, so a moved file fails here even without the CUDA compiler wheels."""
    import os
    import subprocess
    import sys

    from fp8lab.device.ptx import compile as compile_ptx

    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    env.pop("FP8LAB_BACKEND", None)
    done = subprocess.run([sys.executable, "-c", compile_ptx._SUBPROCESS, "fp8lab.kernels.cast", "no_such_kernel",
                           "void()", "0", "9,0", "0"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0
    assert "AttributeError" in done.stderr and "no_such_kernel" in done.stderr, done.stderr[-2000:]
