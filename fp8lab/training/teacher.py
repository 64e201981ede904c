"""The course's first program, the teacher task: one Linear layer + bias + RMSNorm trained with MSE in a recipe.

    x (B, K) --GEMM with W (N, K), the recipe's precisions--> + b --> RMSNorm (gain g) --> z;  loss = mean((z - t)^2)
    backward: dz -> RMSNorm backward -> dy -> db = colsum(dy), dW = dy^T x (Wgrad), dg = colsum(dz y rstd)
    update: Adam (or SGD) on FP32 master weights; an exponential moving average (EMA) of them on the CPU.

x is data, so there is no Dgrad. The target comes from a fixed random "teacher" layer of the same shape plus Gaussian
noise of standard deviation `noise`, so the loss falls toward a known floor, noise^2 (a perfect student still cannot
predict the noise), and "FP8 is x% above FP32" means something.

A recipe whose GEMM operands are all float32, or all E4M3 with one scale per tensor, runs on the original program's
NT GEMM (kernels.gemm_nt, the kernels lecture 02 takes apart); any other runs the capstone's Linear
(engine_kernels.DeviceLinear on the kernels, engine_reference.Linear in NumPy). `fl.train(task="teacher")` runs it.
"""

from __future__ import annotations

import time

import numpy as np

from .. import _validate as V
from ..device import runtime
from ..kernels import elementwise, gemm_nt, optim, rmsnorm
from ..kernels import loss as loss_k
from ..kernels.quantize import TensorQuantizer
from ..numerics import formats, ops, recipes, spec
from . import engine_kernels, engine_reference

OPTIMIZERS = ("adam", "sgd")


def nt_kind(recipe: recipes.Recipe) -> str | None:
    """kernels.gemm_nt's operand kind for `recipe` when it can run every GEMM of it: "float32" (every operand float32)
    or "e4m3" (every operand E4M3 with one scale per tensor); None when it cannot."""
    operands = set(recipe.operands().values())
    if operands == {recipes.Operand("fp32")}:
        return "float32"
    if operands == {recipes.Operand("e4m3", "tensor")}:
        return "e4m3"
    return None


class Data:
    """The task: fresh Gaussian inputs each step, targets from a fixed random teacher plus noise."""

    def __init__(self, batch: int, d_in: int, d_out: int, noise: float, seed: int):
        self.batch, self.d_in, self.d_out, self.noise = batch, d_in, d_out, noise
        rng = np.random.default_rng([seed, 1])
        self.teacher_w = (rng.standard_normal((d_out, d_in)) / np.sqrt(d_in)).astype(np.float32)
        self.teacher_b = (0.1 * rng.standard_normal(d_out)).astype(np.float32)
        self.teacher_g = rng.uniform(0.5, 1.5, d_out).astype(np.float32)
        self.student_w = (rng.standard_normal((d_out, d_in)) / np.sqrt(d_in)).astype(np.float32)
        self.stream = np.random.default_rng([seed, 2])
        self.eval_x, self.eval_t = self._draw(np.random.default_rng([seed, 3]), 8 * batch)

    def _draw(self, rng, n):
        x = rng.standard_normal((n, self.d_in), dtype=np.float32)
        z = forward_fp32(x, self.teacher_w, self.teacher_b, self.teacher_g)
        t = z + np.float32(self.noise) * rng.standard_normal(z.shape, dtype=np.float32)
        return x, t.astype(np.float32)

    def next(self):
        return self._draw(self.stream, self.batch)


def forward_fp32(x, w, b, g):
    """NumPy FP32 forward: RMSNorm(x W^T + b) * g."""
    return ops.rmsnorm(x @ w.T + b, g)[0]


def _mse(z, t) -> float:
    d = np.asarray(z, np.float64) - t
    return float((d * d).mean())


def _split(flat, N, K):
    """Views (W (N, K), b (N,), g (N,)) of one flat parameter (or gradient) buffer, host or device."""
    return flat[: N * K].reshape((N, K)), flat[N * K : N * K + N], flat[N * K + N :]


