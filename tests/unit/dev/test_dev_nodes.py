"""Simulated AMD GPU node manifests: node-labeller labels, resources, fleet layout."""

from __future__ import annotations

import pytest

from tandem_lab.dev import nodes


@pytest.mark.parametrize(
    ("product", "want_device_id", "want_vram"),
    [
        pytest.param("MI300X", "74a1", "192G", id="MI300X"),
        pytest.param("mi325x", "74a5", "256G", id="MI325X lower-case name"),
        pytest.param("MI355X", "75a3", "288G", id="MI355X"),
    ],
)
def test_build_gpu_node_sets_labeller_labels_and_gpu_resources(
    product: str, want_device_id: str, want_vram: str
) -> None:
    node = nodes.build_gpu_node(nodes.NodeSpec(name="n-0", product=product, gpus=8, zone="zone-b", rack="r1"))
    labels = node["metadata"]["labels"]
    assert labels[nodes.LABEL_GPU_DEVICE_ID] == want_device_id
    assert labels[nodes.LABEL_GPU_VRAM] == want_vram
    assert labels[nodes.LABEL_GPU_COMPUTE_MEMORY_PARTITION] == "spx_nps1"
    assert labels[nodes.LABEL_NFD_AMD_GPU] == "true"
    assert labels[nodes.LABEL_ZONE] == "zone-b"
    assert labels[nodes.LABEL_RACK] == "r1"
    assert labels[nodes.LABEL_HOSTNAME] == "n-0"
    assert node["status"]["capacity"][nodes.RESOURCE_GPU] == "8"
    assert node["status"]["allocatable"][nodes.RESOURCE_GPU] == "8"
    assert node["metadata"]["annotations"][nodes.ANNOTATION_KWOK_NODE] == "fake"
    assert "taints" not in node["spec"]


def test_gpu_labels_publish_beta_twins_with_per_value_counts() -> None:
    labels = nodes.gpu_labels(nodes.product("MI325X"), gpus=8, partition="spx_nps1", driver_version="6.12.12")
    for key in nodes.BETA_TWINNED:
        value = labels[key]
        assert labels[f"beta.{key}"] == value
        assert labels[f"beta.{key}.{value}"] == "8"
    assert "beta." + nodes.LABEL_GPU_DRIVER_VERSION not in labels  # no beta twin for the driver version
    assert labels["beta.amd.com/gpu.device-id.74a5"] == "8"


def test_label_values_are_valid_kubernetes_label_values() -> None:
    node = nodes.build_gpu_node(nodes.NodeSpec(name="mi355x-0", product="MI355X"))
    for key, value in node["metadata"]["labels"].items():
        name = key.rsplit("/", 1)[-1]
        assert len(name) <= 63, key
        assert len(value) <= 63, (key, value)


def test_allocatable_keeps_back_system_reserved_cpu_and_memory() -> None:
    node = nodes.build_gpu_node(nodes.NodeSpec(name="n", product="MI325X"))
    assert node["status"]["capacity"]["cpu"] == "192"
    assert node["status"]["allocatable"]["cpu"] == "190000m"
    assert node["status"]["capacity"]["memory"] == "2Ti"
    assert node["status"]["allocatable"]["memory"] == "2032Gi"


def test_node_info_has_every_required_field_and_stable_ids() -> None:
    first = nodes.build_gpu_node(nodes.NodeSpec(name="n-1"))["status"]["nodeInfo"]
    again = nodes.build_gpu_node(nodes.NodeSpec(name="n-1"))["status"]["nodeInfo"]
    other = nodes.build_gpu_node(nodes.NodeSpec(name="n-2"))["status"]["nodeInfo"]
    required = {
        "architecture", "bootID", "containerRuntimeVersion", "kernelVersion", "kubeProxyVersion",
        "kubeletVersion", "machineID", "operatingSystem", "osImage", "systemUUID",
    }  # fmt: skip
    assert required <= set(first)
    assert first == again
    assert first["machineID"] != other["machineID"]


def test_plan_fleet_spreads_round_robin_over_zones_and_racks() -> None:
    specs = nodes.plan_fleet(6, zones=("zone-a", "zone-b"), nodes_per_rack=2)
    assert [s.name for s in specs] == [f"mi325x-{i}" for i in range(6)]
    assert [s.zone for s in specs] == ["zone-a", "zone-b"] * 3
    assert [s.rack for s in specs] == [
        "zone-a-rack-0", "zone-b-rack-0", "zone-a-rack-0", "zone-b-rack-0", "zone-a-rack-1", "zone-b-rack-1",
    ]  # fmt: skip
    assert len({s.internal_ip for s in specs}) == 6


def test_node_ip_is_unique_and_in_the_fake_range() -> None:
    ips = [nodes.node_ip(i) for i in range(600)]
    assert len(set(ips)) == 600
    assert ips[0] == "10.250.0.1" and ips[250] == "10.250.1.1"


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"product": "H100"}, id="unknown product"),
        pytest.param({"gpus": -1}, id="negative gpus"),
    ],
)
def test_build_gpu_node_rejects_bad_specs(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        nodes.build_gpu_node(nodes.NodeSpec(name="n", **kwargs))  # type: ignore[arg-type]


def test_plan_fleet_rejects_empty_zones() -> None:
    with pytest.raises(ValueError):
        nodes.plan_fleet(2, zones=())


@pytest.mark.parametrize(
    ("pod_cidr", "spec"),
    [
        pytest.param("", {}, id="no CIDR: kwok-controller's default range"),
        pytest.param("127.64.3.0/24", {"podCIDR": "127.64.3.0/24", "podCIDRs": ["127.64.3.0/24"]}, id="loopback"),
    ],
)
def test_node_pod_cidr_is_where_kwok_takes_pod_addresses(pod_cidr: str, spec: dict[str, object]) -> None:
    assert nodes.build_gpu_node(nodes.NodeSpec(name="n0", pod_cidr=pod_cidr))["spec"] == spec
