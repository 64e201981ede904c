"""fl.quantize(convention="deepgemm"): DeepGEMM's reference casts bit for bit, codes and scales, against a NumPy port
of them (tests/_deepgemm.py), on the spec, every tile kernel version and the block kernel (the simulator here,
realistic shapes on a GPU), and, where PyTorch has CUDA, against DeepGEMM's PyTorch arithmetic itself."""

from __future__ import annotations

import numpy as np
import pytest

import fp8lab as fl
from fp8lab.bench import assert_codes_equal, poisoned
from fp8lab.device.runtime import cuda
from fp8lab.kernels import quantize_fine as qf
from fp8lab.numerics import spec

from _deepgemm import bf16_inputs, ceil_to_ue8m0, per_block_cast_to_fp8, per_token_cast_to_fp8

PORT = {"tile": per_token_cast_to_fp8, "block": per_block_cast_to_fp8}
MODE = {False: "deepgemm", True: "deepgemm_ue8m0"}
BIG = {"tile": (4099, 7168 + 4), "block": (4099, 7168 + 5)}


def _inputs(rng, granularity, shape, block=128):
    x = bf16_inputs(rng, shape, block)
    if granularity == "block" and shape[0] > block and shape[1] > block:
        x[block:2 * block, block:2 * block] = 0  # an all-zero block (its scale: the 1e-4 clamp)
    return x


def _same(label, got_codes, got_scale, want_codes, want_scale):
    assert_codes_equal(label, got_codes, want_codes)
    assert got_scale.dtype == np.float32 and np.array_equal(got_scale.view(np.uint32), want_scale.view(np.uint32)), \
        f"{label}: {np.count_nonzero(got_scale != want_scale)} of {want_scale.size} scales differ"


def test_the_port_is_deepgemm_arithmetic():
    """The traps, one by one: 448 divides by a float32 reciprocal, the clamp is 1e-4, ue8m0 is an exact ceiling."""
    amax = np.float32(0.69921875)  # a BF16 value
    _, sf = per_token_cast_to_fp8(np.array([[amax, 0, -0.5]], np.float32), False)
    assert sf[0, 0] == np.float32(amax * (np.float32(1) / np.float32(448)))
    _, sf0 = per_token_cast_to_fp8(np.zeros((2, 5), np.float32), True)
    assert np.all(sf0 == ceil_to_ue8m0(np.float32(1e-4) * (np.float32(1) / np.float32(448))))
    p = np.array([2.0 ** -20, np.nextafter(np.float32(2.0 ** -20), np.float32(1)), 3.0], np.float32)
    assert ceil_to_ue8m0(p).tolist() == [2.0 ** -20, 2.0 ** -19, 4.0]
    # the correctly rounded quotient differs from DeepGEMM's product for a good share of amaxes
    a = np.arange(1, 20001, dtype=np.float32) * np.float32(0.01)
    assert np.mean(a / np.float32(448) != a * (np.float32(1) / np.float32(448))) > 0.1


@pytest.mark.parametrize("granularity, shape, block", [("tile", (7, 300), 128), ("tile", (3, 77), 32),
                                                       ("block", (259, 300), 128), ("block", (40, 70), 16)])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_spec_matches_the_port(rng, granularity, shape, block, ue8m0):
    x = _inputs(rng, granularity, shape, block)
    want = PORT[granularity](x, ue8m0, block)
    codes, scale, _ = spec.quantize(x, granularity, "e4m3", block, mode=MODE[ue8m0])
    _same(f"spec {granularity} {MODE[ue8m0]}", codes, scale, *want)


def _kernel_cases():
    return ([(f"tile-v{v}", "tile", v) for v in qf.VERSIONS] + [("block", "block", None)])


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("label, granularity, version", _kernel_cases())
@pytest.mark.parametrize("size", ["small", pytest.param("big", marks=pytest.mark.gpu)])
def test_kernels_match_the_port(rng, label, granularity, version, ue8m0, size):
    shape = {"tile": (9, 300), "block": (259, 300)}[granularity] if size == "small" else BIG[granularity]
    x = _inputs(rng, granularity, shape)
    dx = cuda.to_device(x)
    codes = cuda.to_device(np.full(shape, 0xA5, np.uint8))
    scale = poisoned(spec.scale_shape(granularity, shape), np.float32)
    if granularity == "tile":
        qf.quantize_tile(dx, codes, scale, mode=MODE[ue8m0], version=version)
    else:
        qf.quantize_block(dx, codes, scale, mode=MODE[ue8m0])
    _same(f"{label} {MODE[ue8m0]} {shape}", codes.copy_to_host(), scale.copy_to_host(),
          *PORT[granularity](x, ue8m0))


