"""The capstone's kernel engine: the forward and backward of engine_reference.Model as kernel launches on device
buffers allocated once for M windows per step (`fl.train(..., engine="kernels")`).

Which kernel runs where (the Linear GEMMs' precisions are the recipe's, fp8lab.numerics.recipes):
  embedding        kernels.embedding: gather; backward = deterministic scatter-add (embedding.BEST: sort, segment sums)
  RMSNorm          kernels.rmsnorm; or, where Fprop takes x in E4M3 1 x 128 tiles, kernels.norm_quant (RMSNorm fused
                   with the tile quantization of its output, the codes going straight into W1's Fprop GEMM)
  SwiGLU           kernels.swiglu (fused with the tile quantization of h for W2's Fprop, the same way; backward:
                   where W1's Dgrad and Wgrad take du in 1 x 128 tiles, du's and du^T's tiles straight from u and dh,
                   swiglu.launch_backward_quantize_dual: du is never written in float32)
  Linear GEMMs     float32: kernels.gemm (SIMT); bfloat16: kernels.bf16_gemm (tensor cores, where the GPU has
                   wgmma: each operand cast once into both NT layouts where both are needed, bf16_gemm.to_bf16_both),
                   else kernels.gemm on the inputs rounded by elementwise.round_bf16;
                   FP8: kernels.fp8_gemm (tensor cores on an H100/H200), with kernels.quantize (per tensor) or
                   kernels.quantize_fine (tiles, blocks, the 1x128 -> 128x1 re-quantization of the cached FP8 input
                   for Wgrad, dy's tiles for Dgrad and dy^T's for Wgrad in one pass: quantize_tile_dual)
  outlier channels elementwise.scale_cols (W1's input times d, W1 over d; and back in the backward)
  residual add     forward: in W2's GEMM epilogue (fp8_gemm / bf16_gemm residual=: x_next = x + h W2^T written by
                   the GEMM, no separate pass or buffer); after kernels.gemm (float32 recipes, bf16 off the tensor
                   cores) still elementwise.add. Backward: in the RMSNorm backward (norm_quant.backward residual=:
                   dx += the gradient through the norm, in place)
  head             kernels.gemm in float32 (its weight gradient gemm.atb_launch: few outputs, a long sum over
                   the batch, so the sum is split over blocks too); loss: kernels.cross_entropy
  optimizer        optim.AdamW on the flat float32 master weights (the recipe's moments)
"""

from __future__ import annotations

import numpy as np

from . import model
from ..device import graphs, runtime
from ..kernels import (bf16_gemm, cross_entropy, elementwise, embedding, fp8_gemm, gemm, norm_quant, quantize,
    quantize_fine, rmsnorm, swiglu)
from ..device.runtime import cuda
from ..numerics import recipes, spec

F32 = np.float32
GROUP = 128


def _empty(shape, dtype=F32):
    return cuda.device_array(shape, dtype)


