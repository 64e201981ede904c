"""The capstone's model on fp8lab's kernels: the same forward and backward as fp8lab.training.model (the NumPy reference
engine), as kernel launches on device buffers allocated once for M windows per step.

Which kernel runs where (recipes as in fp8lab.training.model):
  embedding        kernels.embedding: gather; backward = deterministic scatter-add (version 2)
  RMSNorm          kernels.rmsnorm, or in fp8-deepseek kernels.norm_quant (RMSNorm fused with the 1 x 128 tile
                   quantization of its output, the codes going straight into W1's Fprop GEMM)
  SwiGLU           kernels.swiglu (in fp8-deepseek fused with the tile quantization of h for W2's Fprop)
  Linear GEMMs     fp32, bf16: kernels.gemm (SIMT, the inputs of bf16 rounded by elementwise.round_bf16);
                   fp8-tensor, fp8-deepseek: kernels.fp8_gemm (tensor cores on an H100/H200), with
                   kernels.quantize (per tensor) or kernels.quantize_fine (tiles, blocks, the 1x128 -> 128x1
                   re-quantization of the cached FP8 input for Wgrad)
  outlier channels elementwise.scale_cols (W1's input times d, W1 over d; and back in the backward)
  residual add     elementwise.add;  head: kernels.gemm in float32;  loss: kernels.cross_entropy
  optimizer        optim.AdamW on the flat float32 master weights (bfloat16 moments in fp8-deepseek)
"""

from __future__ import annotations

import numpy as np

from . import model as lm
from ..device import runtime
from ..kernels import (cross_entropy, elementwise, embedding, fp8_gemm, gemm, norm_quant, quantize, quantize_fine,
    rmsnorm, swiglu)
from ..device.runtime import cuda

F32 = np.float32
GROUP = 128


def _empty(shape, dtype=F32):
    return cuda.device_array(shape, dtype)


