"""A P:D change without rolling every pair group: groups change shape as the fleet cycles, surge first.

What it owns: the decisions of design note 012 §5 ("shape as groups cycle") that the pool planner applies.
The pool's P:D (``spec.pairs.{prefill,decode}.instances``) is the *target shape*, not part of the revision
(``tandem.api.revision.same_stack``). Each group keeps the shape it was built with (its pods'
``TANDEM_PAIR_SHAPE``), and:

- a new group (scale-up, a replacement, a canary) is built in the target shape;
- a scale-down drains off-target groups first (:func:`drain_order`);
- while nothing else moves (no rollout, no drain, every live group Ready) and one more target-shaped group fits
  beside them (free GPUs, ``maxSurge``, ``gpuBudget``), one off-target group is replaced *surge first*
  (:func:`reshape_surge`): the planner asks for one more group of the stable revision, and once it is Ready the
  usual scale-down drains an off-target one. Capacity never drops, no canary analysis runs (the stack did not
  change), and only off-target groups reload.
- with work planning's need known, a replacement starts only while the mix costs more than
  :data:`TAX_BOUND` over the target shape for that need (``tandem.core.capacity.instances_for``: the instances
  of the groups the autoscaler would keep, against target-shaped groups alone). A reload is minutes of a
  group's GPUs; a mix within the bound keeps its groups and takes the target shape as it scales
  (``settled``: the P:D adjustment is not held for it). Without a need every off-target group is replaced.
- a new shape can hold fewer instances of one role than the group it replaces (1P:3D → 1P:1D): the drain
  waits while the groups left would hold fewer instances of a role than work planning's last evaluation needed
  (``tandem.core.autoscale.last_work_need``). That evaluation counted the groups as they are
  (``tandem.core.capacity.groups_for``), so it asks for one more group at its next pass; the replacement is
  kept until then instead of leaving the role short for a model load. Not at ``maxPairs`` (no more groups can
  come: the drain goes ahead) and not on a need older than a few evaluations.

Why not add or remove instances inside a group: a 1P:1D group fills one 8-GPU node, so an added instance
would land on another node and send P→D over the NIC (the pair invariant is one node, one revision). Why not
replace all at once: a group reload is minutes of a node's capacity; one at a time keeps the fleet serving.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from tandem.core.capacity import instances_for

TAX_BOUND: Final = 0.15
"""Replace off-target groups only while the mix needs more than 15 % more instances than the target shape for
the same need (design note 012 §5): below that, a reload costs more than it saves."""


class GroupState(Protocol):
    """What these decisions read of a pair group: ``tandem.core.pairs.PairView`` in the operator, the
    simulator's own view of its groups in the lab (so both run this module, not a copy of it)."""

    @property
    def index(self) -> int: ...

    @property
    def revision(self) -> str: ...

    @property
    def counts(self) -> tuple[int, int]: ...

    @property
    def ready(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    @property
    def live(self) -> bool: ...


@dataclass(frozen=True)
class ReshapeDecision:
    """One pass's answer: extra groups to ask for (0 or 1) and the off-target groups left."""

    extra: int
    off_shape: int
    reason: str
    settled: bool = False
    """Off-target groups stay by choice (the mix is within :data:`TAX_BOUND`): no replacement is coming."""


def off_shape(pairs: Sequence[GroupState], revision: str, target: tuple[int, int]) -> int:
    """Live groups of ``revision`` built in another shape than ``target``."""
    return sum(1 for p in pairs if p.live and p.revision == revision and p.counts != target)


def reshape_surge(
    pairs: Sequence[GroupState],
    *,
    revision: str,
    target: tuple[int, int],
    replicas: int,
    steady: bool,
    room: int,
    need: tuple[float, float] | None = None,
    at_max_pairs: bool = False,
) -> ReshapeDecision:
    """Whether to ask for one more group of ``revision`` (the stable one) to replace an off-target group.

    ``steady``: no rollout or rollback is moving and this pass creates and drains nothing else. ``room``: the
    target-shaped groups that fit beside the current ones now (free GPUs, ``maxSurge``, ``gpuBudget``).

    - Nothing off target, or not steady: 0.
    - A draining group of the pool: 0 (the previous replacement is still finishing: one group at a time).
    - ``replicas`` live groups, all Ready, and ``need`` given with the mix within :data:`TAX_BOUND` of the
      target shape: 0, ``settled``.
    - ``replicas`` live groups, all Ready, room for one more: 1 (create the replacement).
    - ``replicas + 1`` live with a target-shaped group not Ready yet: 1 (keep it while it loads).
    - ``replicas + 1`` Ready, and the groups left after that drain would hold fewer instances of a role than
      ``need`` (work planning's last per-role need), not ``at_max_pairs``: 1 (keep the replacement until the
      autoscaler adds a group; module docstring).
    - Otherwise 0: with ``replicas + 1`` Ready the usual scale-down drains one, off-target first
      (:func:`drain_order`).

    Example: 4 Ready 1P:1D groups, target 2P:1D, room 1 → extra 1; a pass later 5 live, the new 2P:1D one
    loading → 1; when it is Ready → 0 and one 1P:1D group drains; after the drain the next one starts."""
    live = [p for p in pairs if p.live and p.revision == revision]
    off = sum(1 for p in live if p.counts != target)
    if off == 0:
        return ReshapeDecision(0, 0, "")
    if not steady:
        return ReshapeDecision(0, off, "waiting for the rollout or scaling in progress")
    if any(p.draining for p in pairs):
        return ReshapeDecision(0, off, "waiting for a draining group")
    loading = [p for p in live if p.counts == target and not p.ready]
    if len(live) == replicas + 1 and loading:
        return ReshapeDecision(1, off, "a replacement group is loading")
    if len(live) == replicas + 1 and need is not None and not at_max_pairs:
        short = _short_after_drain(live, target, need)
        if short:
            return ReshapeDecision(1, off, short)
    if len(live) == replicas and all(p.ready for p in live):
        if need is not None:
            kept = [p.counts for p in sorted(live, key=lambda p: drain_order(p, target))]
            mix = instances_for(need[0], need[1], target, kept)
            alone = instances_for(need[0], need[1], target)
            if mix <= alone * (1 + TAX_BOUND):
                return ReshapeDecision(
                    0,
                    off,
                    f"the mix needs {mix} instances for the need where {alone} of the target shape would do: "
                    f"within {TAX_BOUND:.0%}, no replacement",
                    settled=True,
                )
        if room < 1:
            return ReshapeDecision(0, off, "no room for a surge group (free GPUs, maxSurge or gpuBudget)")
        return ReshapeDecision(1, off, "replacing one group, surge first")
    return ReshapeDecision(0, off, "")


def _short_after_drain(live: Sequence[GroupState], target: tuple[int, int], need: tuple[float, float]) -> str:
    """Why draining the group a scale-down takes first would leave a role short of ``need``, or ""."""
    drained = max(live, key=lambda p: drain_order(p, target))
    left = [p for p in live if p is not drained]
    for role, i in (("prefill", 0), ("decode", 1)):
        have = sum(p.counts[i] for p in left)
        if have < need[i] - 1e-9:
            return (
                f"keeping the replacement: draining a {drained.counts[0]}P:{drained.counts[1]}D group would leave "
                f"{have} {role} instances where the last evaluation needed {need[i]:.1f}; the autoscaler adds a "
                "group first"
            )
    return ""


def drain_order(pair: GroupState, target: tuple[int, int]) -> tuple[bool, int]:
    """Sort key of the groups a scale-down takes, highest first: off-target groups before target-shaped ones,
    then the highest index (``tandem.core.converge.highest_first``)."""
    return pair.counts != target, pair.index


__all__ = ["TAX_BOUND", "GroupState", "ReshapeDecision", "drain_order", "off_shape", "reshape_surge"]
