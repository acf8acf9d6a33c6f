"""Pair groups as observed: pods grouped by pair, and whether each group is capacity.

What it owns: `group_pairs` (pods → `PairView`s) and the rules for what counts. A pair group is Ready
only when every one of its expected instances (x prefill + y decode, from its revision) exists, is not
being deleted, and is Ready; a half pair is never capacity (INV-4). A pair is draining when the
published routing table says so (the drain start time lives there, so a restarted operator resumes the
same drain).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from tandem.api.labels import ROLES, Role, pair_id
from tandem.api.revision import RevisionSpec
from tandem.core.observed import ObservedPod, parse_time
from tandem.routing.table import PairState, RoutingTable


@dataclass(frozen=True)
class PairView:
    """One pair group: its pods, its revision and its state."""

    pool: str
    index: int
    revision: str
    pods: tuple[ObservedPod, ...]
    shape: tuple[tuple[Role, int], ...]
    draining_since: datetime | None = None
    mixed: bool = False

    @property
    def id(self) -> str:
        return pair_id(self.pool, self.index)

    @property
    def counts(self) -> tuple[int, int]:
        """(prefill, decode) instances the group is built with."""
        by_role = dict(self.shape)
        return by_role.get("prefill", 1), by_role.get("decode", 1)

    @property
    def expected(self) -> tuple[tuple[Role, int], ...]:
        """(role, instance) slots this pair must fill."""
        return tuple((role, i) for role, count in self.shape for i in range(count))

    def pod(self, role: Role, instance: int) -> ObservedPod | None:
        return next((p for p in self.pods if p.role == role and p.instance == instance), None)

    @property
    def missing(self) -> tuple[tuple[Role, int], ...]:
        """Slots with no pod at all (a pod being deleted still holds its name: it is not missing yet)."""
        return tuple(slot for slot in self.expected if self.pod(*slot) is None)

    @property
    def complete(self) -> bool:
        return not self.mixed and all((p := self.pod(*slot)) is not None and not p.deleting for slot in self.expected)

    @property
    def ready(self) -> bool:
        return self.complete and all(p.ready for p in self.pods if not p.deleting)

    @property
    def draining(self) -> bool:
        return self.draining_since is not None

    @property
    def live(self) -> bool:
        """Counts toward the revision's pairs (draining pairs are on their way out)."""
        return not self.draining

    @property
    def pending(self) -> bool:
        return any(p.node is None and not p.deleting for p in self.pods)

    @property
    def crash_looping(self) -> bool:
        return any(p.crash_looping for p in self.pods)

    @property
    def unschedulable(self) -> bool:
        return any(p.unschedulable for p in self.pods)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({p.node for p in self.pods if p.node}))

    @property
    def newest_pod(self) -> datetime | None:
        times = [p.created for p in self.pods if p.created is not None]
        return max(times) if times else None


def shape_of(rev: RevisionSpec | None, pods: Iterable[ObservedPod]) -> tuple[tuple[Role, int], ...]:
    """Expected instances per role: the shape the group was built with (its pods' immutable ``TANDEM_PAIR_SHAPE``,
    when every pod that records one agrees), else its revision snapshot's, else what the pods themselves show,
    and at least one of each role (the API's minimum): a pair that lost all its prefill pods is never complete.

    Why the group's own shape first: the pool's P:D is not part of its revision (design note 012 §5), so groups
    built before a P:D change keep their shape until they cycle; their revision snapshot may name another."""
    pods = tuple(pods)
    built = {p.built_shape for p in pods if p.built_shape is not None and not p.deleting}
    if len(built) == 1:
        prefill, decode = next(iter(built))
        return (("prefill", prefill), ("decode", decode))
    if rev is not None:
        return (("prefill", rev.prefill.instances), ("decode", rev.decode.instances))
    seen: dict[Role, int] = {}
    for pod in pods:
        if pod.role is not None and pod.instance is not None:
            seen[pod.role] = max(seen.get(pod.role, 0), pod.instance + 1)
    return tuple((role, max(1, seen.get(role, 0))) for role in ROLES)


def group_pairs(
    pool: str,
    pods: Iterable[ObservedPod],
    revisions: Mapping[str, RevisionSpec],
    routing: RoutingTable | None,
) -> list[PairView]:
    """Group a pool's pods into pair views, ordered by index."""
    by_index: dict[int, list[ObservedPod]] = defaultdict(list)
    for pod in pods:
        if pod.pool == pool and pod.pair_index is not None and pod.role is not None:
            by_index[pod.pair_index].append(pod)
    draining: dict[int, datetime] = {}
    if routing is not None and routing.pool == pool:
        for entry in routing.pairs:
            if entry.state is PairState.DRAINING and entry.draining_since:
                try:
                    since = parse_time(entry.draining_since)
                except ValueError:
                    since = None  # not a time (a foreign edit): no drain record; the table is republished
                if since is not None:
                    draining[entry.index] = since
    out = []
    for index in sorted(by_index):
        members = sorted(by_index[index], key=lambda p: p.name)
        revs = {p.revision for p in members if p.revision}
        revision = sorted(revs)[0] if revs else ""
        out.append(
            PairView(
                pool=pool,
                index=index,
                revision=revision,
                pods=tuple(members),
                shape=shape_of(revisions.get(revision), members),
                draining_since=draining.get(index),
                mixed=len(revs) > 1,
            )
        )
    return out


def cancel_unneeded_drains(pairs: list[PairView], targets: Mapping[str, int]) -> list[PairView]:
    """Pairs with the drain records the targets do not justify dropped (the pair serves again).

    Why: the drain record lives in the published routing table, which anyone allowed to write
    ConfigMaps can edit. The planner only ever drains a pair its revision has in excess, so a recorded
    drain on a Ready pair that its revision still needs to meet its target is either forged or
    overtaken (the target went back up within ``drainTimeout``); either way keeping the pair serving
    is the capacity-safe reading, and it saves a delete and a model load. Lowest indexes come back
    first (drains pick the highest).
    """
    live: dict[str, int] = {}
    for pair in pairs:
        if pair.live:
            live[pair.revision] = live.get(pair.revision, 0) + 1
    short = {rev: target - live.get(rev, 0) for rev, target in targets.items() if target > live.get(rev, 0)}
    if not short:
        return pairs
    out = []
    for pair in pairs:
        if pair.draining and pair.ready and short.get(pair.revision, 0) > 0:
            short[pair.revision] -= 1
            out.append(replace(pair, draining_since=None))
        else:
            out.append(pair)
    return out
