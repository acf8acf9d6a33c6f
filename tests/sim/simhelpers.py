"""Shared helpers for the simulator tests (tests only)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tandem_lab.sim.config import SimParams, load_params
from tandem_lab.sim.engine import SimOptions, SimResult, Simulation
from tandem_lab.sim.metrics import Observation
from tandem_lab.sim.physics import Roofline
from tandem_lab.sim.policies.base import FleetTarget, Topology
from tandem_lab.sim.traces import traces_dir
from tandem_lab.sim.workload import Workload


def trace_file(name: str) -> Path:
    path = traces_dir() / name
    if not path.exists():
        pytest.fail(f"trace not present: {path} (the shared traces back the must-show counts; set TANDEM_TRACES_DIR)")
    return path


@dataclass
class FixedFleet:
    """A test policy: a fixed fleet, never changed."""

    target: FleetTarget
    topology: Topology = "pools"
    name: str = "fixed"
    interval_s: float = 1e9

    def initial_target(self) -> FleetTarget:
        return self.target

    def decide(self, obs: Observation) -> FleetTarget | None:
        return None


def simulate(
    workload: Workload,
    target: FleetTarget,
    *,
    topology: Topology = "pools",
    params: SimParams | None = None,
    router: str = "prefix-hash",
    keys: Sequence[int] = (),
    infinite_cache: bool = False,
    seed: int = 0,
) -> tuple[Simulation, SimResult]:
    """Run the engine on ``workload`` with a fixed fleet."""
    p = params or load_params()
    cap = Roofline.from_params(p)
    sim = Simulation(
        p,
        cap,
        workload,
        FixedFleet(target, topology),
        SimOptions(
            topology=topology,
            router=router,
            routing_keys=keys,
            horizon_s=workload.duration_s,
            default_shape=target.shape or (1, 1),
            infinite_local_cache=infinite_cache,
        ),
        np.random.default_rng(seed),
        np.random.default_rng(seed + 1).uniform(size=len(workload)),
    )
    return sim, sim.run()


def tiny_workload(
    arrivals: Sequence[float], inputs: Sequence[int], outputs: Sequence[int], blocks: Sequence[Sequence[int]]
) -> Workload:
    """A hand-written workload (one explicit block list per request)."""
    flat: list[int] = []
    starts: list[int] = []
    for ids in blocks:
        starts.append(len(flat))
        flat.extend(ids)
    n = len(arrivals)
    return Workload(
        name="tiny",
        arrival_s=np.asarray(arrivals, dtype=np.float64),
        input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        block_start=np.asarray(starts, dtype=np.int64),
        block_count=np.asarray([len(b) for b in blocks], dtype=np.int64),
        tail_id=np.full(n, -1, dtype=np.int64),
        id_offset=np.zeros(n, dtype=np.int64),
        blocks=np.asarray(flat, dtype=np.int64),
        duration_s=float(max(arrivals)) + 600.0,
    )


def spy_on(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Any]:
    """Replace ``module.name`` by a pass-through that records each return value (which core function ran)."""
    calls: list[Any] = []
    real: Callable[..., Any] = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append(out)
        return out

    monkeypatch.setattr(module, name, spy)
    return calls


def pair_fleet(pairs: int, shape: tuple[int, int] = (1, 1), max_instances: int = 100) -> Simulation:
    """A one-request simulation with ``pairs`` Ready pair groups of ``shape``: for driving the fleet by hand
    (``apply_target``, ``converge_revisions``) without running the clock."""
    p = load_params()
    wl = tiny_workload([0.0], [1024], [10], [[1, 2]])
    sim = Simulation(
        p,
        Roofline.from_params(p),
        wl,
        FixedFleet(FleetTarget(pairs=pairs, shape=shape), topology="pairs"),
        SimOptions(topology="pairs", horizon_s=wl.duration_s, default_shape=shape, max_instances=max_instances),
        np.random.default_rng(0),
        np.ones(1),
    )
    sim.apply_target(FleetTarget(pairs=pairs, shape=shape), initial=True)
    return sim