def _scales(rows, cols):
    return _empty((rows, -(-cols // GROUP)))


def gemm_version() -> int:
    """kernels.gemm's version: the fastest on a GPU; version 2 (one thread per output) is the quickest to simulate."""
    return 2 if runtime.IS_SIM else gemm.BEST


def bf16_tensor_cores() -> bool:
    """Whether the bf16 recipe's GEMMs run on the tensor cores (kernels.bf16_gemm: wgmma, an sm_90 GPU). Not under
    the simulator, where kernels.gemm's version 2 is quicker to simulate (tests switch it on to check the path)."""
    return not runtime.IS_SIM and bf16_gemm.VERSIONS[bf16_gemm.BEST].runs_here()


def fp8_gemm_version(residual: bool = False) -> int:
    """fp8_gemm's version: the tensor cores where the GPU has them; version 1 is the quickest to simulate, version 2
    where the GEMM adds a residual (version 1 has no such epilogue). Both sum in the reference's order: same bits."""
    if runtime.IS_SIM:
        return 2 if residual else 1
    return fp8_gemm.best_version()


class Params:
    """The parameters of fp8lab.training.model.init_params in one flat float32 device buffer (what the optimizer
    updates), its gradient buffer, and named (reshaped) views of both."""

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
    so the time from one mark to the next is what the GPU spent on the ops launched in between. Launched from
    Python (start()), that includes any wait for Python to launch them; in a captured graph (start(stream) while
    the stream captures: the events become nodes of the graph), it does not. Totals per name over the profiled
    steps; nothing is recorded under the simulator (its events are synchronous and report nothing about a GPU) or
    while inactive."""

    def __init__(self):
        self.totals, self.steps, self.active, self.marks, self.stream = {}, 0, False, [], None

    @staticmethod
    def timed() -> bool:
        return not runtime.IS_SIM

    def start(self, stream=None) -> None:
        """Profile what is launched from here to stop(); stream: a stream capturing a graph (read each replay with
        collect()), or None: launches from Python on the default stream (collected by stop())."""
        self.active, self.marks, self.stream = self.timed(), [], stream

    def mark(self, name: str | None) -> None:
        """What is launched from here to the next mark counts under `name`."""
        if self.active:
            e = cuda.event()
            graphs.record_event(e, self.stream)
            self.marks.append((name, e))

    def stop(self) -> None:
        if not self.active:
            return
        self.mark(None)
        self.active = False
        if self.stream is None:
            self.collect()
            self.marks = []

    def collect(self) -> None:
        """Add the intervals between the marks of the step just profiled (a graph: of its last replay)."""
        self.marks[-1][1].synchronize()
        for (name, a), (_, b) in zip(self.marks, self.marks[1:]):
            self.totals[name] = self.totals.get(name, 0.0) + cuda.event_elapsed_time(a, b)
        self.steps += 1

    def ms_per_step(self) -> dict | None:
        """{name: milliseconds per step}, largest first; None when nothing was measured."""
        if not self.steps:
            return None
        return dict(sorted(((k, v / self.steps) for k, v in self.totals.items()), key=lambda kv: -kv[1]))


def graph_breakdown(net, replays: int) -> dict | None:
    """{op: GPU milliseconds per step} of net's forward and backward (net.run, on the batch already in its buffers)
    captured as one CUDA graph with events between its ops and replayed `replays` times: what each op costs
    without launches from Python between them (net.prof's eager steps include those gaps). The replays only
    recompute the gradients (no update, no copy of a batch, the loss not read: those ops are not in it). None under
    the simulator, or (with a RuntimeWarning) where the graph cannot be captured or timed."""
    if not StepProfile.timed():
        return None
    prof, g = StepProfile(), graphs.Graph()
    eager, net.prof = net.prof, prof  # run() marks through net.prof and each DeviceLinear's prof
    linears = net.lin1 + net.lin2
    for lin in linears:
        lin.prof = prof

    def forward_backward():
        prof.start(g.stream)
        net.run(grads=True)
        prof.stop()

    try:
        g.capture(forward_backward)
        for _ in range(replays):
            g.replay()
            prof.collect()
        return prof.ms_per_step()
    except Exception as e:  # a diagnostic: whatever CUDA or numba raised (CudaAPIError is no RuntimeError) must not
        import warnings    # end the training run

        warnings.warn(f"the graph's per-op profile failed ({type(e).__name__}: {e}); History.graph_breakdown is None",
                      RuntimeWarning, stacklevel=2)
        return None
    finally:
        net.prof = eager
        for lin in linears:
            lin.prof = eager
        g.close()


_NO_PROFILE = StepProfile()  # never started: mark() does nothing


class _Codes:
    """FP8 codes and scales of one GEMM operand (rows, cols) in a recipe Operand, on buffers made once; calling it
    on a float32 (rows, cols) device array quantizes it there."""

    def __init__(self, op, rows: int, cols: int):
        self.op, self.mode, self.fmt = op, op.scale_mode, op.precision
        self.kind = spec.ScaleKind.of(op.granularity)
        if op.granularity == "tensor":  # codes_t too: the transposed codes another GEMM may take (exact)
            self.q = quantize.TensorQuantizer((rows, cols), fmt=op.precision, transpose=True)
            self.codes, self.scale = self.q.codes, self.q.scale
        else:
            self.codes = _empty((rows, cols), np.uint8)
            self.scale = _empty(spec.scale_shape(op.granularity, (rows, cols)))

    def __call__(self, x) -> None:
        if self.op.granularity == "tensor":
            self.q(x)
        elif self.op.granularity == "tile":
            quantize_fine.quantize_tile(x, self.codes, self.scale, fmt=self.fmt, mode=self.mode)
        else:
            quantize_fine.quantize_block(x, self.codes, self.scale, fmt=self.fmt, mode=self.mode)


class _Transposed:
    """The exact transpose of a `_Codes` scaled per tensor (its codes_t, its scale) or per 128 x 128 block (codes and
    block scales transposed); calling it writes the transpose of what the source holds now."""

    def __init__(self, src: _Codes):
        self.src, self.kind, self.fmt = src, src.kind, src.fmt
        if src.op.granularity == "tensor":
            self.codes, self.scale = src.q.codes_t, src.q.scale
        else:
            self.codes = _empty(src.codes.shape[::-1], np.uint8)
            self.scale = _empty(src.scale.shape[::-1])

    def __call__(self) -> None:
        if self.src.op.granularity == "block":
            elementwise.transpose(self.src.codes, self.codes, version=1)
            elementwise.transpose(self.src.scale, self.scale, version=1)


class _Retiled:
    """x^T in 1 x 128 tiles along the tokens, re-quantized from the 1 x 128 tiles of x that Fprop cached (DeepSeek-V3:
    the float32 x is not kept); calling it writes them."""

    def __init__(self, src: _Codes):
        self.src, self.kind, self.fmt = src, src.kind, src.fmt
        rows, cols = src.codes.shape
        self.codes, self.scale = _empty((cols, rows), np.uint8), _scales(cols, rows)

    def __call__(self) -> None:
        quantize_fine.requantize_tile_to_col(self.src.codes, self.src.scale, self.codes, self.scale, fmt=self.fmt,
                                             mode=self.src.mode)


class DeviceLinear:
    """y (M, N) = x (M, K) W^T and its backward in one recipe (a Recipe or its name, fp8lab.numerics.recipes), on
    buffers made once. forward caches what backward needs (in FP8 the codes of x).

    bfloat16 recipes run kernels.bf16_gemm on the tensor cores where the GPU has wgmma (bf16_tensor_cores): each
    GEMM's NT operands cast to bfloat16 bits, transposed in the same pass where needed. Elsewhere they, and
    float32 recipes, run kernels.gemm (SIMT, row-major (M, K) @ (K, N): the transposes explicit, the inputs of bf16
    rounded by elementwise.round_bf16). FP8 recipes run kernels.fp8_gemm on each GEMM's NT operands
    (Fprop x, W; Dgrad dy, W^T; Wgrad dy^T, x^T): an operand scaled per tensor or per 128 x 128 block is quantized
    once and its transpose taken exactly; tiles are quantized in each GEMM's own layout, or x^T re-tiled from
    Fprop's codes (wgrad_x_from_fprop). need_dx=False: Dgrad never runs (x is data), so its buffers are not made."""

    def __init__(self, recipe, M: int, N: int, K: int, prof: StepProfile = _NO_PROFILE, need_dx: bool = True):
        self.recipe = r = recipes.get(recipe)
        self.M, self.N, self.K, self.prof = M, N, K, prof
        self.dual = False  # FP8 below: dy's tiles and dy^T's from one pass
        self.gv, self.fv, self.fv_residual = gemm_version(), fp8_gemm_version(), fp8_gemm_version(residual=True)
        self.precision = r.gemm_precision
        self.tensor_cores = self.precision == "bf16" and bf16_tensor_cores()
        if self.tensor_cores:
            self.bv = bf16_gemm.best_version()  # bfloat16 bits in each GEMM's NT layout; x and dy in both layouts
            # from one read each (x^T cast in the forward, for Wgrad)
            u16 = np.uint16
            self.xb, self.xbt, self.wb = _empty((M, K), u16), _empty((K, M), u16), _empty((N, K), u16)
            self.wbt = _empty((K, N), u16) if need_dx else None
            self.dyb, self.dybt = _empty((M, N), u16), _empty((N, M), u16)
            self.float_x = True  # Wgrad casts x^T from x itself
            return
        if self.precision != "fp8":
            self.wt = _empty((K, N))      # W^T for Fprop (kernels.gemm multiplies row-major (M, K) @ (K, N))
            self.dyt = _empty((N, M))     # dy^T for Wgrad
            if self.precision == "bf16":
                self.xb, self.wb, self.dyb = _empty((M, K)), _empty((N, K)), _empty((M, N))
            self.float_x = True  # Wgrad multiplies by x itself
            return
        self.x_codes = _Codes(r.fprop.a, M, K)
        self.w_codes = _Codes(r.fprop.b, N, K)
        self.dy_codes = _Codes(r.dgrad.a, M, N)
        self.wt_codes = (_Transposed(self.w_codes) if r.dgrad.b == r.fprop.b and r.dgrad.b.exact_transpose else
                         _Codes(r.dgrad.b, K, N)) if need_dx else None
        self.dyt_codes = (_Transposed(self.dy_codes) if r.wgrad.a == r.dgrad.a and r.wgrad.a.exact_transpose else
                          _Codes(r.wgrad.a, N, M))
        if r.wgrad_x_from_fprop:
            self.xt_codes = _Retiled(self.x_codes)
        elif r.wgrad.b == r.fprop.a and r.wgrad.b.exact_transpose:
            self.xt_codes = _Transposed(self.x_codes)
        else:
            self.xt_codes = _Codes(r.wgrad.b, K, M)
        self.float_x = isinstance(self.xt_codes, _Codes)  # Wgrad quantizes x^T afresh: x must stay float32
        # dy in 1 x 128 tiles for Dgrad and dy^T in 1 x 128 tiles for Wgrad: both from one read of dy
        self.dual = (r.dgrad.a.granularity == "tile" and r.wgrad.a == r.dgrad.a and isinstance(self.dyt_codes, _Codes)
                     and self.dy_codes.mode in quantize_fine.DUAL_MODES)
        if isinstance(self.wt_codes, _Codes):
            self.wt = _empty((K, N))
        if isinstance(self.dyt_codes, _Codes) and not self.dual:
            self.dyt = _empty((N, M))
        if self.float_x:
            self.xt = _empty((K, M))

    def codes_for_input(self):
        """FP8 recipes: the (codes, scale) buffers of x, for a kernel that quantizes x as it computes it."""
        return self.x_codes.codes, self.x_codes.scale

    def _gemm(self, a, b, out, residual=None) -> None:
        fp8_gemm.launch(a.codes, a.scale, b.codes, b.scale, out, a.kind, b.kind, a.fmt, b.fmt,
                        version=self.fv if residual is None else self.fv_residual, residual=residual)

    def forward(self, x, w, y, quantized: bool = False, residual=None) -> None:
        """y = x W^T, or y = residual + x W^T with residual (float32 (M, N), not y): fp8_gemm and bf16_gemm add it in
        their epilogue (the same float32 addition after the sum as a separate add, so the same bits); after
        kernels.gemm a separate elementwise.add does it. quantized=True (FP8): x was already written, quantized,
        into codes_for_input(); x is then the float32 x for a Wgrad that quantizes x^T afresh, or None."""
        mark = self.prof.mark
        if self.tensor_cores:
            mark("cast and transpose")
            bf16_gemm.cast_both_launch(x, self.xb, self.xbt)  # x^T for Wgrad from the same read of x
            bf16_gemm.cast_launch(w, self.wb)
            self.x, self.w = x, w
            mark("GEMM Fprop")
            bf16_gemm.launch(self.xb.view(np.uint8), self.wb.view(np.uint8), y, self.bv, residual=residual)
            return
        if self.precision != "fp8":
            mark("cast and transpose")
            if self.precision == "bf16":
                elementwise.round_bf16(x, self.xb)
                elementwise.round_bf16(w, self.wb)
                x, w = self.xb, self.wb
            self.x, self.w = x, w
            elementwise.transpose(w, self.wt)
            mark("GEMM Fprop")
            if residual is None:
                gemm.launch(x, self.wt, y, self.gv)
                return
            if not hasattr(self, "xw"):  # kernels.gemm has no residual epilogue: x W^T goes through a buffer
                self.xw = _empty((self.M, self.N))
            gemm.launch(x, self.wt, self.xw, self.gv)
            mark("residual add")
            elementwise.add(residual, self.xw, y)
            return
        mark("quantize")
        if not quantized:
            self.x_codes(x)
        self.x, self.w = x, w
        self.w_codes(w)
        mark("GEMM Fprop")
        self._gemm(self.x_codes, self.w_codes, y, residual)

    def codes_for_grad(self):
        """FP8 recipes whose dy is quantized in one pass for both GEMMs (self.dual): the (codes, scale) buffers of dy
        and of dy^T, then fmt and mode, for a kernel that quantizes dy as it computes it."""
        d, dt = self.dy_codes, self.dyt_codes
        return d.codes, d.scale, dt.codes, dt.scale, d.fmt, d.mode

    def backward(self, dy, dx, dw, quantized: bool = False) -> None:
        """dx = dy W (Dgrad; skipped when dx is None: an input that is data) and dW = dy^T x (Wgrad) for the x and
        W of the last forward. quantized=True (self.dual): dy's and dy^T's tiles were already written into
        codes_for_grad(); dy is then not read (None)."""
        mark = self.prof.mark
        if self.tensor_cores:  # NT operands: Dgrad (dy, W^T), Wgrad (dy^T, x^T)
            mark("cast and transpose")
            if dx is not None:
                bf16_gemm.cast_both_launch(dy, self.dyb, self.dybt)  # dy for Dgrad and dy^T for Wgrad: one read
                bf16_gemm.cast_launch(self.w, self.wbt, transpose=True)
                mark("GEMM Dgrad")
                bf16_gemm.launch(self.dyb.view(np.uint8), self.wbt.view(np.uint8), dx, self.bv)
            else:
                bf16_gemm.cast_launch(dy, self.dybt, transpose=True)
            mark("GEMM Wgrad")
            bf16_gemm.launch(self.dybt.view(np.uint8), self.xbt.view(np.uint8), dw, self.bv)
            return
        if self.precision != "fp8":
            if self.precision == "bf16":
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
            return
        if quantized:
            if not self.dual:
                raise ValueError("quantized=True needs a recipe whose dy is quantized in one pass for both GEMMs")
        elif self.dual:  # dy's tiles and dy^T's in one pass (the cast fused with the transpose)
            mark("quantize")
            d, dt = self.dy_codes, self.dyt_codes
            quantize_fine.quantize_tile_dual(dy, d.codes, d.scale, dt.codes, dt.scale, fmt=d.fmt, mode=d.mode)
        elif dx is not None or isinstance(self.dyt_codes, _Transposed):  # Dgrad's dy, or Wgrad's per-tensor dy^T
            mark("quantize")
            self.dy_codes(dy)
        if dx is not None:  # Dgrad: W^T transposed exactly from Fprop's codes, or quantized afresh
            self._prepare(self.wt_codes, self.w, getattr(self, "wt", None))
            mark("GEMM Dgrad")
            self._gemm(self.dy_codes, self.wt_codes, dx)
        # Wgrad: the contraction runs over the tokens: dy^T and x^T in tiles along M (or their per-tensor codes)
        if not self.dual:
            self._prepare(self.dyt_codes, dy, getattr(self, "dyt", None))
        self._prepare(self.xt_codes, self.x, getattr(self, "xt", None))
        mark("GEMM Wgrad")
        self._gemm(self.dyt_codes, self.xt_codes, dw)

    def _prepare(self, operand, source, scratch) -> None:
        """Write a transposed operand from `source` (float32, untransposed): transposed then quantized (a _Codes),
        re-tiled from Fprop's codes, or transposed exactly; per tensor, the source's quantization wrote it already."""
        mark = self.prof.mark
        if isinstance(operand, _Codes):
            mark("cast and transpose")
            elementwise.transpose(source, scratch)
            mark("quantize")
            operand(scratch)
        elif isinstance(operand, _Retiled):
            mark("quantize")
            operand()
        elif operand.src.op.granularity == "block":
            mark("cast and transpose")
            operand()


FUSED_INPUT = recipes.Operand("e4m3", "tile")
"""What norm_quant and swiglu's quantizing forward write for the next GEMM: E4M3 in 1 x 128 tiles (amax scales)."""


class KernelModel:
    """engine_reference.Model on the device for batches of M windows: loss(ids, targets) runs the forward, the loss
    and (grads=True) the backward into params.grad. Where the recipe's Fprop takes x as FUSED_INPUT (amax scales)
    and Wgrad needs no float32 x, RMSNorm and SwiGLU write the quantized input of the next GEMM themselves."""

    def __init__(self, cfg: model.Config, recipe, M: int, params: dict):
        self.cfg, self.recipe, self.M = cfg, recipes.get(recipe), M
        D, F, V, L = cfg.width, cfg.hidden, cfg.vocab, cfg.blocks
        self.params = Params(params)
        self.prof = StepProfile()  # started by the training loop on the steps it profiles
        self.lin1 = [DeviceLinear(self.recipe, M, 2 * F, D, self.prof) for _ in range(L)]
        self.lin2 = [DeviceLinear(self.recipe, M, D, F, self.prof) for _ in range(L)]
        r = self.recipe
        self.fused = r.fprop.a == FUSED_INPUT and not self.lin1[0].float_x
        self.ids = _empty(M * cfg.context, np.int32)
        self.targets = _empty(M, np.int32)
        self.x = [_empty((M, D)) for _ in range(L + 1)]  # the residual stream entering each block, and leaving
        self.rstd = [_empty(M) for _ in range(L + 1)]
        self.u = [_empty((M, 2 * F)) for _ in range(L)]
        self.h = [_empty((M, F)) for _ in range(L)] if not self.fused else None
        self.zl = [_empty((M, D)) for _ in range(L)] if not self.fused else None  # each block's normed input
        self.zf = _empty((M, D))
        self.head_t = _empty((D, V))
        self.logits = _empty((M, V))
        self.loss_fn = cross_entropy.CrossEntropyLoss(M, V)
        self.head_partial = _empty((gemm.atb_splits(M, V, D), V, D))  # dHead's sums over splits of the batch
        self.dzf, self.dx, self.gy = _empty((M, D)), _empty((M, D)), _empty((M, D))
        self.dh = _empty((M, F))
        self.du = None if self.lin1[0].dual else _empty((M, 2 * F))  # dual: SwiGLU's backward writes du's tiles
        self.scratch = embedding.Scratch(V, M * cfg.context, cfg.embed)
        d = model.outlier_scales(cfg)
        if d is not None:  # W1's GEMMs run on z * d and W1 / d (fp8lab.training.model)
            self.d, self.dinv = cuda.to_device(d), cuda.to_device((1 / d).astype(F32))
            self.gd = _empty((1, D))          # the norm gain times d: the fused kernel writes z * d directly
            self.w1s = [_empty((2 * F, D)) for _ in range(L)]
        else:
            self.d = None

    def loss(self, ids, targets, grads: bool = True) -> float:
        """Mean cross-entropy (nats) of the batch (ids (M, C) int32, targets (M,) int32, NumPy); with grads=True
        the gradients are left in params.grad."""
        self.prof.mark("batch to device")
        self.ids.copy_to_device(np.ascontiguousarray(ids, np.int32).reshape(-1))
        self.targets.copy_to_device(np.ascontiguousarray(targets, np.int32))
        self.run(grads)
        self.prof.mark("loss to host")
        return self.loss_fn.item()

    def run(self, grads: bool = True) -> None:
        """The forward, the loss (left on the device in loss_fn.loss) and, with grads=True, the backward, on the
        batch in the `ids` and `targets` buffers: kernel launches only (what a CUDA graph captures)."""
        cfg, p, M, mark = self.cfg, self.params.p, self.M, self.prof.mark
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
                # x_next = x + h W2^T, the residual added in the GEMM's epilogue
                self.lin2[i].forward(None, p[f"w2_{i}"], self.x[i + 1], quantized=True, residual=x)
            else:
                mark("RMSNorm")
                rmsnorm.forward(x, g, self.zl[i], self.rstd[i])
                if self.d is not None:
                    mark("outlier scaling")
                    elementwise.scale_cols(self.zl[i], self.d, self.zl[i])
                self.lin1[i].forward(self.zl[i], w1, u)
                mark("SwiGLU")
                swiglu.launch_forward(u, self.h[i])
                self.lin2[i].forward(self.h[i], p[f"w2_{i}"], self.x[i + 1], residual=x)
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

    def _backward(self) -> None:
        cfg, p, g, M, mark = self.cfg, self.params.p, self.params.g, self.M, self.prof.mark
        L, gv = cfg.blocks, gemm_version()
        dlogits = self.loss_fn.dlogits
        mark("output head (float32)")
        gemm.atb_launch(dlogits, self.zf, g["head"], self.head_partial)  # dHead = dlogits^T zf, split over the batch
        gemm.launch(dlogits, p["head"], self.dzf, gv)           # dzf = dlogits Head
        mark("RMSNorm backward")
        rmsnorm.backward(self.dzf, self.x[L], p["gf"], self.rstd[L], self.dx, self.gy)
        elementwise.colsum(self.gy, g["gf"])
        for i in reversed(range(L)):
            self.lin2[i].backward(self.dx, self.dh, g[f"w2_{i}"])
            mark("SwiGLU backward")
            if self.du is None:  # du's tiles for Dgrad and du^T's for Wgrad from u and dh: du is never written
                swiglu.launch_backward_quantize_dual(self.u[i], self.dh, *self.lin1[i].codes_for_grad())
                self.lin1[i].backward(None, self.dzf, g[f"w1_{i}"], quantized=True)
            else:
                swiglu.launch_backward(self.u[i], self.dh, self.du)
                self.lin1[i].backward(self.du, self.dzf, g[f"w1_{i}"])  # dzf reused as the normed input's gradient
            if self.d is not None:  # the gradients of z and W1 from those of z * d and W1 / d
                mark("outlier scaling")
                elementwise.scale_cols(self.dzf, self.d, self.dzf)
                elementwise.scale_cols(g[f"w1_{i}"], self.dinv, g[f"w1_{i}"])
            mark("RMSNorm backward")  # dx += the gradient through the norm: the residual add in its epilogue
            norm_quant.backward(self.dzf, self.x[i], None, p[f"g{i}"], self.rstd[i], self.dx, self.gy,
                                residual=self.dx)
            elementwise.colsum(self.gy, g[f"g{i}"])
        mark("embedding backward")
        embedding.backward(self.dx.reshape((M * cfg.context, cfg.embed)), self.ids, g["emb"], embedding.BEST,
                           scratch=self.scratch, check_range=False)


LOSS_RING = 1024
"""GraphedStep: the losses of this many steps wait on the host (pinned) between two reads; the loop reads far
sooner (fp8lab.training.loop.LOSS_READ_EVERY, and at every validation)."""


class GraphedStep:
    """A training step of `net` (forward, loss, backward) and its AdamW update captured once as a CUDA graph
    (fp8lab.device.graphs) and replayed for each batch: one launch from Python instead of hundreds, and no host
    synchronization inside a step. What changes per step lives in device memory: the batch (copied into net's
    `ids` and `targets` before each replay, from one of two pinned host buffers, asynchronously) and AdamW's bias
    corrections (AdamW.schedule: a table of the next `steps` steps and a step index on the device). The loss is
    copied back asynchronously into a ring of pinned host memory and read by `losses()`, every few steps.

    Every replay is the launches of `net.run(grads=True)` then `opt.step(...)` (what an eager `net.loss` launches
    after its batch copy, and AdamW with its bias corrections read from the table), with the same buffers and
    scalars: the same bits. The scalars are frozen at capture: AdamW's lr cannot change afterwards. Under the
    simulator the Graph twin runs the captured function at each replay."""

    def __init__(self, net: KernelModel, opt, steps: int):
        self.net, self.opt, self.graph = net, opt, graphs.Graph()
        self.stream = self.graph.stream
        P = net.params
        self.ids_h = [cuda.pinned_array(net.ids.shape, np.int32) for _ in range(2)]
        self.tgt_h = [cuda.pinned_array(net.targets.shape, np.int32) for _ in range(2)]
        self.copied = [cuda.event(), cuda.event()]  # each pinned batch's copy is done
        self.used = [False, False]
        self.loss_h = cuda.pinned_array(LOSS_RING, np.float32)
        # copy_weights: the weights after a step copied on the device into one of two snapshots, then to the host
        # on a stream of their own, so that the slow copy over PCIe runs beside the next steps' kernels
        self.snap = [cuda.device_array(P.size, np.float32) for _ in range(2)]
        self.snap_taken = [cuda.event(), cuda.event()]  # on self.stream: the snapshot is written
        self.snap_read = [None, None]  # on copy_stream: the snapshot reached the host (it may be written again)
        self.snap_turn = 0
        self.copy_stream = cuda.stream()
        self.loss_done = cuda.event()
        self.turn, self.done, self.read = 0, 0, 0
        self.timed = not runtime.IS_SIM  # events around each replay: the GPU time of the steps (gpu_ms)
        self.marks = []  # (before, after) event pairs, reused: the replays since the last read use the first ones
        self.gpu_ms = 0.0  # GPU time of the replays read by the last losses() call
        opt.schedule(steps)
        t = opt.t

        def step():
            net.run(grads=True)
            opt.step(P.flat, P.grad)

        try:
            self.graph.capture(step)
        finally:
            opt.t = t  # the capture ran no step (nor did a capture that failed)

    def __call__(self, ids, targets) -> None:
        """One step on this batch (ids (M, C), targets (M,), NumPy int32): queued on the GPU, returns at once
        (after waiting, at most, for the copy of the batch two steps back)."""
        if self.opt.t >= self.opt.scheduled_until:  # the table ends there: a replay would read past it
            raise RuntimeError(f"GraphedStep: step {self.opt.t + 1} is past the {self.opt.scheduled_until} steps "
                               "AdamW.schedule() prepared")
        if self.done - self.read >= LOSS_RING:
            raise RuntimeError(f"GraphedStep: {LOSS_RING} losses were not read; call losses() more often")
        k = self.turn
        if self.used[k]:
            self.copied[k].synchronize()  # the pinned buffer's last batch reached the device
        self.ids_h[k][...] = np.asarray(ids, np.int32).reshape(-1)
        self.tgt_h[k][...] = np.asarray(targets, np.int32)
        self.net.ids.copy_to_device(self.ids_h[k], stream=self.stream)
        self.net.targets.copy_to_device(self.tgt_h[k], stream=self.stream)
        self.copied[k].record(self.stream)
        self.used[k], self.turn = True, 1 - k
        t = self.opt.t
        n = self.done - self.read
        if self.timed:
            if n == len(self.marks):
                self.marks.append((cuda.event(), cuda.event()))
            self.marks[n][0].record(self.stream)
        self.graph.replay()
        if self.timed:
            self.marks[n][1].record(self.stream)
        self.opt.t = t + 1  # what step() counts on the host (the twin's replay counted it already); the device's
        # step index advanced in the graph
        j = self.done % LOSS_RING
        self.net.loss_fn.loss.copy_to_host(self.loss_h[j:j + 1], stream=self.stream)
        self.done += 1

    def losses(self) -> list:
        """The losses (floats) of the steps since the last call, in order: waits for the GPU to finish them. Sets
        gpu_ms: the GPU time those steps' replays took (on a GPU; 0 under the simulator)."""
        self.loss_done.record(self.stream)
        self.loss_done.synchronize()
        out = [float(self.loss_h[j % LOSS_RING]) for j in range(self.read, self.done)]
        if self.timed:
            self.gpu_ms = sum(cuda.event_elapsed_time(a, b) for a, b in self.marks[:len(out)])
        self.read = self.done
        return out

    def copy_weights(self, buffer) -> None:
        """The flat weights after the last queued step into `buffer` (pinned host memory), asynchronously: a copy
        on the device (HBM, fast) into a snapshot on self.stream, then the snapshot to `buffer` (PCIe, slow) on
        copy_stream, beside the next steps. Wait for copy_stream (an event recorded on it) before reading buffer."""
        k = self.snap_turn
        if self.snap_read[k] is not None:
            self.snap_read[k].wait(self.stream)  # its last copy to the host is done before it is written again
        self.snap[k].copy_to_device(self.net.params.flat, stream=self.stream)
        self.snap_taken[k].record(self.stream)
        self.snap_taken[k].wait(self.copy_stream)
        self.snap[k].copy_to_host(buffer, stream=self.copy_stream)
        self.snap_read[k] = self.snap_read[k] or cuda.event()
        self.snap_read[k].record(self.copy_stream)
        self.snap_turn = 1 - k