@pytest.mark.parametrize("granularity", ["tile", "block"])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_public_api_matches_the_port_and_differs_from_fp8lab(rng, granularity, ue8m0):
    x = _inputs(rng, granularity, (259, 300))
    q = fl.quantize(x, "e4m3", granularity, pow2_scale=ue8m0, convention="deepgemm")
    _same(f"fl.quantize {granularity}", q.data, q.scale, *PORT[granularity](x, ue8m0))
    assert (q.fmt, q.granularity, q.block) == ("e4m3", granularity, 128)
    ours = fl.quantize(x, "e4m3", granularity, pow2_scale=ue8m0)
    if not ue8m0 and granularity == "tile":  # one rounding against two: many last bits differ
        assert 0.05 < np.mean(ours.scale != q.scale) < 0.95 and np.mean(ours.data != q.data) < 0.05


def test_deepgemm_block_size_is_gran_k(rng):
    x = _inputs(rng, "tile", (5, 200), 64)
    q = fl.quantize(x, "E4M3", "tile", block=64, convention="deepgemm")
    _same("gran_k 64", q.data, q.scale, *per_token_cast_to_fp8(x, False, 64))


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(convention="torch"), ValueError, "convention must be one of"),
    (dict(convention=None), TypeError, "convention must be one of"),
    (dict(convention="deepgemm"), ValueError, "convention 'deepgemm' needs granularity 'tile'"),
    (dict(convention="deepgemm", granularity="row"), ValueError, "convention 'deepgemm' needs granularity"),
    (dict(convention="deepgemm", granularity="mx"), ValueError, "convention 'deepgemm' needs granularity"),
    (dict(convention="deepgemm", granularity="tile", fmt="e5m2"), ValueError, "convention 'deepgemm' needs fmt"),
])
def test_bad_conventions_name_the_argument(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fl.quantize(np.ones((4, 8), np.float32), **kwargs)


def test_deepgemm_modes_are_e4m3_only():
    with pytest.raises(ValueError, match="fmt must be 'e4m3' for mode 'deepgemm'"):
        spec.group_scale(np.ones(3, np.float32), "e5m2", "deepgemm")
    with pytest.raises(ValueError, match="fmt must be 'e4m3' for mode 'deepgemm_ue8m0'"):
        qf.make_group_scale("e5m2", "deepgemm_ue8m0")


@pytest.mark.gpu
@pytest.mark.parametrize("ue8m0", [False, True])
def test_matches_deepgemm_pytorch_arithmetic_on_cuda(rng, ue8m0):
    """DeepGEMM's per_token_cast_to_fp8 / per_block_cast_to_fp8 (deep_gemm/utils/math.py) restated in PyTorch, run
    on CUDA on BF16 tensors, against fl.quantize(convention="deepgemm"): codes and scales bit for bit."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")

    def ceil_ue8m0(s):
        bits = s.abs().float().view(torch.int)
        exp = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool().int()
        return (exp.clamp(1, 254) << 23).view(torch.float)

    def cast(xv, dims):
        amax = xv.abs().float().amax(dim=dims, keepdim=True).clamp(1e-4)
        sf = amax / 448.0
        sf = ceil_ue8m0(sf) if ue8m0 else sf
        return (xv * (1.0 / sf)).to(torch.float8_e4m3fn), sf

    for granularity in ("tile", "block"):
        m, n = BIG[granularity]
        x = _inputs(rng, granularity, (m, n))
        pm, pn = -(-m // 128) * 128, -(-n // 128) * 128
        tx = torch.zeros((pm, pn), dtype=torch.bfloat16, device="cuda")
        tx[:m, :n] = torch.from_numpy(x).to(torch.bfloat16).cuda()
        if granularity == "tile":
            c, sf = cast(tx.view(pm, pn // 128, 128), 2)
        else:
            c, sf = cast(tx.view(pm // 128, 128, pn // 128, 128), (1, 3))
        codes = c.view(pm, pn)[:m, :n].contiguous().view(torch.uint8).cpu().numpy()
        scale = sf.reshape(spec.scale_shape(granularity, (pm, pn)))[:, :]
        scale = scale[:m] if granularity == "tile" else scale
        q = fl.quantize(x, "e4m3", granularity, pow2_scale=ue8m0, convention="deepgemm")
        _same(f"torch CUDA {granularity}", q.data, q.scale, codes, scale.cpu().numpy())