def _scales(rows, cols):
    return _empty((rows, -(-cols // GROUP)))


def gemm_version() -> int:
    """kernels.gemm's version: the fastest on a GPU; version 2 (one thread per output) is the quickest to simulate."""
    return 2 if runtime.IS_SIM else gemm.BEST


def fp8_gemm_version() -> int:
    """fp8_gemm's version: the tensor cores where the GPU has them; version 1 is the quickest to simulate."""
    return 1 if runtime.IS_SIM else fp8_gemm.best_version()


class Params:
    """The parameters of fp8lab.training.model.init_params in one flat float32 device buffer (what the optimizer
    updates), its
    gradient buffer, and named (reshaped) views of both."""

    def __init__(self, host: dict):
        self.names = list(host)
        self.shapes = {k: host[k].shape for k in self.names}
        sizes = [host[k].size for k in self.names]
        self.offsets = dict(zip(self.names, np.cumsum([0] + sizes[:-1]).tolist()))
        self.size = int(sum(sizes))
        self.flat = cuda.to_device(np.concatenate([host[k].ravel() for k in self.names]).astype(F32))
        self.grad = _empty(self.size)
        self.p = {k: self._view(self.flat, k) for k in self.names}
        self.g = {k: self._view(self.grad, k) for k in self.names}

    def _view(self, flat, k):
        o, shape = self.offsets[k], self.shapes[k]
        return flat[o:o + int(np.prod(shape))].reshape(shape)

    def mask(self, names) -> np.ndarray:
        """float32 (size,): 1 over the parameters whose name starts with one of `names`, else 0."""
        m = np.zeros(self.size, F32)
        for k in self.names:
            if k.startswith(tuple(names)):
                m[self.offsets[k]:self.offsets[k] + int(np.prod(self.shapes[k]))] = 1
        return m

    def host(self, flat=None) -> dict:
        """{name: NumPy array} of the parameters (or of another flat device buffer: the gradients)."""
        return self.split((self.flat if flat is None else flat).copy_to_host())

    def split(self, h: np.ndarray) -> dict:
        """{name: view} of a flat host array laid out as the parameters."""
        return {k: h[self.offsets[k]:self.offsets[k] + int(np.prod(s))].reshape(s) for k, s in self.shapes.items()}


class StepProfile:
    """Where a training step's GPU time goes: CUDA events recorded between the ops of a step (all on one stream),
    so the time from one mark to the next is what the GPU spent on the ops launched in between, including any wait
    for Python to launch them. Totals per name over the profiled steps; nothing is recorded under the simulator
    (its events are synchronous and report nothing about a GPU) or while inactive."""

    def __init__(self):
        self.totals, self.steps, self.active, self.marks = {}, 0, False, []

    @staticmethod
    def timed() -> bool:
        return not runtime.IS_SIM

    def start(self) -> None:
        self.active, self.marks = self.timed(), []

    def mark(self, name: str) -> None:
        """What is launched from here to the next mark counts under `name`."""
        if self.active:
            e = cuda.event()
            e.record()
            self.marks.append((name, e))

    def stop(self) -> None:
        if not self.active:
            return
        end = cuda.event()
        end.record()
        end.synchronize()
        for (name, a), (_, b) in zip(self.marks, self.marks[1:] + [(None, end)]):
            self.totals[name] = self.totals.get(name, 0.0) + cuda.event_elapsed_time(a, b)
        self.steps, self.active, self.marks = self.steps + 1, False, []

    def ms_per_step(self) -> dict | None:
        """{name: milliseconds per step}, largest first; None when nothing was measured."""
        if not self.steps:
            return None
        return dict(sorted(((k, v / self.steps) for k, v in self.totals.items()), key=lambda kv: -kv[1]))


_NO_PROFILE = StepProfile()  # never started: mark() does nothing


class DeviceLinear:
    """y (M, N) = x (M, K) W^T and its backward in one recipe, on buffers made once. forward caches what
    backward needs (the FP8 codes of x in the FP8 recipes)."""

    def __init__(self, recipe: str, M: int, N: int, K: int, prof: StepProfile = _NO_PROFILE):
        self.recipe, self.M, self.N, self.K, self.prof = recipe, M, N, K, prof
        self.gv, self.fv = gemm_version(), fp8_gemm_version()
        if recipe in ("fp32", "bf16"):
            self.wt = _empty((K, N))      # W^T for Fprop (kernels.gemm multiplies row-major (M, K) @ (K, N))
            self.dyt = _empty((N, M))     # dy^T for Wgrad
            if recipe == "bf16":
                self.xb, self.wb, self.dyb = _empty((M, K)), _empty((N, K)), _empty((M, N))
        elif recipe == "fp8-tensor":
            self.qx = quantize.TensorQuantizer((M, K), transpose=True)
            self.qw = quantize.TensorQuantizer((N, K), transpose=True)
            self.qdy = quantize.TensorQuantizer((M, N), transpose=True)
        else:  # fp8-deepseek
            self.xc, self.xs = _empty((M, K), np.uint8), _scales(M, K)
            self.wc, self.ws = _empty((N, K), np.uint8), _empty((-(-N // GROUP), -(-K // GROUP)))
            self.wtc, self.wts = _empty((K, N), np.uint8), _empty((-(-K // GROUP), -(-N // GROUP)))
            self.dyc, self.dys = _empty((M, N), np.uint8), _scales(M, N)
            self.dyt = _empty((N, M))
            self.dytc, self.dyts = _empty((N, M), np.uint8), _scales(N, M)
            self.xtc, self.xts = _empty((K, M), np.uint8), _scales(K, M)

    def codes_for_input(self):
        """fp8-deepseek: the (codes, scale) buffers of x, for a kernel that quantizes x as it computes it."""
        return self.xc, self.xs

    def forward(self, x, w, y, quantized: bool = False) -> None:
        """y = x W^T. quantized=True (fp8-deepseek): x was already written, tile-quantized, into codes_for_input()."""
        r, mark = self.recipe, self.prof.mark
        if r in ("fp32", "bf16"):
            mark("cast and transpose")
            if r == "bf16":
                elementwise.round_bf16(x, self.xb)
                elementwise.round_bf16(w, self.wb)
                x, w = self.xb, self.wb
            self.x, self.w = x, w
            elementwise.transpose(w, self.wt)
            mark("GEMM Fprop")
            gemm.launch(x, self.wt, y, self.gv)
        elif r == "fp8-tensor":
            mark("quantize")
            qx, qw = self.qx(x), self.qw(w)
            mark("GEMM Fprop")
            fp8_gemm.launch(qx.codes, qx.scale, qw.codes, qw.scale, y, 0, 0, version=self.fv)
        else:
            mark("quantize")
            if not quantized:
                quantize_fine.quantize_tile(x, self.xc, self.xs)
            quantize_fine.quantize_block(w, self.wc, self.ws)
            mark("GEMM Fprop")
            fp8_gemm.launch(self.xc, self.xs, self.wc, self.ws, y, 1, 2, version=self.fv)

    def backward(self, dy, dx, dw) -> None:
        """dx = dy W (Dgrad; skipped when dx is None: an input that is data) and dW = dy^T x (Wgrad) for the x and
        W of the last forward."""
        r, mark = self.recipe, self.prof.mark
        if r in ("fp32", "bf16"):
            if r == "bf16":
                mark("cast and transpose")
                elementwise.round_bf16(dy, self.dyb)
                dy = self.dyb
            if dx is not None:
                mark("GEMM Dgrad")
                gemm.launch(dy, self.w, dx, self.gv)
            mark("cast and transpose")
            elementwise.transpose(dy, self.dyt)
            mark("GEMM Wgrad")
            gemm.launch(self.dyt, self.x, dw, self.gv)
        elif r == "fp8-tensor":
            mark("quantize")
            qdy = self.qdy(dy)
            if dx is not None:
                mark("GEMM Dgrad")
                fp8_gemm.launch(qdy.codes, qdy.scale, self.qw.codes_t, self.qw.scale, dx, 0, 0, version=self.fv)
            mark("GEMM Wgrad")
            fp8_gemm.launch(qdy.codes_t, qdy.scale, self.qx.codes_t, self.qx.scale, dw, 0, 0, version=self.fv)
        else:
            if dx is not None:  # Dgrad: dy in 1 x 128 tiles along N; W's 128 x 128 blocks transposed
                mark("quantize")
                quantize_fine.quantize_tile(dy, self.dyc, self.dys)
                mark("cast and transpose")
                elementwise.transpose(self.wc, self.wtc, version=1)
                elementwise.transpose(self.ws, self.wts, version=1)
                mark("GEMM Dgrad")
                fp8_gemm.launch(self.dyc, self.dys, self.wtc, self.wts, dx, 1, 2, version=self.fv)
            # Wgrad: the contraction runs over the tokens: dy^T in tiles along M, and the FP8 x cached by Fprop
            # re-quantized from 1 x 128 to 128 x 1 tiles (never dequantized to memory)
            mark("cast and transpose")
            elementwise.transpose(dy, self.dyt)
            mark("quantize")
            quantize_fine.quantize_tile(self.dyt, self.dytc, self.dyts)
            quantize_fine.requantize_tile_to_col(self.xc, self.xs, self.xtc, self.xts)
            mark("GEMM Wgrad")
            fp8_gemm.launch(self.dytc, self.dyts, self.xtc, self.xts, dw, 1, 1, version=self.fv)


class KernelModel:
    """fp8lab.training.model.Model on the device for batches of M windows: loss(ids, targets) runs the forward, the
    loss and
    (grads=True) the backward into params.grad."""

    def __init__(self, cfg: lm.Config, recipe: str, M: int, params: dict):
        self.cfg, self.recipe, self.M = cfg, recipe, M
        D, F, V, L = cfg.width, cfg.hidden, cfg.vocab, cfg.blocks
        self.params = Params(params)
        self.prof = StepProfile()  # started by the training loop on the steps it profiles
        self.fused = recipe == "fp8-deepseek"
        self.ids = _empty(M * cfg.context, np.int32)
        self.targets = _empty(M, np.int32)
        self.x = [_empty((M, D)) for _ in range(L + 1)]  # the residual stream entering each block, and leaving
        self.rstd = [_empty(M) for _ in range(L + 1)]
        self.u = [_empty((M, 2 * F)) for _ in range(L)]
        self.h = [_empty((M, F)) for _ in range(L)] if not self.fused else None
        self.lin1 = [DeviceLinear(recipe, M, 2 * F, D, self.prof) for _ in range(L)]
        self.lin2 = [DeviceLinear(recipe, M, D, F, self.prof) for _ in range(L)]
        self.zl = [_empty((M, D)) for _ in range(L)] if not self.fused else None  # each block's normed input
        self.v = _empty((M, D))
        self.zf = _empty((M, D))
        self.head_t = _empty((D, V))
        self.logits = _empty((M, V))
        self.loss_fn = cross_entropy.CrossEntropyLoss(M, V)
        self.dlt = _empty((V, M))
        self.dzf, self.dx, self.dxn, self.gy = _empty((M, D)), _empty((M, D)), _empty((M, D)), _empty((M, D))
        self.dh, self.du = _empty((M, F)), _empty((M, 2 * F))
        self.scratch = embedding.Scratch(V, M * cfg.context)
        d = lm.outlier_scales(cfg)
        if d is not None:  # W1's GEMMs run on z * d and W1 / d (fp8lab.training.model)
            self.d, self.dinv = cuda.to_device(d), cuda.to_device((1 / d).astype(F32))
            self.gd = _empty((1, D))          # the norm gain times d: the fused kernel writes z * d directly
            self.w1s = [_empty((2 * F, D)) for _ in range(L)]
        else:
            self.d = None

    def loss(self, ids, targets, grads: bool = True) -> float:
        """Mean cross-entropy (nats) of the batch (ids (M, C) int32, targets (M,) int32, NumPy); with grads=True
        the gradients are left in params.grad."""
        cfg, p, M, mark = self.cfg, self.params.p, self.M, self.prof.mark
        mark("batch to device")
        self.ids.copy_to_device(np.ascontiguousarray(ids, np.int32).reshape(-1))
        self.targets.copy_to_device(np.ascontiguousarray(targets, np.int32))
        mark("embedding")
        embedding.gather(p["emb"], self.ids, self.x[0].reshape((M * cfg.context, cfg.embed)), check_range=False)
        for i in range(cfg.blocks):
            x, u, g, w1 = self.x[i], self.u[i], p[f"g{i}"], p[f"w1_{i}"]
            if self.d is not None:
                mark("outlier scaling")
                elementwise.scale_cols(w1, self.dinv, self.w1s[i])
                w1 = self.w1s[i]
            if self.fused:  # RMSNorm writes the tile-quantized input of W1; SwiGLU the tile-quantized input of W2
                if self.d is not None:
                    elementwise.scale_cols(g.reshape((1, cfg.width)), self.d, self.gd)
                    g = self.gd.reshape(cfg.width)
                mark("RMSNorm")
                norm_quant.forward(x, None, g, *self.lin1[i].codes_for_input(), self.rstd[i])
                self.lin1[i].forward(None, w1, u, quantized=True)
                mark("SwiGLU")
                swiglu.launch_forward_quantize(u, *self.lin2[i].codes_for_input(), None, swiglu.BEST)
                self.lin2[i].forward(None, p[f"w2_{i}"], self.v, quantized=True)
            else:
                mark("RMSNorm")
                rmsnorm.forward(x, g, self.zl[i], self.rstd[i])
                if self.d is not None:
                    mark("outlier scaling")
                    elementwise.scale_cols(self.zl[i], self.d, self.zl[i])
                self.lin1[i].forward(self.zl[i], w1, u)
                mark("SwiGLU")
                swiglu.launch_forward(u, self.h[i])
                self.lin2[i].forward(self.h[i], p[f"w2_{i}"], self.v)
            mark("residual add")
            elementwise.add(x, self.v, self.x[i + 1])
        L = cfg.blocks
        mark("RMSNorm")
        rmsnorm.forward(self.x[L], p["gf"], self.zf, self.rstd[L])
        mark("output head (float32)")
        elementwise.transpose(p["head"], self.head_t)
        gemm.launch(self.zf, self.head_t, self.logits, gemm_version())
        mark("softmax cross-entropy")
        self.loss_fn(self.logits, self.targets)
        if grads:
            self._backward()
        mark("loss to host")
        return self.loss_fn.item()

    def _backward(self) -> None:
        cfg, p, g, M, mark = self.cfg, self.params.p, self.params.g, self.M, self.prof.mark
        L, gv = cfg.blocks, gemm_version()
        dlogits = self.loss_fn.dlogits
        mark("output head (float32)")
        elementwise.transpose(dlogits, self.dlt)
        gemm.launch(self.dlt, self.zf, g["head"], gv)           # dHead = dlogits^T zf
        gemm.launch(dlogits, p["head"], self.dzf, gv)           # dzf = dlogits Head
        mark("RMSNorm backward")
        rmsnorm.backward(self.dzf, self.x[L], p["gf"], self.rstd[L], self.dx, self.gy)
        elementwise.colsum(self.gy, g["gf"])
        for i in reversed(range(L)):
            self.lin2[i].backward(self.dx, self.dh, g[f"w2_{i}"])
            mark("SwiGLU backward")
            swiglu.launch_backward(self.u[i], self.dh, self.du)
            self.lin1[i].backward(self.du, self.dzf, g[f"w1_{i}"])  # dzf reused as the normed input's gradient
            if self.d is not None:  # the gradients of z and W1 from those of z * d and W1 / d
                mark("outlier scaling")
                elementwise.scale_cols(self.dzf, self.d, self.dzf)
                elementwise.scale_cols(g[f"w1_{i}"], self.dinv, g[f"w1_{i}"])
            mark("RMSNorm backward")
            norm_quant.backward(self.dzf, self.x[i], None, p[f"g{i}"], self.rstd[i], self.dxn, self.gy)
            elementwise.colsum(self.gy, g[f"g{i}"])
            mark("residual add")
            elementwise.add(self.dx, self.dxn, self.dx)
        mark("embedding backward")
        embedding.backward(self.dx.reshape((M * cfg.context, cfg.embed)), self.ids, g["emb"], 2,
                           scratch=self.scratch, check_range=False)
