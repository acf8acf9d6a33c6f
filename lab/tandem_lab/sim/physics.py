"""Per-instance capacity: how long a prefill takes, how long a decode step takes, how much KV fits.

What it owns: the one physics module shared by the engine, the policies' offline profiles (B3) and
the oracle, behind one interface (:class:`CapacityModel`): ``prefill_time``, ``decode_step_time``,
``kv_bytes``, ``load_time``. Two implementations: :class:`Roofline` (formulas below, parameters from
``params.yaml``) and :class:`ProfileTable` (measured tables, bilinear interpolation — the Dynamo
planner's shape; calibrate on real hardware when available).

Must not: keep state between calls or draw random numbers (load-time *kinds* are drawn by the engine).

Roofline (benchmarks.md §3.2; g GPUs per instance, BW = g × HBM bandwidth × η_bw):

- decode step: t(B, Σc) = (W_touched(B) + Σc·b_kv) / BW + t_comm, with
  W_touched(B) = W_experts·(1 − (1 − k/E)^B) + W_dense; per-user rate m/t, instance rate B·m/t.
- KV residency: KV_cap = HBM_inst − weights − reserve; B_max(c) = ⌊KV_cap / (c·b_kv)⌋.
- prefill of u uncached tokens after a cached prefix c₀:
  FLOPs_lin = f_lin·u with f_lin ≈ 2·N_active + projections (74 GFLOP/token; FP8 rate, η_lin),
  FLOPs_att = 2·L·n_h·(d_qk + d_v)·(u·c₀ + u²/2)
  (BF16 rate, η_att); t = FLOPs_lin/(η_lin·F8·g) + FLOPs_att/(η_att·F16·g) + overhead.

Worked example (shipped parameters, checked by a unit test): B = 32 sequences of 120 k context:
experts touched 1 − (1 − 8/384)^32 = 49 %, bytes/step = 478·0.49 + 11 + 32·120 k·34.3 KiB ≈ 380 GB,
t = 380 GB / 24 TB/s = 15.8 ms → 63 tok/s per user, 2.0 k tok/s per instance. Prefill per uncached
token at 120 k context: 74 GFLOP linear + 600 GFLOP attention → ≈ 1.0 k tok/s per GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tandem_lab.sim.config import SimParams


class CapacityModel(Protocol):
    """What the engine, the oracle and the planner baseline need to know about one instance."""

    gpus: int
    kv_capacity_tokens: float
    """Tokens of KV that fit next to the weights and the reserve."""

    def prefill_time(self, uncached: float, cached: float) -> float:
        """Seconds to prefill ``uncached`` tokens after ``cached`` tokens already in KV."""
        ...

    def decode_step_time(self, batch: int, context_tokens: float) -> float:
        """Seconds per decode step with ``batch`` sequences holding ``context_tokens`` in total."""
        ...

    def kv_bytes(self, tokens: float) -> float:
        """Bytes of KV for ``tokens`` tokens."""
        ...

    def load_time(self, kind: str) -> float:
        """Seconds to load the model (``cold``, ``warm`` or ``restore``)."""
        ...


@dataclass(frozen=True)
class Roofline:
    """The roofline model of benchmarks.md §3.2 (formulas in the module docstring)."""

    gpus: int
    linear_flops_per_token: float
    experts: int
    experts_per_token: int
    expert_weight_bytes: float
    dense_weight_bytes: float
    layers: int
    heads: int
    d_qk: int
    d_v: int
    kv_bytes_per_token: float
    bandwidth: float
    """Instance HBM bandwidth × η_bw (bytes/s)."""
    linear_flops: float
    """Effective FLOP/s of the instance for the linear part (η_lin · F8 · g)."""
    attention_flops: float
    """Effective FLOP/s of the instance for attention (η_att · F16 · g)."""
    overhead_s: float
    comm_s: float
    tokens_per_step: float
    kv_capacity_tokens: float
    load_times: tuple[tuple[str, float], ...]

    @classmethod
    def from_params(cls, p: SimParams) -> Roofline:
        g = p.instance.gpus
        hbm = p.hardware.hbm_bytes * g
        free = hbm - p.model.weight_bytes - p.instance.hbm_reserve_fraction * hbm
        if free <= 0:
            raise ValueError("weights and reserve exceed instance HBM")
        return cls(
            gpus=g,
            linear_flops_per_token=p.model.linear_flops_per_token,
            experts=p.model.experts,
            experts_per_token=p.model.experts_per_token,
            expert_weight_bytes=p.model.expert_weight_bytes,
            dense_weight_bytes=p.model.dense_weight_bytes,
            layers=p.model.layers,
            heads=p.model.attention_heads,
            d_qk=p.model.d_qk,
            d_v=p.model.d_v,
            kv_bytes_per_token=p.model.kv_bytes_per_token,
            bandwidth=p.hardware.hbm_bandwidth * g * p.instance.eta_bandwidth,
            linear_flops=p.instance.eta_linear * p.hardware.fp8_flops * g,
            attention_flops=p.instance.eta_attention * p.hardware.bf16_flops * g,
            overhead_s=p.instance.prefill_overhead_s,
            comm_s=p.instance.decode_comm_s,
            tokens_per_step=p.instance.tokens_per_step,
            kv_capacity_tokens=free / p.model.kv_bytes_per_token,
            load_times=tuple(sorted(p.lifecycle.load_times_s.items())),
        )

    # --- prefill ---------------------------------------------------------------------------------

    def prefill_flops(self, uncached: float, cached: float) -> tuple[float, float]:
        """(linear FLOPs, attention FLOPs) of ``uncached`` tokens after ``cached`` ones."""
        lin = self.linear_flops_per_token * uncached
        att = 2.0 * self.layers * self.heads * (self.d_qk + self.d_v) * (uncached * cached + uncached * uncached / 2.0)
        return lin, att

    def prefill_time(self, uncached: float, cached: float) -> float:
        lin, att = self.prefill_flops(uncached, cached)
        return lin / self.linear_flops + att / self.attention_flops + self.overhead_s

    def prefill_times(
        self, uncached: npt.NDArray[np.float64], cached: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Vectorised :meth:`prefill_time` (same formula)."""
        lin = self.linear_flops_per_token * uncached
        att = 2.0 * self.layers * self.heads * (self.d_qk + self.d_v) * (uncached * cached + uncached * uncached / 2.0)
        out: npt.NDArray[np.float64] = lin / self.linear_flops + att / self.attention_flops + self.overhead_s
        return out

    # --- decode ----------------------------------------------------------------------------------

    def touched_fraction(self, batch: int) -> float:
        """Share of expert weights touched by a batch: 1 − (1 − k/E)^B."""
        if batch <= 0:
            return 0.0
        return 1.0 - (1.0 - self.experts_per_token / self.experts) ** batch

    def weight_bytes_touched(self, batch: int) -> float:
        if batch <= 0:
            return 0.0
        return self.expert_weight_bytes * self.touched_fraction(batch) + self.dense_weight_bytes

    def weight_bytes_table(self, max_batch: int) -> list[float]:
        """W_touched(B) for B = 0..max_batch (the engine indexes it in its hot path)."""
        return [self.weight_bytes_touched(b) for b in range(max_batch + 1)]

    def decode_step_time(self, batch: int, context_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        return (
            self.weight_bytes_touched(batch) + context_tokens * self.kv_bytes_per_token
        ) / self.bandwidth + self.comm_s

    def kv_bytes(self, tokens: float) -> float:
        return tokens * self.kv_bytes_per_token

    def load_time(self, kind: str) -> float:
        for name, seconds in self.load_times:
            if name == kind:
                return seconds
        raise KeyError(f"unknown load kind {kind!r}")

    # --- derived capacities (oracle, planner profile) --------------------------------------------

    def max_batch_for_context(self, context: float) -> int:
        """B_max(c) = ⌊KV_cap / c⌋ (c in tokens per sequence)."""
        if context <= 0:
            return 1 << 30
        return int(self.kv_capacity_tokens // context)

    def best_decode_batch(self, context: float, tpot_s: float, max_num_seqs: int) -> int:
        """Largest batch (≥ 1) whose step time at per-sequence ``context`` stays within ``tpot_s`` per token,
        within ``max_num_seqs`` and the KV limit. 1 when even a single sequence misses the target."""
        limit = max(1, min(max_num_seqs, self.max_batch_for_context(context)))
        best = 1
        for b in range(1, limit + 1):
            if self.decode_step_time(b, b * context) / self.tokens_per_step <= tpot_s:
                best = b
            else:
                break
        return best

    def decode_throughput(self, batch: int, context: float) -> float:
        """Instance output tokens/s at ``batch`` sequences of ``context`` tokens."""
        if batch <= 0:
            return 0.0
        return batch * self.tokens_per_step / self.decode_step_time(batch, batch * context)


@dataclass(frozen=True)
class ProfileTable:
    """Measured capacity tables with bilinear interpolation (clamped at the grid edges).

    ``prefill_s[i][j]``: prefill seconds for ``uncached_grid[i]`` uncached tokens after
    ``cached_grid[j]`` cached ones; ``itl_s[i][j]``: decode step seconds at ``batch_grid[i]`` sequences
    holding ``kv_grid[j]`` tokens in total. Build one from hardware measurements, or from a
    :class:`Roofline` with :meth:`from_model` (used by tests to check interpolation).
    """

    gpus: int
    kv_capacity_tokens: float
    kv_bytes_per_token: float
    uncached_grid: tuple[float, ...]
    cached_grid: tuple[float, ...]
    prefill_s: tuple[tuple[float, ...], ...]
    batch_grid: tuple[float, ...]
    kv_grid: tuple[float, ...]
    itl_s: tuple[tuple[float, ...], ...]
    load_times: tuple[tuple[str, float], ...]

    @classmethod
    def from_model(
        cls,
        model: Roofline,
        uncached_grid: Sequence[float],
        cached_grid: Sequence[float],
        batch_grid: Sequence[int],
        kv_grid: Sequence[float],
    ) -> ProfileTable:
        return cls(
            gpus=model.gpus,
            kv_capacity_tokens=model.kv_capacity_tokens,
            kv_bytes_per_token=model.kv_bytes_per_token,
            uncached_grid=tuple(float(x) for x in uncached_grid),
            cached_grid=tuple(float(x) for x in cached_grid),
            prefill_s=tuple(tuple(model.prefill_time(u, c) for c in cached_grid) for u in uncached_grid),
            batch_grid=tuple(float(b) for b in batch_grid),
            kv_grid=tuple(float(x) for x in kv_grid),
            itl_s=tuple(tuple(model.decode_step_time(int(b), k) for k in kv_grid) for b in batch_grid),
            load_times=model.load_times,
        )

    def prefill_time(self, uncached: float, cached: float) -> float:
        return _bilinear(self.uncached_grid, self.cached_grid, self.prefill_s, uncached, cached)

    def decode_step_time(self, batch: int, context_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        return _bilinear(self.batch_grid, self.kv_grid, self.itl_s, float(batch), context_tokens)

    def kv_bytes(self, tokens: float) -> float:
        return tokens * self.kv_bytes_per_token

    def load_time(self, kind: str) -> float:
        for name, seconds in self.load_times:
            if name == kind:
                return seconds
        raise KeyError(f"unknown load kind {kind!r}")


def _bracket(grid: Sequence[float], x: float) -> tuple[int, float]:
    """Index i and weight w so that x ≈ (1 − w)·grid[i] + w·grid[i + 1], clamped to the grid."""
    if len(grid) == 1 or x <= grid[0]:
        return 0, 0.0
    if x >= grid[-1]:
        return len(grid) - 2, 1.0
    lo, hi = 0, len(grid) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if grid[mid] <= x:
            lo = mid
        else:
            hi = mid
    return lo, (x - grid[lo]) / (grid[lo + 1] - grid[lo])


def _bilinear(xs: Sequence[float], ys: Sequence[float], table: Sequence[Sequence[float]], x: float, y: float) -> float:
    i, wx = _bracket(xs, x)
    j, wy = _bracket(ys, y)
    i1 = min(i + 1, len(xs) - 1)
    j1 = min(j + 1, len(ys) - 1)
    top = (1 - wy) * table[i][j] + wy * table[i][j1]
    bottom = (1 - wy) * table[i1][j] + wy * table[i1][j1]
    return (1 - wx) * top + wx * bottom


def ttft_budgets(
    input_tokens: npt.NDArray[np.int64], short_s: float, long_s: float, l_short: float, l_long: float
) -> npt.NDArray[np.float64]:
    """Vectorised :func:`ttft_budget`."""
    frac = np.clip((input_tokens.astype(np.float64) - l_short) / (l_long - l_short), 0.0, 1.0)
    out: npt.NDArray[np.float64] = short_s + (long_s - short_s) * frac
    return out


def ceil_div(a: float, b: float) -> int:
    return math.ceil(a / b - 1e-9) if b > 0 else 0
