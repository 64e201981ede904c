"""Recipes as objects (fp8lab.numerics.recipes): the built-in ones say what DeepSeek-V3 and the baselines do, a new
recipe is one registered object that every engine trains, and nothing outside the registry compares recipe names."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import fp8lab
from fp8lab.numerics import recipes
from fp8lab.numerics.recipes import Gemm, Operand, Recipe

SMALL = dict(batch=8, context=2, embed=16, hidden=16, blocks=1, eval_every=1, eval_batches=1)  # chars, simulated


def test_built_in_recipes_state_what_each_gemm_runs_in():
    ds = fp8lab.RECIPES["fp8-deepseek"]
    assert (ds.fprop.a, ds.fprop.b) == (Operand("e4m3", "tile"), Operand("e4m3", "block"))
    assert (ds.dgrad.a, ds.dgrad.b) == (Operand("e4m3", "tile"), Operand("e4m3", "block"))
    assert (ds.wgrad.a, ds.wgrad.b) == (Operand("e4m3", "tile"), Operand("e4m3", "tile"))  # x^T: 128 x 1 tiles of x
    assert ds.wgrad_x_from_fprop and ds.moments == "bf16" and ds.pow2_operands == () and ds.gemm_precision == "fp8"
    assert "output head" in ds.high_precision and "RMSNorm" in ds.high_precision
    assert set(fp8lab.RECIPES["fp8-tensor"].operands().values()) == {Operand("e4m3", "tensor")}
    assert fp8lab.RECIPES["bf16"].gemm_precision == "bf16" and fp8lab.RECIPES["fp32"].moments == "fp32"
    assert list(fp8lab.RECIPES)[:5] == ["fp32", "bf16", "fp8-tensor", "fp8-deepseek", "fp8-deepseek-pow2"]
    text = ds.describe()
    assert "wgrad  dy^T e4m3 tile, x^T e4m3 tile" in text and "AdamW moments bf16" in text


def test_the_pow2_variant_rounds_only_the_scales_of_x(rng):
    """fp8-deepseek-pow2: DeepSeek-V3's power-of-two scales where it re-tiles x (section 3.3.3), amax / 448 for W
    and dy; the NumPy engine's cache holds x's tiles with power-of-two scales, and re-tiling them loses nothing."""
    from fp8lab.numerics import spec
    from fp8lab.training import engine_reference

    ds, p2 = fp8lab.RECIPES["fp8-deepseek"], fp8lab.RECIPES["fp8-deepseek-pow2"]
    assert p2.pow2_operands == ("fprop.a", "wgrad.b") and p2.fprop.a == Operand("e4m3", "tile", pow2=True)
    assert (p2.fprop.b, p2.dgrad.a, p2.wgrad.a) == (ds.fprop.b, ds.dgrad.a, ds.wgrad.a)
    assert p2.wgrad_x_from_fprop and p2.moments == ds.moments and "x e4m3 tile pow2" in p2.describe()
    x = rng.standard_normal((150, 300)).astype(np.float32)
    w = rng.standard_normal((70, 300)).astype(np.float32)
    lin = engine_reference.Linear(p2)
    lin.forward(x, w)
    xc, xs, wc, ws = lin.cache
    assert np.array_equal(xs, np.exp2(np.round(np.log2(xs)))) and not np.array_equal(ws, np.exp2(np.round(np.log2(ws))))
    ct, st = spec.requantize_tile_to_col(xc, xs, mode="pow2")
    before, after = spec.dequantize(xc, xs, 1, 128), spec.dequantize(ct, st, 1, 128).T
    normal = np.abs(before) >= 2.0 ** -6 * np.repeat(st.T, 128, axis=0)[:150]  # values that stay normal in E4M3
    assert normal.mean() > 0.9 and np.array_equal(before[normal], after[normal])


def test_the_capstone_trains_fp8_deepseek_with_and_without_pow2_scales():
    """fl.train on the language model, both engines (the simulator in CI): the pow2 variant follows the NumPy engine
    within its tolerance, runs unfused (the fused norm/SwiGLU quantization writes amax scales) and is not
    fp8-deepseek's arithmetic; the command line trains it too."""
    from fp8lab.training import engine_kernels, model

    runs = {(r, e): fp8lab.train(r, task="chars", steps=2, engine=e, progress=False, **SMALL)
            for r in ("fp8-deepseek", "fp8-deepseek-pow2") for e in ("kernels", "reference")}
    for r in ("fp8-deepseek", "fp8-deepseek-pow2"):
        k, ref = runs[r, "kernels"], runs[r, "reference"]
        assert np.isfinite(k.loss).all() and np.isfinite(k.eval_loss)
        rel = np.abs(np.array(k.loss) - ref.loss) / np.array(ref.loss)
        assert rel.max() < fp8lab.RECIPES[r].reference_rtol, (r, rel)
    assert runs["fp8-deepseek-pow2", "reference"].loss[1] != runs["fp8-deepseek", "reference"].loss[1]
    cfg = model.Config(65, 2, 16, 16, 1)
    km = {r: engine_kernels.KernelModel(cfg, r, 8, model.init_params(cfg, 0)) for r in ("fp8-deepseek",
                                                                                        "fp8-deepseek-pow2")}
    assert km["fp8-deepseek"].fused and not km["fp8-deepseek-pow2"].fused
    r = _cli("train", "--task", "chars", "--recipe", "fp8-deepseek-pow2", "--steps", "2", "--no-baseline",
             "--no-plot", "--no-progress", "--engine", "reference")
    assert r.returncode == 0 and "fp8-deepseek-pow2" in r.stdout, r.stderr


