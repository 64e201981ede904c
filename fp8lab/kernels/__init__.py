"""The kernel modules, one op family each (fp8lab/kernels/README.md states the contract they all follow).

`MODULES` is the registry: `fp8lab bench` runs them in this order and the tests check each one's contract.
`common` is not a kernel module: it holds the device code they share. Nothing is imported here eagerly.
"""

from __future__ import annotations

import importlib

MODULES = ("reduce", "cast", "quantize", "quantize_fine", "elementwise", "rmsnorm", "norm_quant", "swiglu",
           "embedding", "loss", "cross_entropy", "optim", "gemm", "gemm_nt", "fp8_gemm", "bf16_gemm",
           "attention", "router", "permute", "tc_accum", "wgmma_tile")


def load(name: str):
    """The kernel module `name` (one of MODULES), imported."""
    if name not in MODULES:
        raise ValueError(f"name must be one of {MODULES}, got {name!r}")
    return importlib.import_module(f"{__name__}.{name}")
