"""A pool's own analysis.prometheusAddress gets the operator's Prometheus credentials only when allowed (issue 19)."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.reconcile.pool import Metrics
from tests.fakes import prometheus as fp
from tests.support.factories import make_pool

OWN = "http://prometheus.monitoring:9090"


def metrics(made: list[tuple[str, str]]) -> Metrics:
    def with_credentials(url: str) -> Any:
        made.append(("credentials", url))
        return fp.FakePrometheus()

    def anonymous(url: str) -> Any:
        made.append(("anonymous", url))
        return fp.FakePrometheus()

    return Metrics(
        default=fp.FakePrometheus(),
        factory=with_credentials,
        anonymous=anonymous,
        default_url=OWN,
        allowed_addresses=("https://thanos.example",),
    )


@pytest.mark.parametrize(
    ("address", "want_kind", "want_problem"),
    [
        pytest.param(OWN, "credentials", "", id="the operator's own Prometheus"),
        pytest.param("https://thanos.example/prom", "credentials", "", id="https, allow-listed"),
        pytest.param("http://attacker.example:9090", "anonymous", "not https", id="plain http elsewhere"),
        pytest.param("https://attacker.example", "anonymous", "allow-list", id="https, not allow-listed"),
    ],
)
def test_pool_address_gets_credentials_only_when_allowed(address: str, want_kind: str, want_problem: str) -> None:
    made: list[tuple[str, str]] = []
    m = metrics(made)
    pool = make_pool().set("spec.rollout.analysis", {"prometheusAddress": address}).obj()
    provider = m.for_pool(pool)
    assert provider is not None and m.for_pool(pool) is provider  # one provider per address, reused
    assert made == [(want_kind, address)]
    problem = m.credentials_problem(pool)
    assert (want_problem in problem) if want_problem else problem == ""


def test_refused_address_without_an_anonymous_factory_is_not_queried() -> None:
    m = Metrics(default=fp.FakePrometheus(), factory=lambda url: fp.FakePrometheus(), default_url=OWN)
    pool = make_pool().set("spec.rollout.analysis", {"prometheusAddress": "http://attacker.example"}).obj()
    assert m.for_pool(pool) is None


def test_pool_without_address_uses_the_default() -> None:
    m = metrics([])
    assert m.for_pool(make_pool().obj()) is m.default and m.credentials_problem(make_pool().obj()) == ""