def _hybrid(name="test-hybrid-e5m2"):
    """A recipe no engine names: E5M2 gradients in tiles, power-of-two scales, x^T quantized afresh for Wgrad (not
    re-tiled), float32 moments."""
    x, w, g = (Operand("e4m3", "tile", pow2=True), Operand("e4m3", "block", pow2=True),
               Operand("e5m2", "tile", pow2=True))
    return Recipe(name, "a throwaway test recipe", fprop=Gemm(x, w), dgrad=Gemm(g, w), wgrad=Gemm(g, x),
                  moments="fp32", reference_rtol=2e-2)


@pytest.fixture
def hybrid():
    r = recipes.register(_hybrid())
    yield r
    recipes.unregister(r.name)
    assert r.name not in fp8lab.RECIPES


def test_a_registered_recipe_trains_on_every_engine_without_another_file(hybrid):
    """The proof of the design: one object, registered here, trains two steps on the kernels (the simulator in CI)
    and on the NumPy engine, both tasks, and the engines agree within its tolerance."""
    runs = {}
    for task, kw in (("chars", SMALL), ("teacher", dict(batch=8, d_in=32, d_out=16))):
        for engine in ("kernels", "reference"):
            h = fp8lab.train(hybrid.name, task=task, steps=2, engine=engine, progress=False, **kw)
            assert h.recipe == hybrid.name and len(h.loss) == 2 and np.isfinite(h.loss).all()
            runs[task, engine] = h
        k, r = runs[task, "kernels"], runs[task, "reference"]
        rel = np.abs(np.array(k.loss) - r.loss) / np.array(r.loss)
        assert rel.max() < hybrid.reference_rtol, (task, rel)
    assert runs["chars", "reference"].model["moments"] == "fp32"  # the recipe's, not fp8-deepseek's
    # its own arithmetic: not fp8-deepseek's (E5M2 gradients, power-of-two scales, x^T quantized afresh)
    ds = fp8lab.train("fp8-deepseek", task="chars", steps=2, engine="reference", progress=False, **SMALL)
    assert runs["chars", "reference"].loss[1] != ds.loss[1]
    with pytest.raises(ValueError, match="engine='torch' runs recipes whose GEMMs are float32 or bfloat16"):
        fp8lab.train(hybrid.name, task="chars", steps=1, engine="torch", progress=False, **SMALL)


def test_a_recipe_object_trains_unregistered():
    h = fp8lab.train(_hybrid("not-registered"), task="chars", steps=1, engine="reference", progress=False, **SMALL)
    assert h.recipe == "not-registered" and np.isfinite(h.loss).all()
    assert "not-registered" not in fp8lab.RECIPES


