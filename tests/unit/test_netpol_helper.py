"""The NetworkPolicy evaluator the chart and cluster tests rely on (tests/support/netpol.py), on small cases
whose answer the Kubernetes API reference fixes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.netpol import Endpoint, allowed

NAMESPACES = {n: {"kubernetes.io/metadata.name": n, "team": "a" if n == "a" else "b"} for n in ("a", "b")}
SERVER = Endpoint("server", "a", {"app": "server"}, ports={"http": 8000})
FRIEND = Endpoint("friend", "b", {"app": "friend"})
OTHER = Endpoint("other", "b", {"app": "other"})
NEIGHBOUR = Endpoint("neighbour", "a", {"app": "friend"})


def _policy(ingress: list[dict[str, Any]], types: tuple[str, ...] = ("Ingress",), ns: str = "a") -> dict[str, Any]:
    spec = {"podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": list(types), "ingress": ingress}
    return {"metadata": {"name": "p", "namespace": ns}, "spec": spec}


FRIEND_PEER = {"namespaceSelector": {"matchLabels": {"team": "b"}}, "podSelector": {"matchLabels": {"app": "friend"}}}


@pytest.mark.parametrize(
    ("policies", "src", "port", "want"),
    [
        pytest.param([], OTHER, 1, True, id="no policy: open"),
        pytest.param([_policy([])], FRIEND, 8000, False, id="selected, no rule: closed"),
        pytest.param([_policy([], ns="b")], FRIEND, 8000, True, id="a policy in another namespace does not isolate"),
        pytest.param([_policy([{}])], OTHER, 9, True, id="empty rule: every peer, every port"),
        pytest.param([_policy([{"from": [FRIEND_PEER]}])], FRIEND, 8000, True, id="namespace and pod selector match"),
        pytest.param([_policy([{"from": [FRIEND_PEER]}])], OTHER, 8000, False, id="intersection, not union"),
        pytest.param([_policy([{"from": [FRIEND_PEER]}])], NEIGHBOUR, 8000, False, id="namespace selector excludes"),
        pytest.param(
            [_policy([{"from": [{"podSelector": {"matchLabels": {"app": "friend"}}}]}])],
            FRIEND,
            8000,
            False,
            id="pod selector alone means the policy's namespace",
        ),
        pytest.param(
            [_policy([{"from": [{"podSelector": {"matchLabels": {"app": "friend"}}}]}])],
            NEIGHBOUR,
            8000,
            True,
            id="same-namespace pod selector",
        ),
        pytest.param([_policy([{"ports": [{"port": "http"}]}])], OTHER, 8000, True, id="named port resolved"),
        pytest.param([_policy([{"ports": [{"port": "http"}]}])], OTHER, 8001, False, id="named port, other number"),
        pytest.param([_policy([{"ports": [{"port": 8000, "protocol": "UDP"}]}])], OTHER, 8000, False, id="protocol"),
        pytest.param([_policy([{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}])], OTHER, 8000, False, id="ipBlock"),
        pytest.param(
            [
                _policy(
                    [
                        {
                            "from": [
                                {
                                    "namespaceSelector": {
                                        "matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]
                                    }
                                }
                            ]
                        }
                    ]
                )
            ],
            OTHER,
            8000,
            True,
            id="NotIn",
        ),
        pytest.param([_policy([], types=("Egress",))], OTHER, 8000, True, id="egress-only policy leaves ingress open"),
    ],
)
def test_ingress(policies: list[dict[str, Any]], src: Endpoint, port: int, want: bool) -> None:
    assert allowed(policies, NAMESPACES, src, SERVER, port) is want


def test_egress_of_the_source_counts_and_host_network_is_never_isolated() -> None:
    deny_egress = {
        "metadata": {"name": "e", "namespace": "b"},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": []},
    }
    assert not allowed([deny_egress], NAMESPACES, FRIEND, SERVER, 8000)
    on_host = Endpoint("host", "b", {"app": "friend"}, host_network=True)
    assert allowed([deny_egress], NAMESPACES, on_host, SERVER, 8000)
