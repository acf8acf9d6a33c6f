"""Render-policy tests of the chart (security.md §7 step 5, and step 4's kube-linter checks as pytest).

Each test names the checklist item it proves. Renders are offline (`helm template --kube-version
v1.34.4`); the same objects are applied for real in ``tests/cluster/test_chart.py``. kube-linter is not
available here (its module is not served by the Go proxy), so the built-in checks that apply to this chart
are written out below; docs/design/006-install.md maps each kube-linter check to its test or exclusion.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from tests.chart.chartlib import (
    CHART,
    CHART_CRDS,
    CI_VALUES,
    CRDS,
    FULL_VALUES,
    MINIMAL_VALUES,
    RELEASE_NAMESPACE,
    Obj,
    containers,
    of_kind,
    one,
    pod_specs,
    rbac_rules,
    render,
)

CI_IDS = [p.stem for p in CI_VALUES]
DIGEST_IMAGE = re.compile(r"^[^@\s]+@sha256:[a-f0-9]{64}$")
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
NAMESPACED_KINDS = {
    "ServiceAccount",
    "Deployment",
    "Service",
    "ConfigMap",
    "NetworkPolicy",
    "RoleBinding",
    "Role",
    "ServiceMonitor",
    "PrometheusRule",
    "Secret",
}

# security.md §1: the ceiling. (apiGroup, resource) -> verbs the chart may grant in a serving namespace.
SERVING_CEILING: dict[tuple[str, str], set[str]] = {
    ("tandem.dev", "inferencepools"): {"get", "list", "watch", "patch"},
    ("tandem.dev", "mooncakecaches"): {"get", "list", "watch", "patch"},
    ("tandem.dev", "inferencepools/status"): {"get", "patch", "update"},
    ("tandem.dev", "mooncakecaches/status"): {"get", "patch", "update"},
    ("tandem.dev", "inferencepools/finalizers"): {"update"},
    ("tandem.dev", "mooncakecaches/finalizers"): {"update"},
    ("", "pods"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch", "delete"},
    ("batch", "jobs"): {"get", "list", "watch", "create", "delete"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
}
CLUSTER_CEILING: dict[tuple[str, str], set[str]] = {("", "nodes"): {"get", "list", "watch"}}
# The router (its own ServiceAccount): reads ConfigMaps in the serving namespaces, nothing else.
ROUTER_CEILING: dict[tuple[str, str], set[str]] = {("", "configmaps"): {"get", "list", "watch"}}
# Leader election, in the release namespace only (a Role there, not a ClusterRole).
RELEASE_CEILING: dict[tuple[str, str], set[str]] = {
    ("coordination.k8s.io", "leases"): {"create", "get", "update"},
    # The drain loop finds every router replica through the router Service's EndpointSlices (008-router.md).
    ("discovery.k8s.io", "endpointslices"): {"list"},
}
FORBIDDEN_VERBS = {"*", "bind", "escalate", "impersonate", "deletecollection"}
FORBIDDEN_RESOURCES = {
    "secrets",
    "pods/exec",
    "pods/attach",
    "pods/portforward",
    "pods/ephemeralcontainers",
    "nodes/proxy",
    "serviceaccounts",
    "serviceaccounts/token",
    "namespaces",
    "customresourcedefinitions",
    "roles",
    "rolebindings",
    "clusterroles",
    "clusterrolebindings",
    "validatingwebhookconfigurations",
    "mutatingwebhookconfigurations",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
}
FORBIDDEN_GROUPS = {"rbac.authorization.k8s.io", "admissionregistration.k8s.io", "apiextensions.k8s.io", "*"}


OPERATOR = "tandem"
ROUTER = "tandem-router"


def operator_pod(objects: Sequence[Obj]) -> Obj:
    return one(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]


def operator_container(objects: Sequence[Obj]) -> Obj:
    (container,) = [c for c in operator_pod(objects)["containers"] if c["name"] == "operator"]
    return container


# --- CRDs --------------------------------------------------------------------------------------------


def test_chart_crd_copy_equals_crds_byte_for_byte() -> None:
    generated = sorted(p.name for p in CRDS.glob("*.yaml"))
    copied = sorted(p.name for p in CHART_CRDS.glob("*.yaml"))
    assert generated == copied, "run `make generate`: it copies crds/ into charts/tandem/files/crds/"
    for name in generated:
        assert (CHART_CRDS / name).read_bytes() == (CRDS / name).read_bytes(), f"{name} drifted: run `make generate`"


def test_crds_are_rendered_from_the_copy_with_resource_policy_keep() -> None:
    objects = render()
    crds = {o["metadata"]["name"]: o for o in of_kind(objects, "CustomResourceDefinition")}
    assert set(crds) == {"inferencepools.tandem.dev", "mooncakecaches.tandem.dev"}
    for path in CHART_CRDS.glob("*.yaml"):
        on_disk = yaml.safe_load(path.read_text())
        rendered = crds[on_disk["metadata"]["name"]]
        assert rendered == on_disk, f"{path.name} is not rendered verbatim"
        assert rendered["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_crds_are_not_in_the_chart_crds_folder() -> None:
    """Helm never upgrades crds/; moving CRDs between crds/ and templates/ deletes them (helm#8163)."""
    assert not (CHART / "crds").exists()


def test_crds_install_false_renders_no_crds() -> None:
    assert not of_kind(render([MINIMAL_VALUES], {"crds": {"install": False}}), "CustomResourceDefinition")


# --- S-POD: the operator pod ------------------------------------------------------------------------


def test_s_pod_01_namespace_rendered_with_restricted_labels_and_keep() -> None:
    ns = one(render([FULL_VALUES]), "Namespace")
    assert ns["metadata"]["name"] == RELEASE_NAMESPACE
    labels = ns["metadata"]["labels"]
    for mode in ("enforce", "warn", "audit"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
    assert ns["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not of_kind(render(), "Namespace"), "the release namespace is rendered only on request"


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_pod_02_pod_security_context(values: Path) -> None:
    sc = operator_pod(render([values]))["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532 and sc["runAsGroup"] == 65532
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_pod_03_container_security_context(values: Path) -> None:
    for _, spec in pod_specs(render([values])):
        for c in containers(spec):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert "add" not in sc["capabilities"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc.get("privileged", False) is False
            assert sc.get("runAsNonRoot", True) is True
            assert sc.get("runAsUser", 65532) != 0


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_pod_04_only_tmp_is_writable(values: Path) -> None:
    objects = render([values])
    pod = operator_pod(objects)
    volumes = {v["name"]: v for v in pod["volumes"]}
    writable = {v for v, spec in volumes.items() if "emptyDir" in spec}
    assert writable == {"tmp"}
    assert set(volumes) <= {"tmp", "kube-api-access", "prometheus-auth"}
    for v in volumes.values():
        assert set(v) - {"name"} <= {"emptyDir", "projected", "secret"}, v
    for c in containers(pod):
        for m in c.get("volumeMounts", []):
            if m["name"] == "tmp":
                assert m["mountPath"] == "/tmp"
                assert not m.get("readOnly", False)
            else:
                assert m.get("readOnly") is True, m
    env = {e["name"]: e.get("value") for e in operator_container(objects)["env"]}
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_pod_05_no_host_access(values: Path) -> None:
    for name, spec in pod_specs(render([values])):
        for key in ("hostNetwork", "hostPID", "hostIPC", "hostUsers"):
            assert spec.get(key, False) is False or key == "hostUsers", f"{name}: {key}"
        assert all("hostPath" not in v for v in spec.get("volumes", [])), name
        for c in containers(spec):
            for p in c.get("ports", []):
                assert not p.get("hostPort"), f"{name}: hostPort"
                assert p["containerPort"] >= 1024, "privileged-ports"
                assert p["containerPort"] != 22, "ssh-port"
        assert "sysctls" not in spec.get("securityContext", {}), "unsafe-sysctls"


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_pod_06_projected_short_lived_token_in_operator_container_only(values: Path) -> None:
    objects = render([values])
    sa = one(objects, "ServiceAccount", OPERATOR)
    assert sa["automountServiceAccountToken"] is False
    pod = operator_pod(objects)
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == "tandem"
    (token_volume,) = [v for v in pod["volumes"] if "projected" in v]
    sources = token_volume["projected"]["sources"]
    (token,) = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
    assert 600 <= token["expirationSeconds"] <= 3600
    assert token["expirationSeconds"] != 3607
    assert "audience" not in token, "the API server audience (default) is the only one Tandem needs"
    mounts = [(c["name"], m) for c in containers(pod) for m in c.get("volumeMounts", [])]
    token_mounts = [(name, m) for name, m in mounts if m["name"] == token_volume["name"]]
    assert token_mounts == [("operator", {"name": token_volume["name"], "mountPath": TOKEN_PATH, "readOnly": True})]


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_pod_07_requests_and_limits(values: Path) -> None:
    for _, spec in pod_specs(render([values])):
        for c in containers(spec):
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{c['name']} {kind}"


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_pod_08_shape(values: Path) -> None:
    objects = render([values])
    deploy = one(objects, "Deployment", OPERATOR)
    assert deploy["spec"]["replicas"] in (0, 1, 2, 3)
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }, "a standby starts before the leader stops; the Lease keeps one acting"
    c = operator_container(objects)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    assert ports["health"] == 8080
    operator_labels = deploy["spec"]["template"]["metadata"]["labels"]
    for pdb in of_kind(objects, "PodDisruptionBudget"):
        selects = pdb["spec"]["selector"]["matchLabels"].items() <= operator_labels.items()
        assert not selects, "a minAvailable PDB on one operator replica blocks drains"
    assert not of_kind(objects, "HorizontalPodAutoscaler")


def test_s_pod_08_zero_replicas_render() -> None:
    assert one(render([MINIMAL_VALUES], {"replicaCount": 0}), "Deployment", OPERATOR)["spec"]["replicas"] == 0


def test_operator_flags() -> None:
    """The Deployment passes exactly the `tandem run` flags (one --namespace per served namespace); defaults the
    operator owns (`--max-concurrent-passes`) are passed only when a value is set."""
    args = operator_container(render([FULL_VALUES]))["args"]
    assert args == [
        "--namespace=speed",
        "--namespace=long-context",
        "--namespace=images",
        "--namespace=mooncake",
        "--liveness-port=8080",
        "--metrics-port=9090",
        "--prometheus-url=https://prometheus.monitoring.svc:9090",
        "--prometheus-auth-dir=/etc/tandem/prometheus",
        "--prometheus-allowed-address=https://thanos-query.monitoring.svc:10902",
        "--allowed-registry=docker.io/vllm",
        "--allowed-registry=docker.io/rocm",
        "--allowed-registry=ghcr.io/example",
        "--allowed-registry=registry.example.com:5000/inference",
        "--log-format=text",
        "--leader-election-id=tandem",
        "--router-service=tandem-system/tandem-router",
        "--router-url=http://tandem-router.tandem-system.svc:8000",
    ]
    minimal = operator_container(render())
    assert minimal["args"] == [
        "--namespace=inference",
        "--liveness-port=8080",
        "--metrics-port=9090",
        "--allowed-registry=docker.io/vllm",
        "--allowed-registry=docker.io/rocm",
        "--log-format=json",
        "--leader-election-id=tandem",
        "--router-service=tandem-system/tandem-router",
        "--router-url=http://tandem-router.tandem-system.svc:8000",
    ]
    assert "command" not in minimal, "the image's ENTRYPOINT is `tandem run`"
    assert not any("all-namespaces" in a or a in ("-A", "--all-namespaces") for a in args)


# --- S-SUP-01 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_sup_01_every_image_pinned_by_digest(values: Path) -> None:
    images = [c["image"] for _, spec in pod_specs(render([values])) for c in containers(spec)]
    assert images
    for image in images:
        assert DIGEST_IMAGE.match(image), image


def test_s_sup_01_tag_precedes_digest() -> None:
    assert operator_container(render([FULL_VALUES]))["image"] == (
        "registry.example.com:5000/tandem/operator:0.1.0@sha256:" + "0123456789abcdef" * 4
    )


# --- S-RBAC (static half; the live half is tests/cluster/test_chart.py) ----------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_rbac_02_no_wildcards(values: Path) -> None:
    for role, rule in rbac_rules(render([values])):
        for key in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert not any("*" in item for item in rule.get(key, [])), f"{role}: {key} {rule}"
        assert "nonResourceURLs" not in rule


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_rbac_03_04_nothing_forbidden(values: Path) -> None:
    for role, rule in rbac_rules(render([values])):
        assert not set(rule["verbs"]) & FORBIDDEN_VERBS, f"{role}: {rule}"
        assert not set(rule["resources"]) & FORBIDDEN_RESOURCES, f"{role}: {rule}"
        assert not set(rule["apiGroups"]) & FORBIDDEN_GROUPS, f"{role}: {rule}"


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_rbac_within_the_ceiling(values: Path) -> None:
    """Every granted (group, resource, verb) is in security.md §1; cluster-wide grants are Node reads only."""
    objects = render([values])
    cluster_bound = {b["roleRef"]["name"] for b in of_kind(objects, "ClusterRoleBinding")}
    for role, rule in rbac_rules(objects):
        ceiling = CLUSTER_CEILING if role.split("/", 1)[1] in cluster_bound else SERVING_CEILING
        if role.startswith("Role/"):
            ceiling = ROUTER_CEILING if role == f"Role/{ROUTER}" else RELEASE_CEILING
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                allowed = ceiling.get((group, resource), set())
                assert set(rule["verbs"]) <= allowed, f"{role}: {group}/{resource} {rule['verbs']} > {allowed}"


def test_leader_election_rights_are_one_named_lease_in_the_release_namespace() -> None:
    objects = render([FULL_VALUES])
    role = one(objects, "Role", "tandem-leader-election")
    assert role["metadata"]["namespace"] == "tandem-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["tandem"],
            "verbs": ["get", "update"],
        },
    ]
    binding = one(objects, "RoleBinding", "tandem-leader-election")
    want_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["roleRef"] == want_ref
    assert "--leader-election-id=tandem" in operator_container(objects)["args"]


def test_s_rbac_05_pod_rights_bound_only_in_served_namespaces() -> None:
    objects = render([FULL_VALUES])
    bindings = [b for b in of_kind(objects, "RoleBinding") if b["roleRef"]["kind"] == "ClusterRole"]
    by_ns = {b["metadata"]["namespace"]: b["roleRef"]["name"] for b in bindings}
    assert by_ns == {
        "speed": "tandem-operator",
        "long-context": "tandem-operator",
        "images": "tandem-operator",
        "mooncake": "tandem-cache",
    }
    for b in bindings:
        assert b["roleRef"]["kind"] == "ClusterRole"
    # The cache namespace gets no Jobs and no InferencePools.
    cache_rules = one(objects, "ClusterRole", "tandem-cache")["rules"]
    assert not any("jobs" in r["resources"] or "inferencepools" in r["resources"] for r in cache_rules)
    (crb,) = of_kind(objects, "ClusterRoleBinding")
    nodes_role = one(objects, "ClusterRole", crb["roleRef"]["name"])
    assert nodes_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_s_rbac_06_dedicated_identity(values: Path) -> None:
    objects = render([values])
    for b in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding"):
        assert b["roleRef"]["name"] not in ("cluster-admin", "admin", "edit", "view"), b
        sa = ROUTER if b["roleRef"]["name"] == ROUTER else OPERATOR
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": RELEASE_NAMESPACE}]


# --- S-SEC-01 ----------------------------------------------------------------------------------------


def test_s_sec_01_prometheus_secret_mounted_read_only_as_files() -> None:
    objects = render([FULL_VALUES])
    pod = operator_pod(objects)
    (vol,) = [v for v in pod["volumes"] if "secret" in v]
    assert vol["secret"]["secretName"] == "tandem-prometheus"
    (mount,) = [m for m in operator_container(objects)["volumeMounts"] if m["name"] == vol["name"]]
    assert mount == {"name": vol["name"], "mountPath": "/etc/tandem/prometheus", "readOnly": True}
    assert not of_kind(objects, "Secret"), "the chart never holds secret material"
    assert not any("secret" in v for v in operator_pod(render())["volumes"]), "no Secret unless auth is enabled"


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_no_secret_in_env(values: Path) -> None:
    """kube-linter read-secret-from-env-var and env-var-secret."""
    for _, spec in pod_specs(render([values])):
        for c in containers(spec):
            assert "envFrom" not in c
            for e in c.get("env", []):
                assert "secretKeyRef" not in e.get("valueFrom", {})
                assert not re.search(r"SECRET|TOKEN|PASSWORD|API_KEY", e["name"]), e


# --- S-NP --------------------------------------------------------------------------------------------


def network_policy(values: Sequence[Path] = (MINIMAL_VALUES,)) -> tuple[Obj, Obj]:
    objects = render(values)
    return one(objects, "NetworkPolicy", "tandem-operator"), one(objects, "Deployment", OPERATOR)


@pytest.mark.parametrize("values", [MINIMAL_VALUES, FULL_VALUES], ids=["minimal", "full"])
def test_s_np_01_default_deny_both_directions_for_the_operator_pod(values: Path) -> None:
    np, deploy = network_policy([values])
    spec = np["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items(), "dangling-networkpolicy"


@pytest.mark.parametrize("values", [MINIMAL_VALUES, FULL_VALUES], ids=["minimal", "full"])
def test_s_np_02_egress_allow_list(values: Path) -> None:
    np, _ = network_policy([values])
    egress = np["spec"]["egress"]
    for rule in egress:
        assert rule.get("to") and rule.get("ports"), f"an egress rule without peers or ports allows everything: {rule}"
    api, dns, prom = egress[0], egress[1], egress[2]
    assert all(set(peer) == {"ipBlock"} and "except" not in peer["ipBlock"] for peer in api["to"])
    assert all(not peer["ipBlock"]["cidr"].endswith("/0") for peer in api["to"])
    assert {(p["port"], p["protocol"]) for p in api["ports"]} == {(443, "TCP"), (6443, "TCP")}
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert dns["to"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}
    assert {(p["port"], p["protocol"]) for p in prom["ports"]} == {(9090, "TCP"), (443, "TCP")}
    for peer in prom["to"] + dns["to"]:
        assert peer.get("namespaceSelector") != {}, "an empty namespaceSelector means every namespace"


def test_s_np_02_api_server_cidrs_from_values() -> None:
    np, _ = network_policy([FULL_VALUES])
    cidrs = [peer["ipBlock"]["cidr"] for peer in np["spec"]["egress"][0]["to"]]
    assert cidrs == ["10.0.0.1/32", "10.0.0.2/32", "fd00::1/128"]


@pytest.mark.parametrize("values", [MINIMAL_VALUES, FULL_VALUES], ids=["minimal", "full"])
def test_s_np_03_ingress_only_metrics_and_health_from_monitoring(values: Path) -> None:
    np, _ = network_policy([values])
    (rule,) = np["spec"]["ingress"]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert "ipBlock" not in peer
    assert {(p["port"], p["protocol"]) for p in rule["ports"]} == {("metrics", "TCP"), ("health", "TCP")}


def test_network_policy_can_be_disabled() -> None:
    assert not of_kind(render([MINIMAL_VALUES], {"networkPolicy": {"enabled": False}}), "NetworkPolicy")


# --- kube-linter equivalents: consistency of the rendered objects -----------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_objects_are_consistent(values: Path) -> None:
    objects = render([values])
    deployments = of_kind(objects, "Deployment")
    all_pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in deployments]
    # mismatching-selector
    for deploy, pod_labels in zip(deployments, all_pod_labels, strict=True):
        assert deploy["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    # dangling-service, exposed-services
    for svc in of_kind(objects, "Service"):
        assert any(svc["spec"]["selector"].items() <= labels.items() for labels in all_pod_labels)
        assert svc["spec"]["type"] == "ClusterIP"
    # non-existent-service-account, default-service-account
    sa_names = {sa["metadata"]["name"] for sa in of_kind(objects, "ServiceAccount")}
    for deploy in deployments:
        pod = deploy["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] in sa_names - {"default"}
        for c in pod["containers"]:
            # liveness-port / startup-port / readiness-port: probes name a declared port
            names = {p["name"] for p in c["ports"]}
            for probe in ("livenessProbe", "startupProbe", "readinessProbe"):
                if probe in c:
                    assert c[probe]["httpGet"]["port"] in names
            # duplicate-env-var
            env_names = [e["name"] for e in c["env"]]
            assert len(env_names) == len(set(env_names))
    # use-namespace
    for obj in objects:
        if obj["kind"] in NAMESPACED_KINDS:
            assert obj["metadata"].get("namespace"), f"{obj['kind']}/{obj['metadata']['name']} has no namespace"


# --- Replicas rule, admission policies ---------------------------------------------------------------


def test_admission_policies_rendered() -> None:
    objects = render()
    policies = {p["metadata"]["name"]: p for p in of_kind(objects, "ValidatingAdmissionPolicy")}
    bindings = {b["metadata"]["name"]: b for b in of_kind(objects, "ValidatingAdmissionPolicyBinding")}
    assert (
        set(policies)
        == set(bindings)
        == {
            "tandem-pool-images",
            "tandem-cache-images",
            "tandem-operator-pods",
            "tandem-pool-delete",
            "tandem-cache-delete",
            "tandem-crd-delete",
            "tandem-pool-ratio",
        }
    )
    for name, binding in bindings.items():
        assert binding["spec"]["policyName"] == name
        want = ["Warn"] if name.endswith("-ratio") else ["Deny"]
        assert binding["spec"]["validationActions"] == want
        assert policies[name]["spec"]["failurePolicy"] == ("Ignore" if want == ["Warn"] else "Fail")
    by_tandem = policies["tandem-operator-pods"]["spec"]["matchConditions"][0]["expression"]
    assert by_tandem.startswith("request.userInfo.username == 'system:serviceaccount:tandem-system:tandem' ||")
    prefixes = policies["tandem-pool-images"]["spec"]["variables"][0]
    assert prefixes == {"name": "prefixes", "expression": "['docker.io/vllm/', 'docker.io/rocm/']"}
    # No params object: a built-in paramKind breaks after uninstall/reinstall (kubernetes#130887).
    for policy in policies.values():
        assert "paramKind" not in policy["spec"]
    for binding in bindings.values():
        assert "paramRef" not in binding["spec"]


def test_operator_pod_backstop_covers_every_namespace_and_allows_host_network_only_in_the_cache_namespace() -> None:
    """Issue 19 class 8: the backstop binding has no namespace exclusion any more; the cache namespace's one
    extra (an RDMA store's host network and IPC_LOCK) is a rule inside the policy, not a hole."""
    for values, cache_rule in ((FULL_VALUES, "namespaceObject.metadata.name == 'mooncake'"), (MINIMAL_VALUES, None)):
        objects = render([values])
        binding = one(objects, "ValidatingAdmissionPolicyBinding", "tandem-operator-pods")
        assert "matchResources" not in binding["spec"]
        variables = {
            v["name"]: v["expression"]
            for v in one(objects, "ValidatingAdmissionPolicy", "tandem-operator-pods")["spec"]["variables"]
        }
        if cache_rule:
            assert cache_rule in variables["rdmaStore"]
        else:
            assert variables["rdmaStore"].endswith("&& false")


def test_operator_pod_backstop_checks_identity_token_secrets_images_and_eval_jobs() -> None:
    """The backstop matches the operator's pods and Jobs and the Job controller's eval pods, only writes
    that change the spec, and has a rule for each of: non-root, hardening, ServiceAccount and token,
    Secret volumes, images (digest and allow-list)."""
    spec = one(render(), "ValidatingAdmissionPolicy", "tandem-operator-pods")["spec"]
    resources = {(r["apiGroups"][0], r["resources"][0]) for r in spec["matchConstraints"]["resourceRules"]}
    assert resources == {("", "pods"), ("batch", "jobs")}
    conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    assert "'tandem.dev/component' && object.metadata.labels[k] == 'eval'" in conditions["by-tandem"]
    assert conditions["spec-written"] == "request.operation == 'CREATE' || object.spec != oldObject.spec"
    messages = " | ".join(v["message"] for v in spec["validations"])
    for want in (
        "hostPID and hostIPC are never allowed",
        "hostPath",
        "privileged containers",
        "IPC_LOCK on pods of RDMA pools",
        "hostPort",
        "readOnlyRootFilesystem=true and drop ALL",
        "must run as non-root",
        "default ServiceAccount with automountServiceAccountToken=false",
        "no Secret except an engine's model token",
        "pinned by digest from an allowed registry",
    ):
        assert want in messages, want
    images = spec["validations"][-1]["expression"]
    assert "variables.prefixes.exists" in images and "@sha256:[a-f0-9]{64}$" in images
    no_allow_list = {"admissionPolicies": {"imageRegistries": {"enabled": False, "allowed": []}}}
    plain = one(render([MINIMAL_VALUES], no_allow_list), "ValidatingAdmissionPolicy", "tandem-operator-pods")
    assert "prefixes" not in plain["spec"]["validations"][-1]["expression"]
