"""Render tests of the router part of the chart (issue 15 §8; security.md §1, §2 and §4 applied to the router).

The router gets its own ServiceAccount whose only right is get/list/watch on ConfigMaps, bound by a Role in
each served namespace; its pods are PSS restricted like the operator's; a PDB keeps one serving through
drains; a NetworkPolicy admits clients on the request port and Prometheus on the metrics port, and engine
pods accept requests only from the router (plus their KV-transfer peers, eval Jobs and monitoring). The
chart's flags are parsed with the real ``tandem router`` parser, and the engine labels and ports the
policies name are compared with what the operator's builders put on engine pods.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tandem.builders.pods import ENGINE_PORT, MOONCAKE_BOOTSTRAP_PORT
from tandem.cli import build_parser
from tests.chart.chartlib import (
    CI_VALUES,
    FULL_VALUES,
    MINIMAL_VALUES,
    RELEASE_NAMESPACE,
    Obj,
    of_kind,
    one,
    render,
)

ROUTER = "tandem-router"
ROUTER_SA = "tandem-router"
OPERATOR_SA = "tandem"
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
FULL_SERVED = ["speed", "long-context", "images"]
READ_CONFIGMAPS = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]
# What the operator's pod builder stamps on every engine pod (builders/pods.py instance_labels), trimmed to
# the keys the policies may select on.
ENGINE_POD_LABELS = {
    "tandem.dev/component": "engine",
    "app.kubernetes.io/managed-by": "tandem",
    "app.kubernetes.io/part-of": "tandem",
    "tandem.dev/pool": "speed",
    "tandem.dev/role": "prefill",
}


def router_deployment(objects: Sequence[Obj]) -> Obj:
    return one(objects, "Deployment", ROUTER)


def router_pod(objects: Sequence[Obj]) -> Obj:
    pod: Obj = router_deployment(objects)["spec"]["template"]["spec"]
    return pod


def router_container(objects: Sequence[Obj]) -> Obj:
    (container,) = router_pod(objects)["containers"]
    assert container["name"] == "router"
    return container


def router_pod_labels(objects: Sequence[Obj]) -> dict[str, str]:
    labels: dict[str, str] = router_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    return labels


def _matches(selector: Obj, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels, and matchExpressions with In/Exists) against pod labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        if expr["operator"] == "Exists" and expr["key"] not in labels:
            return False
        if expr["operator"] == "In" and labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


# --- objects -----------------------------------------------------------------------------------------


def test_router_objects_rendered_by_default() -> None:
    objects = render()
    for kind in ("ServiceAccount", "Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"):
        assert one(objects, kind, ROUTER)["metadata"]["namespace"] == RELEASE_NAMESPACE, kind
    assert one(objects, "Role", ROUTER)["metadata"]["namespace"] == "inference"
    assert one(objects, "RoleBinding", ROUTER)["metadata"]["namespace"] == "inference"
    assert one(objects, "NetworkPolicy", "tandem-engines")["metadata"]["namespace"] == "inference"


@pytest.mark.parametrize(
    ("values", "set_values"),
    [
        pytest.param([MINIMAL_VALUES], {"router": {"enabled": False}}, id="router.enabled=false"),
        pytest.param([p for p in CI_VALUES if p.stem == "stopped-values"], {}, id="stopped-values"),
    ],
)
def test_router_disabled_renders_nothing_of_it(values: list[Path], set_values: dict[str, object]) -> None:
    objects = render(values, set_values)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert not {n for n in names if n[1] in (ROUTER, "tandem-engines")}
    assert not of_kind(objects, "PodDisruptionBudget")


# --- RBAC: configmaps get/list/watch, served namespaces only ----------------------------------------


@pytest.mark.parametrize("values", [MINIMAL_VALUES, FULL_VALUES], ids=["minimal", "full"])
def test_router_rbac_is_configmap_reads_in_served_namespaces_only(values: Path) -> None:
    objects = render([values])
    served = set(FULL_SERVED) if values == FULL_VALUES else {"inference"}
    router_bindings = [
        b
        for b in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding")
        if any(s["name"] == ROUTER_SA for s in b["subjects"])
    ]
    assert {b["metadata"]["namespace"] for b in router_bindings} == served
    for b in router_bindings:
        assert b["kind"] == "RoleBinding", "no cluster-wide right for the router"
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": ROUTER_SA, "namespace": RELEASE_NAMESPACE}]
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROUTER}
        role = [r for r in of_kind(objects, "Role") if r["metadata"]["namespace"] == b["metadata"]["namespace"]]
        (role_obj,) = [r for r in role if r["metadata"]["name"] == ROUTER]
        assert role_obj["rules"] == READ_CONFIGMAPS
    assert RELEASE_NAMESPACE not in {b["metadata"]["namespace"] for b in router_bindings}
    # Nothing else is bound to the router, and the router binds nothing of the operator's.
    for b in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding"):
        if b["roleRef"]["name"] != ROUTER:
            assert all(s["name"] != ROUTER_SA for s in b["subjects"]), b


def test_router_has_no_cache_namespace_rights() -> None:
    objects = render([FULL_VALUES])
    assert "mooncake" not in {
        r["metadata"]["namespace"] for r in of_kind(objects, "Role") if r["metadata"]["name"] == ROUTER
    }


# --- PSS restricted, identity, token ----------------------------------------------------------------


@pytest.mark.parametrize("values", [MINIMAL_VALUES, FULL_VALUES], ids=["minimal", "full"])
def test_router_pod_security(values: Path) -> None:
    objects = render([values])
    pod = router_pod(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532 and pod["securityContext"]["runAsGroup"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert pod[key] is False
    sc = router_container(objects)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(volumes) == {"tmp", "kube-api-access"}
    assert "emptyDir" in volumes["tmp"]


def test_router_identity_and_short_lived_token() -> None:
    objects = render([FULL_VALUES])
    sa = one(objects, "ServiceAccount", ROUTER_SA)
    assert sa["automountServiceAccountToken"] is False
    assert sa["metadata"]["annotations"] == {"example.com/owner": "platform"}
    pod = router_pod(objects)
    assert pod["serviceAccountName"] == ROUTER_SA != OPERATOR_SA
    assert pod["automountServiceAccountToken"] is False
    sources = next(v for v in pod["volumes"] if v["name"] == "kube-api-access")["projected"]["sources"]
    (token,) = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
    assert 600 <= token["expirationSeconds"] <= 3600
    mounts = router_container(objects)["volumeMounts"]
    assert {"name": "kube-api-access", "mountPath": TOKEN_PATH, "readOnly": True} in mounts


# --- shape: replicas, strategy, PDB, probes, Service, flags ------------------------------------------


def test_router_shape() -> None:
    objects = render()
    deploy = router_deployment(objects)
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    assert deploy["spec"]["selector"]["matchLabels"].items() <= router_pod_labels(objects).items()
    assert router_pod_labels(objects)["app.kubernetes.io/component"] == "router"
    anti = router_pod(objects)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert router_deployment(render([FULL_VALUES]))["spec"]["replicas"] == 3


@pytest.mark.parametrize(
    ("replicas", "want_pdb"),
    [pytest.param(1, False, id="one replica: no PDB (it would block drains)"), pytest.param(2, True, id="two")],
)
def test_router_pdb(replicas: int, want_pdb: bool) -> None:
    objects = render([MINIMAL_VALUES], {"router": {"replicas": replicas}})
    pdbs = of_kind(objects, "PodDisruptionBudget")
    if not want_pdb:
        assert not pdbs
        return
    (pdb,) = pdbs
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["selector"]["matchLabels"].items() <= router_pod_labels(objects).items()
    assert not _matches(
        pdb["spec"]["selector"], one(objects, "Deployment", "tandem")["spec"]["template"]["metadata"]["labels"]
    )


def test_router_probes_on_the_health_listener() -> None:
    c = router_container(render())
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "metrics": 9090}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}
    assert "startupProbe" not in c


def test_router_service_ports() -> None:
    objects = render()
    svc = one(objects, "Service", ROUTER)
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"].items() <= router_pod_labels(objects).items()
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("http", 8000, "http"),
        ("metrics", 9090, "metrics"),
    ]


def test_router_flags_parse_with_tandem_router() -> None:
    """The chart's command line is one `tandem router` accepts, with every served namespace watched."""
    c = router_container(render([FULL_VALUES]))
    assert c["command"] == ["tandem", "router"]
    args = build_parser("router").parse_args(["router", *c["args"]])
    assert args.namespace == FULL_SERVED
    assert args.routing_table == []
    assert (args.host, args.port, args.metrics_host, args.metrics_port) == ("0.0.0.0", 8000, "0.0.0.0", 9090)
    assert args.log_level == "DEBUG"
    assert args.kubeconfig is None, "in-cluster credentials"
    assert args.allow_revision_header, "the operator's eval Jobs pin the canary through the router"


