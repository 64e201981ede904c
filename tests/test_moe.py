"""fp8lab.comm.moe: routing, the NumPy reference against plain loops, dispatch (FP8) / combine (BF16) through
torch.distributed in this process (world size 1) and in two spawned gloo ranks, the communication calculator by
hand, and bad input. The spawned ranks quantize with the NumPy spec (no numba, no simulator). Tests that run
collectives skip when PyTorch is not installed."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import fp8lab as fl
from fp8lab.numerics import formats
from fp8lab.comm import moe
from fp8lab.comm.moe_reference import PLAN_CASES


def _inputs(rng, tokens, hidden, experts, top_k):
    x = (rng.standard_normal((tokens, hidden)) * np.exp(rng.standard_normal((tokens, 1)))).astype(np.float32)
    ids, gates = moe.route(rng.standard_normal((tokens, experts)), top_k)
    return x, ids, gates


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


# ----------------------------------------------------------------------------------------------------------------
# Routing
# ----------------------------------------------------------------------------------------------------------------


def _top(sel, k, allowed=None):
    """Expert ids by descending selection score, ties to the lower id (a plain loop's rule)."""
    order = sorted(range(len(sel)), key=lambda e: (-sel[e], e))
    return [e for e in order if allowed is None or allowed[e]][:k]


def test_route_sigmoid_with_bias_matches_a_loop(rng):
    T, E, k = 23, 12, 5
    logits = rng.standard_normal((T, E))
    bias = 0.3 * rng.standard_normal(E)
    ids, gates = moe.route(logits, k, bias=bias)
    assert ids.dtype == np.int64 and gates.dtype == np.float32 and ids.shape == gates.shape == (T, k)
    for t in range(T):
        s = [1 / (1 + np.exp(-u)) for u in logits[t]]
        want = _top([s[e] + bias[e] for e in range(E)], k)
        assert ids[t].tolist() == want
        g = np.array([s[e] for e in want]) / sum(s[e] for e in want)  # the bias picks, it never weighs
        np.testing.assert_allclose(gates[t], g, rtol=2 ** -23)
    assert (gates > 0).all() and np.allclose(gates.sum(axis=1), 1, atol=1e-6)
    assert not np.array_equal(ids, moe.route(logits, k)[0]), "the bias must change some selection"


def test_route_softmax_unnormalised_matches_a_loop(rng):
    T, E, k = 17, 9, 3
    logits = 2 * rng.standard_normal((T, E)).astype(np.float32)
    ids, gates = moe.route(logits, k, score="softmax", normalize=False)
    for t in range(T):
        p = np.exp(logits[t].astype(np.float64))
        p /= p.sum()
        want = _top(list(p), k)
        assert ids[t].tolist() == want
        np.testing.assert_allclose(gates[t], p[want], rtol=2 ** -23)
    assert (gates.sum(axis=1) < 1).all()


def test_route_node_limited_matches_a_loop(rng):
    T, E, k, nodes, max_nodes = 40, 16, 4, 4, 2
    logits = rng.standard_normal((T, E))
    ids, gates = moe.route(logits, k, nodes=nodes, max_nodes=max_nodes)
    per = E // nodes
    free_ids, _ = moe.route(logits, k)
    assert max(len(set((free_ids[t] // per).tolist())) for t in range(T)) > max_nodes, "the limit must bite"
    for t in range(T):
        s = 1 / (1 + np.exp(-logits[t]))
        node_score = [sum(sorted(s[n * per:(n + 1) * per])[::-1][:k // max_nodes]) for n in range(nodes)]
        keep = _top(node_score, max_nodes)
        want = _top(list(s), k, allowed=[e // per in keep for e in range(E)])
        assert ids[t].tolist() == want
        assert len(set((ids[t] // per).tolist())) <= max_nodes
        np.testing.assert_allclose(gates[t], s[want] / s[want].sum(), rtol=2 ** -23)


# ----------------------------------------------------------------------------------------------------------------
# The NumPy reference
# ----------------------------------------------------------------------------------------------------------------


def test_reference_moe_matches_a_plain_loop(rng):
    T, H, E, k = 31, 150, 6, 3
    x, ids, gates = _inputs(rng, T, H, E, k)
    scale = rng.uniform(0.5, 2.0, E).astype(np.float32)

    def expert_fn(e, rows):  # row-wise, so a loop over single rows gives the same bits
        return np.tanh(rows * scale[e]).astype(np.float32)

    want = np.empty((T, H), np.float32)
    want_bf16 = np.empty((T, H), np.float32)
    for t in range(T):
        ys = [expert_fn(int(ids[t, j]), x[t:t + 1])[0] for j in range(k)]
        acc, acc_b = gates[t, 0] * ys[0], gates[t, 0] * formats.round_bf16(ys[0])
        for j in range(1, k):
            acc, acc_b = acc + gates[t, j] * ys[j], acc_b + gates[t, j] * formats.round_bf16(ys[j])
        want[t], want_bf16[t] = acc, acc_b
    got = moe.reference_moe(x, ids, gates, expert_fn, 3, experts=E)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    got_bf16 = moe.reference_moe(x, ids, gates, expert_fn, 3, experts=E, combine="bf16")
    np.testing.assert_array_equal(_bits(got_bf16), _bits(want_bf16))
    assert not np.array_equal(got, got_bf16)
    np.testing.assert_array_equal(_bits(moe.reference_moe(x, ids, gates, expert_fn, 1)), _bits(got))


def test_linear_experts_reference_matches_float64(rng):
    T, H, E, k = 27, 200, 4, 2
    x, ids, gates = _inputs(rng, T, H, E, k)
    fn = moe.LinearExperts(E, H, seed=int(rng.integers(1 << 30)))
    got = moe.reference_moe(x, ids, gates, fn, 2, experts=E)
    want = np.zeros((T, H))
    mag = np.zeros((T, H))
    for t in range(T):
        for j in range(k):
            y = x[t].astype(np.float64) @ fn.weight(int(ids[t, j])).astype(np.float64)
            want[t] += float(gates[t, j]) * y
            mag[t] += abs(float(gates[t, j])) * np.abs(y)
    assert np.all(np.abs(got - want) <= (k + 2) * 2.0 ** -23 * mag)


def _loop_plan(expert_ids, experts, world_size):
    """The send plan by plain loops: each token once to each rank holding one of its experts."""
    per_rank = experts // world_size
    plan = [([], []) for _ in range(world_size)]
    for t, row in enumerate(expert_ids):
        for r in range(world_size):
            here = [int(e) if e // per_rank == r else -1 for e in row]
            if max(here) >= 0:
                plan[r][0].append(t)
                plan[r][1].append(here)
    return plan


def test_send_plan_matches_a_loop(rng):
    T, E, k, W = 29, 12, 3, 4
    ids, _ = moe.route(rng.standard_normal((T, E)), k)
    got = moe.send_plan(ids, E, W)
    for (rows, local), (want_rows, want_local) in zip(got, _loop_plan(ids, E, W)):
        assert rows.dtype == np.int64 and local.dtype == np.int32 and local.shape == (len(rows), k)
        assert rows.tolist() == want_rows and local.tolist() == want_local
    assert sum(len(r) for r, _ in got) < T * k  # some token has two experts on one rank: sent there once


def test_try_send_plan_passes_a_right_plan_and_names_a_wrong_one(rng):
    rows = moe.try_send_plan(_loop_plan, rng=rng)
    assert [c for c, _ in rows] == [f"{T} tokens, {E} experts on {W} ranks, top-{k}" for T, E, W, k in PLAN_CASES]
    assert all("equal to the library's" in r for _, r in rows)

    def per_expert(expert_ids, experts, world_size):  # a token sent once per expert, not once per rank
        plan = [([], []) for _ in range(world_size)]
        for t, row in enumerate(expert_ids):
            for j, e in enumerate(row):
                r = int(e) // (experts // world_size)
                plan[r][0].append(t)
                plan[r][1].append([int(e) if i == j else -1 for i in range(len(row))])
        return plan

    with pytest.raises(AssertionError, match=r"rank \d+ should get \d+ token rows, yours sends \d+"):
        moe.try_send_plan(per_expert, rng=rng)

    def all_slots(expert_ids, experts, world_size):  # the right rows, but every slot's expert id
        return [(r, np.asarray(expert_ids)[r]) for r, _ in moe.send_plan(expert_ids, experts, world_size)]

    with pytest.raises(AssertionError, match=r"local expert ids should be"):
        moe.try_send_plan(all_slots, rng=rng)
    with pytest.raises(AssertionError, match=r"one \(rows, local_ids\) pair per rank"):
        moe.try_send_plan(lambda ids, e, w: [], rng=rng)
    with pytest.raises(TypeError, match=r"^fn must be a function"):
        moe.try_send_plan(None)


def test_reference_dispatch_matches_a_loop(rng):
    T, H, E, k, W = 19, 140, 6, 2, 3
    x, ids, gates = _inputs(rng, T, H, E, k)
    codes, scales = moe.quantize_tokens(x)
    got = moe.reference_dispatch(x, ids, E, W)
    chunks = np.array_split(np.arange(T), W)
    for r in range(W):
        want = [(s, i, t) for s, c in enumerate(chunks) for i, t in enumerate(c) if (ids[t] // (E // W) == r).any()]
        g = got[r]
        assert g.source.tolist() == [s for s, _, _ in want] and g.token.tolist() == [i for _, i, _ in want]
        rows = [t for _, _, t in want]
        np.testing.assert_array_equal(g.codes, codes[rows])
        np.testing.assert_array_equal(_bits(g.scales), _bits(scales[rows]))
        for n, t in enumerate(rows):
            assert g.expert_ids[n].tolist() == [int(e) if e // (E // W) == r else -1 for e in ids[t]]
    assert sum(len(g.token) for g in got) == sum(len(set((ids[t] // (E // W)).tolist())) for t in range(T))


def test_tokens_are_quantized_as_fp8lab_quantize_does(rng):
    """The dispatch's NumPy quantizer writes the codes and scales of fl.quantize's tile kernel, bit for bit."""
    x = _inputs(rng, 5, 200, 2, 1)[0]
    codes, scales = moe.quantize_tokens(x)
    q = fl.quantize(x, "e4m3", "tile")
    np.testing.assert_array_equal(codes, q.data)
    np.testing.assert_array_equal(_bits(scales), _bits(q.scale))
    np.testing.assert_array_equal(_bits(moe.dequantize_tokens(codes, scales)), _bits(fl.dequantize(q)))


# ----------------------------------------------------------------------------------------------------------------
# The communicating version
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture
def group_of_one():
    """A gloo process group of one rank in this process."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{moe.free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_dispatch_combine_world_size_1(rng, group_of_one):
    T, H, E, k = int(rng.integers(20, 40)), int(rng.integers(129, 300)), 5, 3
    x, ids, gates = _inputs(rng, T, H, E, k)
    fn = moe.LinearExperts(E, H, seed=int(rng.integers(1 << 30)))
    received, handle = moe.dispatch(x, ids, E)
    want = moe.reference_dispatch(x, ids, E, 1)[0]
    np.testing.assert_array_equal(received.codes, want.codes)
    np.testing.assert_array_equal(_bits(received.scales), _bits(want.scales))
    np.testing.assert_array_equal(received.expert_ids, want.expert_ids)
    np.testing.assert_array_equal(received.token, np.arange(T))
    y = moe.run_experts(received, fn)
    assert y.shape == (T * k, H) and np.isfinite(y).all()
    out = moe.combine(y, handle, gates)
    assert np.isfinite(out).all()
    deq = moe.dequantize_tokens(*moe.quantize_tokens(x))
    np.testing.assert_array_equal(_bits(out), _bits(moe.reference_moe(deq, ids, gates, fn, 1, combine="bf16")))
    err = np.abs(out.astype(np.float64) - moe.reference_moe(x, ids, gates, fn, 1))
    assert np.all(err <= moe.fp8_error_bound(x, ids, gates, fn))
    assert handle.bytes_sent == {"dispatch": 0, "combine": 0}  # nothing crossed to another rank
    with pytest.raises(ValueError, match="x must be finite"):
        moe.dispatch(np.where(np.arange(H) == 3, np.inf, x).astype(np.float32), ids, E)
    with pytest.raises(ValueError, match=r"^y must have shape"):
        moe.combine(y[1:], handle, gates)


def test_run_alltoall_gloo_two_ranks(rng):
    pytest.importorskip("torch")
    W, T, H, E, k = 2, int(rng.integers(17, 40)), int(rng.integers(129, 260)), 6, 3
    seed = int(rng.integers(1 << 30))
    r = moe.run_alltoall(W, T, H, E, k, backend="gloo", seed=seed)
    assert (r.world_size, r.backend, r.tokens, r.hidden) == (W, "gloo", T, H)
    assert r.mismatches == 0 and r.max_abs_diff_fp8 == 0  # bit-exact: the reference on the dequantized tokens
    assert np.isfinite(r.max_abs_err) and 0 < r.max_abs_err and r.bound_ratio <= 1
    rows = pairs = 0  # rows and expert outputs that cross to the other rank
    for src in range(W):
        ids = moe.alltoall_inputs(src, T, H, E, k, seed)[1]
        dest = ids // (E // W)
        rows += sum(len(set(d.tolist()) - {src}) for d in dest)
        pairs += int(np.count_nonzero(dest != src))
    assert r.dispatch_bytes == rows * (H + 4 * -(-H // 128) + 4 * (k + 1))
    assert r.dispatch_bytes_bf16 == rows * (2 * H + 4 * (k + 1))
    assert r.combine_bytes == pairs * 2 * H
    assert all(s >= 0 for s in (r.dispatch_s, r.dispatch_comm_s, r.experts_s, r.combine_s, r.combine_comm_s))


@pytest.mark.gpu
def test_run_alltoall_nccl():
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL all-to-all needs at least 2 CUDA devices")
    r = moe.run_alltoall(2, 1000, 1024, 16, 8, seed=3)
    assert r.backend == "nccl" and r.mismatches == 0 and r.bound_ratio <= 1 and r.dispatch_bytes > 0


def test_missing_torch_says_so(monkeypatch, rng):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    x, ids, _ = _inputs(rng, 4, 32, 2, 1)
    with pytest.raises(ImportError, match="needs PyTorch"):
        moe.dispatch(x, ids, 2)


# ----------------------------------------------------------------------------------------------------------------
# The calculator
# ----------------------------------------------------------------------------------------------------------------


def test_comm_cost_by_hand():
    c = moe.comm_cost(4096)  # DeepSeek-V3: hidden 7168, 8 experts, <= 4 nodes, 8 GPUs/node, NVLink 160, IB 50 GB/s
    assert (c.dispatch_row_bytes, c.combine_row_bytes) == (7168 + 56 * 4, 2 * 7168) == (7392, 14336)
    assert (c.ib_rows, c.nvlink_rows) == (4, 8)
    assert (c.dispatch_ib_bytes, c.dispatch_nvlink_bytes) == (4 * 7392, 8 * 7392)
    assert (c.combine_ib_bytes, c.combine_nvlink_bytes) == (4 * 14336, 8 * 14336)
    assert c.dispatch_ib_s == pytest.approx(4096 * 29568 / 50e9) and c.dispatch_ib_s == pytest.approx(2.42221e-3, 1e-5)
    assert c.dispatch_nvlink_s == pytest.approx(4096 * 59136 / 160e9)
    assert c.dispatch_s == c.dispatch_ib_s  # IB is the bottleneck: 591.36 ns vs 369.6 ns per token
    assert c.combine_s == c.combine_ib_s == pytest.approx(4096 * 1146.88e-9)
    assert c.total_s == pytest.approx(4096 * (591.36 + 1146.88) * 1e-9)
    assert c.fp8_dispatch_saving == pytest.approx(1 - 7392 / 14336) == pytest.approx(0.484375)
    assert c.fp8_total_saving == pytest.approx(1 - 1738.24 / 2293.76)
    b = moe.comm_cost(4096, dispatch="bf16")
    assert b.dispatch_row_bytes == 14336 and b.total_s == pytest.approx(4096 * 2293.76e-9)
    # NVLink carries 160/50 = 3.2 rows per IB row: 12 experts over 4 nodes stay IB-bound, 13 do not (section 3.2.2)
    assert moe.comm_cost(1, top_k=12).dispatch_s == moe.comm_cost(1, top_k=12).dispatch_ib_s
    c13 = moe.comm_cost(1, top_k=13)
    assert c13.dispatch_s == c13.dispatch_nvlink_s == pytest.approx(13 * 7392 / 160e9)
    # a ragged last tile still has a scale; fewer experts than nodes need fewer IB rows
    assert moe.comm_cost(1, hidden=200).dispatch_row_bytes == 200 + 2 * 4
    assert moe.comm_cost(1, top_k=2).ib_rows == 2


def test_plot_comm_cost():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = moe.plot_comm_cost(tokens=[256, 1024, 4096])
    lines = fig.axes[0].get_lines()
    assert len(lines) == 4
    by_label = {ln.get_label(): ln.get_ydata() for ln in lines}
    ib_fp8 = by_label["IB, FP8 dispatch + BF16 combine"]
    assert ib_fp8[-1] == pytest.approx(4096 * (591.36 + 1146.88) * 1e-6)  # ms
    assert all(by_label["IB, BF16 dispatch + BF16 combine"] > ib_fp8)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------------------


def _ok(rng):
    x, ids, gates = _inputs(rng, 6, 40, 4, 2)
    return x, ids, gates, moe.LinearExperts(4, 40)


@pytest.mark.parametrize("call, exc, match", [
    (lambda x, ids, g, fn: moe.route(np.zeros((3, 4)) + 1, 5), ValueError, r"^top_k must be at most"),
    (lambda x, ids, g, fn: moe.route(np.full((3, 4), np.nan), 2), ValueError, r"^logits must be finite"),
    (lambda x, ids, g, fn: moe.route(np.ones(4), 2), ValueError, r"^logits must be 2-D"),
    (lambda x, ids, g, fn: moe.route(np.ones((3, 4)), 2.0), TypeError, r"^top_k must be a positive int"),
    (lambda x, ids, g, fn: moe.route(np.ones((3, 4)), 2, score="relu"), ValueError, r"^score must be one of"),
    (lambda x, ids, g, fn: moe.route(np.ones((3, 4)), 2, bias=np.ones(3)), ValueError, r"^bias must have shape"),
    (lambda x, ids, g, fn: moe.route(np.ones((3, 4)), 2, nodes=2), ValueError, r"^nodes and max_nodes"),
    (lambda x, ids, g, fn: moe.route(np.ones((3, 6)), 2, nodes=4, max_nodes=1), ValueError, r"^nodes must divide"),
    (lambda x, ids, g, fn: moe.route(np.ones((3, 8)), 3, nodes=4, max_nodes=1), ValueError, r"^max_nodes must leave"),
    (lambda x, ids, g, fn: moe.reference_moe(x, ids, g, fn, 3, experts=4), ValueError,
     r"^experts must be a multiple of world_size \(3\)"),
    (lambda x, ids, g, fn: moe.reference_moe(x, ids, g, fn, 0), ValueError, r"^world_size must be a positive int"),
    (lambda x, ids, g, fn: moe.reference_moe(np.where(x > 1, np.nan, x), ids, g, fn), ValueError,
     r"^x must be finite"),
    (lambda x, ids, g, fn: moe.reference_moe(x, ids + 4, g, fn, experts=4), ValueError,
     r"^expert_ids must hold expert ids in \[0, 4\)"),
    (lambda x, ids, g, fn: moe.reference_moe(x, ids[:, [0, 0]], g, fn), ValueError,
     r"^expert_ids must not repeat an expert"),
    (lambda x, ids, g, fn: moe.reference_moe(x, ids.astype(np.float32), g, fn), TypeError,
     r"^expert_ids must have an integer dtype"),
    (lambda x, ids, g, fn: moe.reference_moe(x, ids, g[:, :1], fn), ValueError, r"^gates must have shape"),
    (lambda x, ids, g, fn: moe.reference_moe(x, ids, g, "fn"), TypeError, r"^expert_fn must be callable"),
    (lambda x, ids, g, fn: moe.reference_moe(x, ids, g, lambda e, r: r.astype(np.float64)), TypeError,
     r"^expert_fn\(\d+, rows\) must return a float32"),
    (lambda x, ids, g, fn: moe.reference_moe(x, ids, g, lambda e, r: r[:, :3]), ValueError,
     r"^expert_fn\(\d+, rows\) must return an array of the rows' shape"),
    (lambda x, ids, g, fn: moe.reference_moe(x, ids, g, fn, combine="fp8"), ValueError, r"^combine must be one of"),
    (lambda x, ids, g, fn: moe.reference_dispatch(x, ids, 4, 0), ValueError, r"^world_size must be a positive int"),
    (lambda x, ids, g, fn: moe.reference_dispatch(x[:, :0], ids, 4, 1), ValueError, r"^x must not be empty"),
    (lambda x, ids, g, fn: moe.expert_rank(ids, 4, 3), ValueError, r"^experts must be a multiple of world_size"),
    (lambda x, ids, g, fn: moe.run_alltoall(0, 8, 32, 4, 2), ValueError, r"^world_size must be a positive int"),
    (lambda x, ids, g, fn: moe.run_alltoall(2, 8, 32, 5, 2), ValueError, r"^experts must be a multiple of world_size"),
    (lambda x, ids, g, fn: moe.run_alltoall(2, 8, 32, 4, 5), ValueError, r"^top_k must be at most experts"),
    (lambda x, ids, g, fn: moe.run_alltoall(2, 8, 32, 4, 2, backend="mpi"), ValueError, r"^backend must be one of"),
    (lambda x, ids, g, fn: moe.run_alltoall(2, 8, 32, 4, 2, seed=-1), ValueError, r"^seed must be an int >= 0"),
    (lambda x, ids, g, fn: moe.comm_cost(0), ValueError, r"^tokens must be a positive int"),
    (lambda x, ids, g, fn: moe.comm_cost(8, hidden=-1), ValueError, r"^hidden must be a positive int"),
    (lambda x, ids, g, fn: moe.comm_cost(8, ib_gbs=float("nan")), ValueError, r"^ib_gbs must be a positive finite"),
    (lambda x, ids, g, fn: moe.comm_cost(8, dispatch="fp16"), ValueError, r"^dispatch must be one of"),
    (lambda x, ids, g, fn: moe.comm_cost(8, combine="fp8"), ValueError, r"^combine must be one of"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input(rng, call, exc, match):
    with pytest.raises(exc, match=match):
        call(*_ok(rng))


def test_dispatch_needs_an_initialized_group(rng):
    pytest.importorskip("torch")
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    x, ids, _ = _inputs(rng, 4, 32, 2, 1)
    with pytest.raises(RuntimeError, match="not initialized"):
        moe.dispatch(x, ids, 2)


def test_nccl_without_gpus_is_refused():
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs for NCCL")
    with pytest.raises(ValueError, match=r"^backend 'nccl' needs one CUDA device per rank"):
        moe.run_alltoall(2, 8, 32, 4, 2, backend="nccl")