def test_the_numpy_engine_follows_each_operand():
    """Each GEMM operand is what its Operand says: dy in E5M2 gives Dgrad's dy on the E5M2 grid."""
    from fp8lab.training import engine_reference

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((40, 300)).astype(np.float32), rng.standard_normal((70, 300)).astype(np.float32)
    dy = rng.standard_normal((40, 70)).astype(np.float32)
    lin = engine_reference.Linear(_hybrid())
    lin.forward(x, w)
    dx, dw = lin.backward(dy)
    dya, (codes, scale) = engine_reference.quantized(dy, Operand("e5m2", "tile", pow2=True))
    assert np.array_equal(dx, dya @ lin.saved_w)  # W's blocks reused, transposed
    assert np.all(np.log2(scale) == np.round(np.log2(scale)))  # power-of-two scales
    assert lin.saved_x is not None and lin.cache[0].dtype == np.uint8  # x kept: Wgrad quantizes x^T afresh
    xt = engine_reference.quantized(np.ascontiguousarray(x.T), Operand("e4m3", "tile", pow2=True))[0]
    dyt = engine_reference.quantized(np.ascontiguousarray(dy.T), Operand("e5m2", "tile", pow2=True))[0]
    assert np.array_equal(dw, dyt @ xt.T)


@pytest.mark.parametrize("make, words", [
    (lambda: Operand("fp16"), "precision must be one of"),
    (lambda: Operand("e4m3"), "granularity must be one of"),
    (lambda: Operand("e4m3", "row"), "granularity must be one of"),
    (lambda: Operand("bf16", "tile"), "granularity must be None for a bf16 operand"),
    (lambda: Recipe("x", "y", fprop=Gemm(Operand("fp32"), Operand("e4m3", "block")), dgrad=Gemm(Operand("fp32"),
                    Operand("fp32")), wgrad=Gemm(Operand("fp32"), Operand("fp32"))), "every GEMM operand must be"),
    (lambda: Recipe("x", "y", **{g: Gemm(Operand("e4m3", "tensor"), Operand("e4m3", "tensor"))
                                 for g in ("fprop", "dgrad", "wgrad")}, wgrad_x_from_fprop=True),
     "wgrad_x_from_fprop re-tiles"),
    (lambda: Operand("e4m3", "tensor", pow2=True), "pow2 needs a fine-grained FP8 operand"),
    (lambda: Operand("bf16", pow2=True), "pow2 needs a fine-grained FP8 operand"),
    (lambda: Recipe("x", "y", fprop=Gemm(Operand("e4m3", "tile", pow2=True), Operand("e4m3", "block")),
                    dgrad=Gemm(Operand("e4m3", "tile"), Operand("e4m3", "block")),
                    wgrad=Gemm(Operand("e4m3", "tile"), Operand("e4m3", "tile")), wgrad_x_from_fprop=True),
     "wgrad_x_from_fprop re-tiles"),
    (lambda: Recipe("x", "y", **{g: Gemm(Operand("fp32"), Operand("fp32")) for g in ("fprop", "dgrad", "wgrad")},
                    moments="fp16"), "moments must be one of"),
    (lambda: Recipe("x", "y", **{g: Gemm(Operand("fp32"), Operand("fp32")) for g in ("fprop", "dgrad", "wgrad")},
                    high_precision=("embedding",)), "high_precision must include"),
    (lambda: Recipe(" x", "y", **{g: Gemm(Operand("fp32"), Operand("fp32")) for g in ("fprop", "dgrad", "wgrad")}),
     "name must be"),
    (lambda: recipes.register(fp8lab.RECIPES["fp32"]), "already registered"),
    (lambda: recipes.unregister("fp32"), "built in"),
    (lambda: recipes.get("fp16"), "recipe must be one of"),
])
def test_bad_recipes_are_clear_errors(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def test_bad_recipe_types_name_the_field():
    with pytest.raises(TypeError, match="pow2 must be a bool"):
        Operand("e4m3", "tile", pow2="yes")
    with pytest.raises(TypeError, match="fprop must be a Gemm"):
        Recipe("x", "y", fprop=Operand("fp32"), dgrad=None, wgrad=None)
    with pytest.raises(TypeError, match="recipe must be one of"):
        recipes.get(3)
    with pytest.raises(TypeError, match="recipe must be a Recipe"):
        recipes.register("fp32")


def test_nothing_outside_the_registry_compares_recipe_names():
    """Code branches on a recipe's fields: no `recipe == "fp8-deepseek"`, `h.recipe in ("fp32", "bf16")` or
    `recipe.startswith("fp8")` anywhere in fp8lab but the registry (numerics/recipes.py). "fp32" and "bf16" are also
    precisions (an Operand's, the moments'), so a comparison with them counts where it involves something named
    recipe; the worksheets' checks name recipes as their questions' inputs, which is not a branch on a name."""
    pkg = pathlib.Path(fp8lab.__file__).parent
    names = set(recipes.BUILT_IN)
    only_recipes = names - set(recipes.PRECISIONS) - set(recipes.MOMENTS)  # fp8-tensor, fp8-deepseek

    def is_recipe_name(e) -> bool:  # `recipe`, `h.recipe`, `args.recipe`: a recipe's name (its fields don't count)
        return ((isinstance(e, ast.Name) and e.id.endswith("recipe")) or
                (isinstance(e, ast.Attribute) and e.attr.endswith("recipe")))

    def mentions_recipe(node) -> bool:
        sides = [node.left, *node.comparators]
        return any(is_recipe_name(e) or (isinstance(e, ast.Call) and any(is_recipe_name(a) for a in e.args))
                   for e in sides)

    bad = []
    for path in pkg.rglob("*.py"):
        if path.name == "recipes.py" and path.parent.name == "numerics":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(pkg)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Compare):
                consts = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                if consts & only_recipes or (consts & names and mentions_recipe(node)):
                    bad.append(where)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "startswith" and any(
                    isinstance(a, ast.Constant) and a.value in ("fp8", "fp8-") for a in node.args):
                bad.append(where + " (startswith)")
    assert not bad, f"recipe names compared in {bad}: branch on the Recipe's fields instead"


