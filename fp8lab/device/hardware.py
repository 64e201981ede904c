"""Published numbers of the GPUs the course is measured on, and an occupancy model (NumPy only).

Datasheet rates are leads, not ceilings: benchmarks compare with a ceiling measured in the same run (a copy,
cuBLAS through PyTorch) and give these peaks beside it.

Sources: NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: FP32 67 TFLOP/s, dense BF16 989.5, dense FP8 1979;
HBM3 3.35 TB/s); NVIDIA H200 datasheet (141 GB HBM3e at 4.8 TB/s, the H100's compute); the H800 is an H100
with NVLink cut to 400 GB/s (DeepSeek-V3, arXiv 2412.19437, section 3.1). Per-SM limits of compute capability
9.0: CUDA C++ Programming Guide, "Compute Capabilities" table.
"""

from __future__ import annotations

import math

__all__ = ["H100_FP32_TFLOPS", "H100_BF16_TFLOPS", "H100_FP8_TFLOPS", "HBM_GBS", "SM90", "peak", "occupancy", "recorded"]

H100_FP32_TFLOPS = 67.0
"""FP32 on CUDA cores, H100 SXM (the same on H800 and H200)."""
H100_BF16_TFLOPS = 989.5
"""Dense BF16 tensor cores, H100 SXM."""
H100_FP8_TFLOPS = 1979.0
"""Dense FP8 tensor cores, H100 SXM."""
HBM_GBS = {"H200": 4800.0, "H100": 3350.0, "H800": 3350.0}
"""Memory bandwidth by device, GB/s (datasheets)."""

SM90 = dict(regs=65536, smem=228 * 1024, threads=2048, blocks=32, reg_alloc_unit=256, smem_reserved=1024)
"""Per-SM limits of compute capability 9.0 (H100, H800, H200)."""


def peak(unit: str, device_name: str | None, kind: str = "fp32") -> tuple[float, str] | None:
    """(peak, label) in `unit` ("GB/s" or "TFLOP/s") for a device whose name contains H100, H800 or H200; None
    elsewhere (and under the simulator). kind: "fp32", "bf16" or "fp8" for TFLOP/s."""
    if not device_name:
        return None
    chip = next((c for c in ("H200", "H100", "H800") if c in device_name), None)
    if chip is None:
        return None
    if unit == "GB/s":
        return HBM_GBS[chip], f"{chip} HBM {HBM_GBS[chip]:,.0f} GB/s"
    rate = {"fp32": H100_FP32_TFLOPS, "bf16": H100_BF16_TFLOPS, "fp8": H100_FP8_TFLOPS}[kind]
    return rate, f"{chip} dense {kind.upper()} {rate:g} TFLOP/s"


def occupancy(launch: dict, regs_per_thread: int | None = None) -> dict:
    """Resident blocks and warps per SM of a kernel on a compute-capability-9.0 SM, and which limit binds.

    launch: threads (per block), smem (static shared memory per block, bytes) and min_regs (a lower bound on
    registers per thread, used when regs_per_thread is None: the register limit is then an upper bound).
    Registers are allocated per warp in units of 256; each block also takes 1 KB of shared memory reserved by
    the system (CUDA guide).
    """
    lim = SM90
    threads, smem = launch["threads"], launch["smem"]
    regs = launch["min_regs"] if regs_per_thread is None else int(regs_per_thread)
    warps = math.ceil(threads / 32)
    regs_per_warp = math.ceil(regs * 32 / lim["reg_alloc_unit"]) * lim["reg_alloc_unit"]
    by = {
        "threads": lim["threads"] // threads,
        "registers": lim["regs"] // (regs_per_warp * warps),
        "shared memory": lim["smem"] // (smem + lim["smem_reserved"]),
        "blocks": lim["blocks"],
    }
    blocks = min(by.values())
    return dict(threads=threads, smem=smem, regs=regs, regs_known=regs_per_thread is not None,
                blocks_per_sm=blocks, limited_by=min(by, key=by.get), by=by,
                occupancy=blocks * warps / (lim["threads"] // 32))


def recorded(name: str) -> dict:
    """Measurements recorded on a GPU for the course and shipped with it (fp8lab/data/<name>.json), so that a
    learner without that GPU sees what it did: e.g. recorded("h200_tensor_cores"). Each file says its device,
    date and how it was made."""
    import json
    from importlib import resources

    path = resources.files("fp8lab") / "data" / f"{name}.json"
    if not path.is_file():
        names = sorted(p.name[:-5] for p in (resources.files("fp8lab") / "data").iterdir() if p.name.endswith(".json"))
        raise ValueError(f"name must be one of {names}, got {name!r}")
    return json.loads(path.read_text())

