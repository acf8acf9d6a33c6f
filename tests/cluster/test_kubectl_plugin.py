"""`kubectl tandem` through the real kubectl binary on the local control plane (issue 13, item 4).

kubectl runs the `kubectl-tandem` executable it finds on PATH (installed by `make setup` next to the
test's Python); the plugin reads the namespace from the kubeconfig context like kubectl does, prints a
`get` table, and `rollout status --watch` exits with the code a CI job gates on: 0 when a rollout is
promoted, 4 when it waits at a pause step without a duration, and 0 again after `rollout promote`.
No Prometheus: the rollout steps have no analysis.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem_lab.dev.kube import Kubectl
from tests.support.clusterfix import DevCluster
from tests.support.tandem_cluster import REPO, GpuNodes

REPLICAS = 2
IMAGE = "docker.io/vllm/vllm-openai-rocm:{tag}@sha256:" + "cd" * 32
WATCH_TIMEOUT = "120s"
PROCESS_TIMEOUT_S = 180  # above WATCH_TIMEOUT: the plugin must end on its own timeout, not ours
FAST_STEPS = [{"setCanaryPairs": 1}, {"pause": {"duration": "2s"}}, {"setWeight": 100}]
HUMAN_STEPS = [{"setCanaryPairs": 1}, {"pause": {}}, {"setWeight": 100}]


def pool(nodes: GpuNodes, version: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    obj = copy.deepcopy(yaml.safe_load((REPO / "examples" / "minimal-pool.yaml").read_text()))
    obj["metadata"]["name"] = "speed"
    obj["spec"].update(
        {
            "stack": {"version": version, "image": IMAGE.format(tag=version)},
            "pairs": {"replicas": REPLICAS, "drainTimeout": "2s"},
            "placement": {"nodeSelector": nodes.selector},
            "rollout": {"maxSurge": 1, "maxUnavailable": 0, "progressDeadline": "2m", "steps": steps},
        }
    )
    return obj


@pytest.fixture
def plugin_env(dev_cluster: DevCluster, ns: str, tmp_path: Path) -> dict[str, str]:
    """PATH with the venv's bin (kubectl-tandem) and a kubeconfig whose context namespace is the test's."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "kubectl-tandem").is_file():
        pytest.fail(f"{bin_dir}/kubectl-tandem is missing: run `make setup` (pip install -e .)", pytrace=False)
    kubeconfig = tmp_path / "kubeconfig"
    # --flatten embeds the certificates, so the copy does not depend on paths relative to the original.
    kubeconfig.write_text(dev_cluster.kube.run("config", "view", "--raw", "--flatten").stdout)
    Kubectl(dev_cluster.kube.binary, kubeconfig).run("config", "set-context", "--current", f"--namespace={ns}")
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["KUBECONFIG"] = str(kubeconfig)
    return env


def kubectl_tandem(
    dev_cluster: DevCluster, env: dict[str, str], *args: str, want_code: int = 0
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(dev_cluster.kube.binary), "tandem", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=PROCESS_TIMEOUT_S,
    )
    assert proc.returncode == want_code, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc


def table(stdout: str) -> list[dict[str, str]]:
    header, *rows = stdout.splitlines()
    names = header.split()
    return [dict(zip(names, row.split(), strict=False)) for row in rows]


def test_kubectl_tandem_get_and_rollout_status_watch(
    dev_cluster: DevCluster,
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    plugin_env: dict[str, str],
) -> None:
    gpu_nodes.add(REPLICAS + 1)
    operator_factory([ns])
    crds.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(pool(gpu_nodes, "v1", FAST_STEPS)))

    # The first rollout: no -n anywhere, the namespace comes from the kubeconfig context.
    out = kubectl_tandem(dev_cluster, plugin_env, "rollout", "status", "speed", "--watch", "--timeout", WATCH_TIMEOUT)
    assert out.stdout.splitlines()[-1] == f"Idle: v1 is stable, {REPLICAS}/{REPLICAS} pairs ready"
    rows = table(kubectl_tandem(dev_cluster, plugin_env, "get", "pools").stdout)
    assert rows == [
        {
            "NAME": "speed",
            "VERSION": "v1",
            "PHASE": "Idle",
            "STEP": "-",
            "PAIRS": f"{REPLICAS}/{REPLICAS}",
            "WEIGHT": "-",
            "AGE": rows[0]["AGE"],
        }
    ]

    # A canary that walks its steps: the watch prints the steps and ends promoted with exit 0.
    crds.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(pool(gpu_nodes, "v2", FAST_STEPS)))
    out = kubectl_tandem(
        dev_cluster, plugin_env, "rollout", "status", "speed", "-n", ns, "--watch", "--timeout", WATCH_TIMEOUT
    )
    lines = out.stdout.splitlines()
    assert any(line.startswith("Progressing step ") for line in lines), lines
    assert lines[-1] == f"Promoted: v2 is stable, {REPLICAS}/{REPLICAS} pairs ready"
    rows = table(kubectl_tandem(dev_cluster, plugin_env, "get", "pools", "-n", ns, "-o", "wide").stdout)
    assert (rows[0]["NAME"], rows[0]["VERSION"], rows[0]["PHASE"], rows[0]["READY"]) == (
        "speed",
        "v2",
        "Promoted",
        "True",
    )

    # A pause step without a duration waits for a person: exit 4, then promote, then exit 0.
    crds.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(pool(gpu_nodes, "v3", HUMAN_STEPS)))
    out = kubectl_tandem(
        dev_cluster, plugin_env, "rollout", "status", "speed", "--watch", "--timeout", WATCH_TIMEOUT, want_code=4
    )
    assert out.stdout.splitlines()[-1].startswith("Paused at step 2/3: a pause step without a duration")
    rows = table(kubectl_tandem(dev_cluster, plugin_env, "get", "pools", "-A").stdout)
    mine = next(r for r in rows if r["NAMESPACE"] == ns)
    assert (mine["VERSION"], mine["PHASE"], mine["STEP"]) == ("v2→v3", "Progressing", "2/3")
    kubectl_tandem(dev_cluster, plugin_env, "rollout", "promote", "speed")
    out = kubectl_tandem(dev_cluster, plugin_env, "rollout", "status", "speed", "--watch", "--timeout", WATCH_TIMEOUT)
    assert out.stdout.splitlines()[-1] == f"Promoted: v3 is stable, {REPLICAS}/{REPLICAS} pairs ready"

    doc = json.loads(kubectl_tandem(dev_cluster, plugin_env, "get", "pool", "speed", "-o", "json").stdout)
    assert doc["status"]["revisions"]["stable"]["version"] == "v3"
    version = kubectl_tandem(dev_cluster, plugin_env, "version").stdout
    assert "Server Version: v1." in version and "CRDs: inferencepools, mooncakecaches installed" in version


def test_kubectl_tandem_one_line_error_for_a_missing_pool_and_context(
    dev_cluster: DevCluster, crds: Kubectl, plugin_env: dict[str, str]
) -> None:
    out = kubectl_tandem(dev_cluster, plugin_env, "get", "pool", "nope", want_code=1)
    assert out.stderr.count("\n") == 1 and 'inferencepools.tandem.dev "nope" not found' in out.stderr
    out = kubectl_tandem(dev_cluster, plugin_env, "get", "pools", "--context", "nope", want_code=1)
    assert out.stderr.startswith("kubectl tandem: context 'nope' not found")
    listed = subprocess.run(
        [str(dev_cluster.kube.binary), "plugin", "list"], capture_output=True, text=True, check=False, env=plugin_env
    )
    assert "kubectl-tandem" in listed.stdout, listed.stderr