def _cli(*args):
    import os
    import subprocess
    import sys

    env = dict(os.environ, FP8LAB_BACKEND="sim", MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "fp8lab.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_the_command_line_lists_and_trains_the_registry():
    r = _cli("recipes")
    assert r.returncode == 0, r.stderr
    for recipe in fp8lab.RECIPES.values():
        assert recipe.describe() in r.stdout
    r = _cli("train", "--recipe", "fp16")
    assert r.returncode == 2 and "fp8-deepseek" in r.stderr  # argparse names the registry's choices
    r = _cli("train", "--task", "chars", "--recipe", "fp8-deepseek", "--engine", "torch", "--steps", "1", "--no-plot")
    assert r.returncode == 2 and "engine='torch' runs recipes whose GEMMs are float32 or bfloat16" in r.stderr


def test_the_torch_engine_trains_the_bf16_recipe_like_the_others():
    pytest.importorskip("torch")
    h = fp8lab.train("bf16", task="chars", steps=2, engine="torch", progress=False, **SMALL)
    ref = fp8lab.train("bf16", task="chars", steps=2, engine="reference", progress=False, **SMALL)
    assert h.engine == "torch" and h.device in ("cpu", "cuda") and len(h.loss) == 2 and len(h.step_seconds) == 2
    assert h.val_loss[-1][0] == 2 and h.eval_loss == h.val_loss[-1][1] and np.isnan(h.ema_loss)
    np.testing.assert_allclose(h.loss[0], ref.loss[0], rtol=0.02)  # same weights and batch; BF16 autocast
    with pytest.raises(ValueError, match="moments: engine='torch' keeps AdamW's moments in float32"):
        fp8lab.train("bf16", task="chars", steps=1, engine="torch", moments="bf16", progress=False, **SMALL)
    with pytest.raises(ValueError, match="save, resume: checkpoints are for"):
        fp8lab.train("bf16", task="chars", steps=1, engine="torch", save="x", progress=False, **SMALL)