def test_router_service_monitor_scrapes_the_router_metrics_port() -> None:
    objects = render([FULL_VALUES])
    sm = one(objects, "ServiceMonitor", ROUTER)
    svc = one(objects, "Service", ROUTER)
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert (
        not sm["spec"]["selector"]["matchLabels"].items()
        <= one(objects, "Service", "tandem-metrics")["metadata"]["labels"].items()
    )
    (endpoint,) = sm["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert not any(s["metadata"]["name"] == ROUTER for s in of_kind(render(), "ServiceMonitor"))


# --- NetworkPolicy ------------------------------------------------------------------------------------


def test_engine_ports_match_the_pod_builder() -> None:
    egress = one(render(), "NetworkPolicy", ROUTER)["spec"]["egress"]
    to_engines = egress[-1]
    assert {p["port"] for p in to_engines["ports"]} == {ENGINE_PORT, MOONCAKE_BOOTSTRAP_PORT}


@pytest.mark.parametrize("values", [MINIMAL_VALUES, FULL_VALUES], ids=["minimal", "full"])
def test_router_network_policy(values: Path) -> None:
    objects = render([values])
    spec = one(objects, "NetworkPolicy", ROUTER)["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert _matches(spec["podSelector"], router_pod_labels(objects))
    clients, monitoring, operator = spec["ingress"]
    assert clients["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert monitoring["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    # The operator's drain loop reads each replica's open streams on the metrics port (008-router.md).
    assert operator["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    (operator_peer,) = operator["from"]
    assert operator_peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert monitoring["from"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    api, engines = spec["egress"]
    assert all(set(peer) == {"ipBlock"} for peer in api["to"])
    (peer,) = engines["to"]
    served = FULL_SERVED if values == FULL_VALUES else ["inference"]
    assert peer["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": served}
    ]
    assert _matches(peer["podSelector"], ENGINE_POD_LABELS)


def test_router_clients_default_every_pod_and_narrowed_in_full() -> None:
    default_clients = one(render(), "NetworkPolicy", ROUTER)["spec"]["ingress"][0]
    assert default_clients["from"] == [{"namespaceSelector": {}}]
    full_clients = one(render([FULL_VALUES]), "NetworkPolicy", ROUTER)["spec"]["ingress"][0]
    assert full_clients["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}]


def test_engine_network_policy_admits_the_router_and_kv_peers_only() -> None:
    objects = render([FULL_VALUES])
    policies = [p for p in of_kind(objects, "NetworkPolicy") if p["metadata"]["name"] == "tandem-engines"]
    assert sorted(p["metadata"]["namespace"] for p in policies) == sorted(FULL_SERVED)
    router_labels = router_pod_labels(objects)
    for policy in policies:
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        assert _matches(spec["podSelector"], ENGINE_POD_LABELS)
        from_router, kv_peers, eval_and_monitoring, extra = spec["ingress"]
        (router_peer,) = from_router["from"]
        assert router_peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": RELEASE_NAMESPACE}}
        assert _matches(router_peer["podSelector"], router_labels)
        assert {p["port"] for p in from_router["ports"]} == {ENGINE_PORT, MOONCAKE_BOOTSTRAP_PORT}
        # KV transfer: other engines of the namespace and Mooncake components, any port.
        assert "ports" not in kv_peers
        assert _matches(kv_peers["from"][0]["podSelector"], ENGINE_POD_LABELS)
        assert all("ipBlock" not in peer for peer in kv_peers["from"])
        assert all(
            peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name", "mooncake")
            == "mooncake"
            for peer in kv_peers["from"]
        )
        assert [p["port"] for p in eval_and_monitoring["ports"]] == [ENGINE_PORT]
        assert extra["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "bench"}
        for rule in spec["ingress"]:
            for peer in rule["from"]:
                assert peer.get("namespaceSelector") != {}, "an empty namespaceSelector admits every namespace"
                assert "ipBlock" not in peer


def test_engine_network_policy_off_without_router_or_when_disabled() -> None:
    def engine_policies(objects: Sequence[Obj]) -> list[Obj]:
        return [p for p in of_kind(objects, "NetworkPolicy") if p["metadata"]["name"] == "tandem-engines"]

    assert not engine_policies(render([MINIMAL_VALUES], {"router": {"enabled": False}}))
    # --set-json replaces the whole networkPolicy map, so the API server CIDRs come along.
    engines_off = {"networkPolicy": {"engines": {"enabled": False}, "apiServer": {"cidrs": ["10.0.0.1/32"]}}}
    assert not engine_policies(render([MINIMAL_VALUES], engines_off))
    assert one(render([MINIMAL_VALUES], engines_off), "NetworkPolicy", ROUTER)


def test_operator_router_url_is_the_router_service_client_port() -> None:
    """Eval Jobs reach the router Service on its `http` port: the operator's --router-url follows router.port."""
    objects = render(set_values={"router": {"port": 8100}})
    svc = one(objects, "Service", ROUTER)
    http = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "http")
    (deployment,) = [o for o in of_kind(objects, "Deployment") if o["metadata"]["name"] != ROUTER]
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    args = build_parser("run").parse_args(["run", *container["args"]])
    assert args.router_url == f"http://{ROUTER}.{RELEASE_NAMESPACE}.svc:{http}"
    assert http == 8100
