"""Fluent factories for routing-table test objects (tests only).

``make_table("speed").pairs(4).canary("r2", percent=5, pairs=1).obj()``
"""

from __future__ import annotations

from typing import Any, Self

from hypothesis import settings

from tandem.routing import (
    Admission,
    Endpoint,
    HashSpec,
    Match,
    Pair,
    PairState,
    Revisions,
    RoutingTable,
    compute_pair_weights,
)


def scaled_examples(fraction: float, floor: int = 10) -> settings:
    """Hypothesis settings that follow the loaded profile's ``max_examples`` (scaled for cost).

    No deadline: two shared cores make per-example timing meaningless.
    """
    return settings(max_examples=max(floor, int(settings().max_examples * fraction)), deadline=None)


def make_pairs(
    pool: str, n: int, *, revision: str = "r1", state: PairState = PairState.SERVING, start: int = 0
) -> list[Pair]:
    return [
        Pair(
            id=f"{pool}-p{i}",
            index=i,
            revision=revision,
            state=state,
            prefill=(Endpoint(pod=f"{pool}-p{i}-prefill-0", address=f"10.0.0.{i % 250 + 1}:8000"),),
            decode=(Endpoint(pod=f"{pool}-p{i}-decode-0", address=f"10.0.1.{i % 250 + 1}:8000"),),
        )
        for i in range(start, start + n)
    ]


class TableFactory:
    def __init__(self, pool: str) -> None:
        self._pool = pool
        self._fields: dict[str, Any] = {
            "pool": pool,
            "namespace": "default",
            "traffic_class": pool,
            "admission": Admission(max_in_flight=32, max_queued=8, max_kv_utilization_percent=95),
            "revisions": Revisions(stable="r1"),
        }
        self._pairs: list[Pair] = []

    def pairs(self, n: int, *, revision: str = "r1", state: PairState = PairState.SERVING) -> Self:
        self._pairs += make_pairs(self._pool, n, revision=revision, state=state, start=len(self._pairs))
        return self

    def canary(self, revision: str, *, percent: int, pairs: int) -> Self:
        self._fields["revisions"] = Revisions(
            stable=self._fields["revisions"].stable, canary=revision, canary_weight_percent=percent
        )
        self.pairs(pairs, revision=revision)
        weights = compute_pair_weights(self._pairs, revision, percent)
        self._pairs = [p.model_copy(update={"weight": weights[p.id]}) for p in self._pairs]
        return self

    def mirror(self, revision: str, *, pairs: int, state: PairState = PairState.SERVING) -> Self:
        """A mirrored canary (``setMirrorPairs``): weight 0, ``canaryMirror`` on."""
        self._fields["revisions"] = Revisions(
            stable=self._fields["revisions"].stable, canary=revision, canary_weight_percent=0, canary_mirror=True
        )
        self.pairs(pairs, revision=revision, state=state)
        weights = compute_pair_weights(self._pairs, revision, 0)
        self._pairs = [p.model_copy(update={"weight": weights[p.id]}) for p in self._pairs]
        return self

    def match(self, **kwargs: Any) -> Self:
        self._fields["match"] = Match(**kwargs)
        return self

    def hash(self, **kwargs: Any) -> Self:
        self._fields["hash"] = HashSpec(**kwargs)
        return self

    def admission(self, **kwargs: Any) -> Self:
        self._fields["admission"] = Admission(**kwargs)
        return self

    def priority(self, value: int) -> Self:
        self._fields["priority"] = value
        return self

    def namespace(self, value: str) -> Self:
        self._fields["namespace"] = value
        return self

    def obj(self) -> RoutingTable:
        return RoutingTable(**self._fields, pairs=tuple(self._pairs))


def make_table(pool: str) -> TableFactory:
    return TableFactory(pool)