class KernelStep:
    """One training step as kernel launches on buffers allocated once."""

    def __init__(self, recipe: recipes.Recipe, data: Data, lr, optimizer):
        B, K, N = data.batch, data.d_in, data.d_out
        cuda = runtime.cuda
        kind = nt_kind(recipe)
        self.fp8 = kind == "e4m3"
        self.N, self.K = N, K
        init = np.concatenate([data.student_w.ravel(), np.zeros(N, np.float32), np.ones(N, np.float32)])
        self.params = cuda.to_device(init)
        self.grads = cuda.device_array(init.size, np.float32)
        self.w, self.b, self.g = self._views(self.params)
        self.dw, self.db, self.dg = self._views(self.grads)
        self.x = cuda.device_array((B, K), np.float32)
        self.t = cuda.device_array((B, N), np.float32)
        self.y = cuda.device_array((B, N), np.float32)
        self.z = cuda.device_array((B, N), np.float32)
        self.rstd = cuda.device_array(B, np.float32)
        self.dy = cuda.device_array((B, N), np.float32)
        self.gy = cuda.device_array((B, N), np.float32)
        self.loss = loss_k.MSELoss((B, N))
        # a recipe gemm_nt cannot run goes through the capstone's Linear; x is data, so no Dgrad
        self.lin = engine_kernels.DeviceLinear(recipe, B, N, K, need_dx=False) if kind is None else None
        if self.fp8:
            self.qx = TensorQuantizer((B, K), transpose=True)  # codes for Fprop and, transposed, Wgrad
            self.qw = TensorQuantizer((N, K))
            self.qdy = TensorQuantizer((B, N), transpose=True)
        elif self.lin is None:
            self.xt = cuda.device_array((K, B), np.float32)
            self.dyt = cuda.device_array((N, B), np.float32)
        self.opt = optim.Adam(init.size, lr=lr) if optimizer == "adam" else optim.SGD(init.size, lr=lr)

    def _views(self, flat):
        return _split(flat, self.N, self.K)

    def __call__(self, x, t) -> float:
        self.x.copy_to_device(x)
        self.t.copy_to_device(t)
        if self.lin is not None:
            self.lin.forward(self.x, self.w, self.y)
        elif self.fp8:
            qx, qw = self.qx(self.x), self.qw(self.w)
            gemm_nt.launch(qx.codes, qx.scale, qw.codes, qw.scale, self.y)  # Fprop
        else:
            gemm_nt.launch(self.x, None, self.w, None, self.y)
        elementwise.bias_add(self.y, self.b)
        rmsnorm.forward(self.y, self.g, self.z, self.rstd)
        self.loss(self.z, self.t)
        rmsnorm.backward(self.loss.dz, self.y, self.g, self.rstd, self.dy, self.gy)
        elementwise.colsum(self.dy, self.db)
        elementwise.colsum(self.gy, self.dg)
        if self.lin is not None:
            self.lin.backward(self.dy, None, self.dw)  # Wgrad only
        elif self.fp8:
            qdy = self.qdy(self.dy)
            gemm_nt.launch(qdy.codes_t, qdy.scale, self.qx.codes_t, self.qx.scale, self.dw)  # Wgrad
        else:
            elementwise.transpose(self.dy, self.dyt)
            elementwise.transpose(self.x, self.xt)
            gemm_nt.launch(self.dyt, None, self.xt, None, self.dw)
        self.opt.step(self.params, self.grads)
        return float(self.loss.loss.copy_to_host()[0])

    def weights(self):
        p = self.params.copy_to_host()
        return self._views(p)


