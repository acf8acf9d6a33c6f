"""Instance pods record their revision where a foreign writer cannot change it (the engine's env)."""

from __future__ import annotations

import copy

import pytest

from tandem.api.labels import LABEL_REVISION
from tandem.api.revision import CacheWiring, revision_id, revision_spec
from tandem.builders.pods import InstanceParams, build_instance_pod, kv_transfer_config
from tandem.core.observed import parse_pod
from tests.support.factories import make_pool


def test_pod_env_records_the_revision_and_parse_prefers_it_over_an_edited_label() -> None:
    spec = revision_spec(make_pool().pairs(1).obj().spec)
    rev = revision_id(spec)
    params = InstanceParams(
        pool="speed", namespace="ns", pool_uid="u", pair=0, role="prefill", instance=0, revision=rev, spec=spec
    )
    pod = build_instance_pod(params)
    env = {v["name"]: v.get("value") for v in pod["spec"]["containers"][0]["env"]}
    assert env["TANDEM_REVISION"] == rev
    observed = parse_pod(pod)
    assert observed.built_revision == rev and observed.revision == rev and not observed.label_drift

    edited = copy.deepcopy(pod)
    edited["metadata"]["labels"][LABEL_REVISION] = "foreign"
    drifted = parse_pod(edited)
    assert drifted.revision == rev and drifted.label_drift

    legacy = copy.deepcopy(pod)  # a pod built before the env existed: the label is all there is
    legacy["spec"]["containers"][0]["env"] = [
        v for v in legacy["spec"]["containers"][0]["env"] if v["name"] != "TANDEM_REVISION"
    ]
    assert parse_pod(legacy).revision == rev and not parse_pod(legacy).label_drift


NIXL = {"kv_connector": "NixlConnector"}
MOONCAKE_TCP = {"kv_connector": "MooncakeConnector", "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}
MOONCAKE_RDMA = {"kv_connector": "MooncakeConnector", "kv_connector_extra_config": {"mooncake_protocol": "rdma"}}
RDMA = {"name": "rdma/ib", "perInstance": 1}


def _store(role: str) -> dict[str, str]:
    return {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both" if role == "prefill" else "kv_consumer"}


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize(
    ("connector", "rdma", "cache", "p2p"),
    [
        pytest.param("NixlConnector", None, False, NIXL, id="nixl"),
        pytest.param("MooncakeConnector", None, False, MOONCAKE_TCP, id="mooncake-tcp-without-rdma"),
        pytest.param("MooncakeConnector", RDMA, False, MOONCAKE_RDMA, id="mooncake-rdma-with-rdma-resource"),
        pytest.param("NixlConnector", None, True, NIXL, id="nixl-in-multiconnector"),
        pytest.param("MooncakeConnector", RDMA, True, MOONCAKE_RDMA, id="mooncake-extra-config-in-its-child"),
    ],
)
def test_kv_transfer_config_has_a_role_per_instance_and_each_connectors_config_in_its_own_dict(
    role: str, connector: str, rdma: dict[str, object] | None, cache: bool, p2p: dict[str, object]
) -> None:
    """vLLM 0.32/0.33 deprecate NixlConnector `kv_both` (producer on prefill, consumer on decode), default
    `mooncake_protocol` to rdma, and hand each MultiConnector child only its own dict."""
    builder = make_pool().pairs(1).set("spec.stack.kvTransfer", {"connector": connector})
    if rdma is not None:
        builder.placement(rdma=rdma)
    spec = revision_spec(builder.obj().spec, CacheWiring() if cache else None)
    kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
    want: dict[str, object] = {**p2p, "kv_role": kv_role}
    if cache:
        connectors = [want, _store(role)]
        want = {
            "kv_connector": "MultiConnector",
            "kv_role": kv_role,
            "kv_connector_extra_config": {"connectors": connectors},
        }
    assert kv_transfer_config(spec, role) == want  # type: ignore[arg-type]


def test_kv_load_failure_policy_stays_top_level_where_the_scheduler_reads_it() -> None:
    pool = (
        make_pool()
        .pairs(1)
        .set("spec.stack.kvTransfer", {"connector": "NixlConnector", "loadFailurePolicy": "recompute"})
    )
    config = kv_transfer_config(revision_spec(pool.obj().spec, CacheWiring()), "decode")
    assert config["kv_load_failure_policy"] == "recompute"
    assert all("kv_load_failure_policy" not in c for c in config["kv_connector_extra_config"]["connectors"])


@pytest.mark.parametrize(
    ("drain_timeout_s", "grace"),
    [
        pytest.param(120.0, 135, id="default drainTimeout"),
        pytest.param(600.0, 615, id="long streams"),
        pytest.param(0.5, 16, id="fraction rounds up"),
    ],
)
def test_engine_pod_termination_grace_is_drain_timeout_plus_margin(drain_timeout_s: float, grace: int) -> None:
    """An engine stopped by anyone (an eviction, a node drain) keeps its open streams as long as a drain would."""
    spec = revision_spec(make_pool().pairs(1).obj().spec)
    params = InstanceParams(
        pool="speed",
        namespace="ns",
        pool_uid="u",
        pair=0,
        role="decode",
        instance=0,
        revision=revision_id(spec),
        spec=spec,
        drain_timeout_s=drain_timeout_s,
    )
    assert build_instance_pod(params)["spec"]["terminationGracePeriodSeconds"] == grace


@pytest.mark.parametrize(
    ("rdma", "want"),
    [
        pytest.param(
            None,
            {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "capabilities": {"drop": ["ALL"]}},
            id="non-root without rdma",
        ),
        pytest.param(
            RDMA,
            {"runAsUser": 0, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}},
            id="exactly IPC_LOCK as uid 0 with an rdma resource",
        ),
    ],
)
def test_engine_pod_security_read_only_root_with_scratch_for_home_and_caches(
    rdma: dict[str, object] | None, want: dict[str, object]
) -> None:
    """Issue 19 class 8: engines run non-root with a read-only root; what vLLM writes (HOME, TMPDIR, the
    compile caches) lands on the scratch emptyDir. An RDMA pool adds exactly IPC_LOCK, which works only
    for uid 0 (Kubernetes sets no ambient capabilities)."""
    builder = make_pool().pairs(1)
    if rdma is not None:
        builder.placement(rdma=rdma)
    spec = revision_spec(builder.obj().spec)
    pod = build_instance_pod(
        InstanceParams(
            pool="speed", namespace="ns", pool_uid="u", pair=0, role="decode", instance=0, revision="r", spec=spec
        )
    )
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        **want,
    }
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["spec"]["automountServiceAccountToken"] is False
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    env = {v["name"]: v.get("value", "") for v in container["env"]}
    writable = [
        p for p in mounts if not any(m["mountPath"] == p and m.get("readOnly") for m in container["volumeMounts"])
    ]
    for name in (
        "HOME",
        "TMPDIR",
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "VLLM_CACHE_ROOT",
        "TORCHINDUCTOR_CACHE_DIR",
        "HF_HOME",
    ):
        assert any(env[name] == p or env[name].startswith(p + "/") for p in writable), (name, env[name])
