"""A peer for `fp8lab bench fp8_gemm`: block-scaled FP8 GEMM in Triton, in the style of DeepSeek-V3's published
inference kernel (github.com/deepseek-ai/DeepSeek-V3, inference/kernel.py): `tl.dot` on FP8 over one 128-wide
K-group, the partial sum scaled by a's 1 x 128 tile scales and b's 128 x 128 block scale and added in FP32.

Imported only by the benchmark, inside an import check: Triton is never a dependency of fp8lab.
"""

import triton
import triton.language as tl

CONFIGS = [(128, 128, 4, 8), (128, 128, 3, 8), (64, 128, 4, 4), (128, 64, 4, 4)]  # BLOCK_M, BLOCK_N, stages, warps


@triton.jit
def _fp8_gemm_kernel(a_ptr, b_ptr, c_ptr, a_s_ptr, b_s_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    groups = tl.cdiv(K, BLOCK_K)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[None, :] * K + offs_k[:, None]
    a_s_ptrs = a_s_ptr + offs_m * groups          # a's scales: (M, groups)
    b_s_ptrs = b_s_ptr + (offs_n // BLOCK_K) * groups  # b's scales: (ceil(N/128), groups)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(groups):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - i * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - i * BLOCK_K, other=0.0)
        a_s = tl.load(a_s_ptrs)
        b_s = tl.load(b_s_ptrs)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]  # the promotion: one K-group's sum, scaled, in FP32
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
        a_s_ptrs += 1
        b_s_ptrs += 1
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def fp8_gemm(a, a_s, b, b_s, c, config=CONFIGS[0]):
    """c (M, N) float32 = (a * a_s) @ (b * b_s).T for torch tensors: a (M, K) and b (N, K) float8_e4m3fn, a_s (M,
    ceil(K/128)) and b_s (ceil(N/128), ceil(K/128)) float32."""
    M, K = a.shape
    N = b.shape[0]
    bm, bn, stages, warps = config
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))
    _fp8_gemm_kernel[grid](a, b, c, a_s, b_s, M, N, K, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, num_stages=stages,
                           num_warps=warps)
    return c