class ReferenceStep:
    """The same step in NumPy float32: the spec the kernels are checked against."""

    def __init__(self, recipe: recipes.Recipe, data: Data, lr, optimizer):
        N, K = data.d_out, data.d_in
        kind = nt_kind(recipe)
        self.fp8 = kind == "e4m3"
        self.lin = engine_reference.Linear(recipe) if kind is None else None
        self.N, self.K = N, K
        self.params = np.concatenate([data.student_w.ravel(), np.zeros(N, np.float32), np.ones(N, np.float32)])
        self.m = np.zeros_like(self.params)
        self.v = np.zeros_like(self.params)
        self.t = 0
        self.lr, self.optimizer = lr, optimizer

    def _views(self, flat):
        return _split(flat, self.N, self.K)

    def __call__(self, x, t) -> float:
        w, b, g = self._views(self.params)
        if self.lin is not None:
            y = self.lin.forward(x, w)
        elif self.fp8:  # gemm_nt's arithmetic: the codes' product, then the two per-tensor scales
            qx, sx, _ = spec.quantize_tensor(x)
            qw, sw, _ = spec.quantize_tensor(w)
            y = (formats.decode(qx) @ formats.decode(qw).T) * sx * sw
        else:
            y = x @ w.T
        y = (y + b).astype(np.float32)
        z, rstd = ops.rmsnorm(y, g)
        loss, dz = ops.mse(z, t)
        dy, dg = ops.rmsnorm_backward(dz, y, g, rstd)
        db = dy.sum(axis=0)
        if self.lin is not None:
            dw = self.lin.backward(dy, need_dx=False)[1]
        elif self.fp8:
            qdy, sdy, _ = spec.quantize_tensor(dy)
            dw = (formats.decode(qdy).T @ formats.decode(qx)) * sdy * sx
        else:
            dw = dy.T @ x
        grads = np.concatenate([dw.ravel(), db, dg]).astype(np.float32)
        self.t += 1
        if self.optimizer == "adam":
            optim.reference_adam(self.params, grads, self.m, self.v, self.t, lr=self.lr)
        else:
            self.params -= np.float32(self.lr) * grads
        return loss

    def weights(self):
        return self._views(self.params.copy())


def run(recipe: recipes.Recipe, steps, seed, batch, d_in, d_out, lr, optimizer, noise, ema_decay, engine,
        progress, history, diverged, divergence_factor):
    """Train the teacher task (arguments checked by fl.train); fills and returns `history`. diverged: the exception
    class raised when the loss becomes NaN/Inf or more than divergence_factor times the first step's."""
    data = Data(batch, d_in, d_out, noise, seed)
    step = (KernelStep if engine == "kernels" else ReferenceStep)(recipe, data, lr, optimizer)
    ema = [a.copy() for a in step.weights()]

    if progress:
        from tqdm.auto import tqdm  # a widget in Jupyter, text in a terminal
    else:
        from tqdm import tqdm

    name = recipe.name
    bar = tqdm(range(1, steps + 1), desc=f"{name} ({engine}, {runtime.backend})", disable=not progress,
               unit="step", leave=True)
    start = time.perf_counter()
    for i in bar:
        x, t = data.next()
        with V.no_float_warnings():  # overflow on the way to a diverging loss is reported below, once
            value = step(x, t)
        if not np.isfinite(value):
            bar.close()
            raise diverged(f"loss became {value} at step {i} of {steps} (recipe={name!r}, lr={lr}): lower the "
                           "learning rate, or check the inputs for NaN/Inf", history)
        if history.loss and value > divergence_factor * history.loss[0]:
            bar.close()
            raise diverged(f"loss became {value:.3g} at step {i} of {steps}, more than {divergence_factor:g} times "
                           f"the first step's {history.loss[0]:.3g} (recipe={name!r}, optimizer={optimizer!r}, "
                           f"lr={lr}): lower the learning rate", history)
        history.loss.append(value)
        for e, w in zip(ema, step.weights()):  # EMA on the CPU, as the original program kept it
            e *= np.float32(ema_decay)
            e += np.float32(1 - ema_decay) * w
        if i % max(1, steps // 50) == 0 or i == steps:
            bar.set_postfix(loss=f"{value:.4f}")
    history.seconds = time.perf_counter() - start
    history.eval_loss = _mse(forward_fp32(data.eval_x, *step.weights()), data.eval_t)
    history.ema_loss = _mse(forward_fp32(data.eval_x, *ema), data.eval_t)
    return history
