"""The Figure-6-style diagram of one Linear in a recipe (fp8lab.course.plotting.plot_recipe, recipe_flow): drawn
from the recipe's fields, the same operand reuse as the kernel engine, headless."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from fp8lab.course import plotting  # noqa: E402
from fp8lab.numerics import recipes  # noqa: E402
from fp8lab.numerics.recipes import Gemm, Operand, Recipe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def texts(fig) -> list[str]:
    ax = fig.axes[0]
    legend = ax.get_legend()
    return ([t.get_text() for t in ax.texts] + [ax.get_title()]
            + ([t.get_text() for t in legend.get_texts()] if legend else []))


@pytest.mark.parametrize("name", recipes.BUILT_IN)
def test_every_operand_is_drawn_in_its_recipe_precision(name):
    r = recipes.get(name)
    fig = plotting.plot_recipe(name)
    try:
        got = texts(fig)
        flow = plotting.recipe_flow(name)
        assert [f["operand"] for f in flow] == ["x", "W", "dy", "Wᵀ", "dyᵀ", "xᵀ"]
        for f in flow:
            op = getattr(getattr(r, f["gemm"]), "a" if flow.index(f) % 2 == 0 else "b")
            assert (f["precision"], f["granularity"]) == (op.precision, op.granularity)
            label = f"{f['operand']}: {plotting.PRECISION_NAMES[op.precision]}"
            assert label in got, (label, got)
            assert f["how"] in got
        assert f"AdamW\nmoments {plotting.PRECISION_NAMES[r.moments]}" in got
        assert r.name in got[-len(fig.axes[0].get_legend().get_texts()) - 1]  # the title names the recipe
        # the cast boxes are coloured by their operand's precision
        colors = {matplotlib.colors.to_hex(p.get_facecolor()) for p in fig.axes[0].patches}
        for f in flow:
            assert plotting.PRECISION_COLORS[f["precision"]] in colors
    finally:
        plt.close(fig)


def test_fp8_deepseek_reads_as_the_report_describes():
    flow = {f["operand"]: f for f in plotting.recipe_flow("fp8-deepseek")}
    assert "1×128 tiles" in flow["x"]["how"] and "128×128 blocks" in flow["W"]["how"]
    assert flow["Wᵀ"]["reuses"] == "fprop.b" and "exact" in flow["Wᵀ"]["how"]
    assert flow["xᵀ"]["reuses"] == "fprop.a" and "re-tile" in flow["xᵀ"]["how"]
    assert flow["dyᵀ"]["reuses"] is None and "(128×1 of dy)" in flow["dyᵀ"]["how"]  # quantized afresh along the tokens
    flow32 = plotting.recipe_flow("fp32")
    assert all(f["reuses"] is None and f["precision"] == "fp32" for f in flow32)


def test_a_registered_recipe_draws_its_own_formats():
    """A throwaway recipe (E5M2 gradients, power-of-two scales, FP32 moments): the figure says so, and the labels
    of the built-in recipes are not baked in."""
    tile5 = Operand("e5m2", "tile", pow2=True)
    r = Recipe("test-diagram-e5m2", "E5M2 gradients", fprop=Gemm(Operand("e4m3", "tile"), Operand("e4m3", "block")),
               dgrad=Gemm(tile5, Operand("e4m3", "block")), wgrad=Gemm(tile5, Operand("e4m3", "tile")))
    recipes.register(r)
    try:
        fig = plotting.plot_recipe(r.name)
        got = texts(fig)
        assert "dy: E5M2" in got and "dyᵀ: E5M2" in got and "x: E4M3" in got
        assert "E5M2" in got and "BF16" not in got  # the legend: the precisions this recipe uses, FP32 moments
        assert "AdamW\nmoments FP32" in got
        assert any("2^k scales" in t for t in got) and any("powers of two: dgrad.a, wgrad.a" in t for t in got)
        assert not any("2^k scales" in t and "x:" in t for t in got)  # x keeps amax / 448 scales
        flow = {f["operand"]: f for f in plotting.recipe_flow(r.name)}
        assert flow["xᵀ"]["reuses"] is None  # not re-tiled: quantized afresh from float32 x
        assert plotting.PRECISION_COLORS["e5m2"] in {matplotlib.colors.to_hex(p.get_facecolor())
                                                     for p in fig.axes[0].patches}
        plt.close(fig)
    finally:
        recipes.unregister(r.name)


@pytest.mark.parametrize("name", recipes.BUILT_IN)
def test_reuse_matches_the_kernel_engine(name):
    """recipe_flow's reused operands are the ones DeviceLinear transposes exactly or re-tiles, no other."""
    from fp8lab.training import engine_kernels as ek

    lin = ek.DeviceLinear(name, 5, 3, 7)
    flow = {f["operand"]: f for f in plotting.recipe_flow(name)}
    if lin.precision != "fp8":
        assert not any(f["reuses"] for f in flow.values())
        return
    for operand, attr in (("Wᵀ", "wt_codes"), ("dyᵀ", "dyt_codes"), ("xᵀ", "xt_codes")):
        engine_reuses = not isinstance(getattr(lin, attr), ek._Codes)
        assert (flow[operand]["reuses"] is not None) == engine_reuses, (operand, type(getattr(lin, attr)))
        assert ("re-tile" in flow[operand]["how"]) == isinstance(getattr(lin, attr), ek._Retiled)


def test_bad_recipe_is_named():
    with pytest.raises(ValueError, match="recipe must be one of"):
        plotting.plot_recipe("fp7")


def test_draws_headless(tmp_path):
    out = tmp_path / "fig6.png"
    env = {k: v for k, v in os.environ.items() if k != "DISPLAY"}
    env.update(MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    code = ("import matplotlib; from fp8lab.course import plotting; "
            f"plotting.plot_recipe('fp8-deepseek', path={str(out)!r}); print(matplotlib.get_backend())")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().lower() == "agg"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
