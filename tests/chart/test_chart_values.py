"""The chart's values: `helm lint --strict` per CI values file, and bad values refused (security.md §7 step 1).

Every file in ``bad_values/`` is merged over ``ci/minimal-values.yaml`` and must make ``helm template``
fail with the text of its ``# want:`` header: the JSON schema refuses most, the template guards the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chartlib import CHART, CI_VALUES, KUBE_VERSION, MINIMAL_VALUES, HelmError, annotation_line, render_text
from tests.chart.chartlib import run_helm as helm

BAD_VALUES = sorted((Path(__file__).parent / "bad_values").glob("*.yaml"))


def test_ci_values_files_exist() -> None:
    names = {p.name for p in CI_VALUES}
    assert {"minimal-values.yaml", "full-values.yaml", "stopped-values.yaml"} <= names


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_chart_lint_strict_passes(values: Path) -> None:
    proc = helm("lint", "--strict", str(CHART), "--values", str(values), "--kube-version", KUBE_VERSION, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_chart_lint_refuses_default_values() -> None:
    """The defaults alone are not installable on purpose: no serving namespace and no image digest are guessed."""
    proc = helm("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, check=False)
    assert proc.returncode != 0
    assert "/watchNamespaces" in proc.stdout + proc.stderr
    assert "/image/digest" in proc.stdout + proc.stderr


@pytest.mark.parametrize("bad", BAD_VALUES, ids=[p.stem for p in BAD_VALUES])
def test_bad_values_are_refused(bad: Path) -> None:
    want = annotation_line(bad, "want")
    assert want, f"{bad.name} needs a '# want: <text>' header"
    with pytest.raises(HelmError) as err:
        render_text([MINIMAL_VALUES, bad])
    assert want in err.value.output, err.value.output


def test_more_than_three_replicas_fail_even_without_the_schema() -> None:
    """OP-05c: the template guard holds when a user skips schema validation (one acts, the others stand by)."""
    with pytest.raises(HelmError) as err:
        render_text([MINIMAL_VALUES], {"replicaCount": 4}, extra_args=["--skip-schema-validation"])
    assert "replicaCount must be 0 to 3" in err.value.output


def test_image_digest_required_even_without_the_schema() -> None:
    with pytest.raises(HelmError) as err:
        render_text([MINIMAL_VALUES], {"image": {"digest": "latest"}}, extra_args=["--skip-schema-validation"])
    assert "image.digest must be set to sha256:<64 hex>" in err.value.output


def _keys(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from _keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from _keys(item)


def test_schema_has_no_tls_skip_option() -> None:
    """S-SEC-02: no value, and no schema property, can turn TLS verification off."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    skip = re.compile(r"insecure|skip.?verify|skip.?tls|verify", re.IGNORECASE)
    for key in [*_keys(schema), *_keys(values)]:
        assert not skip.search(key), key
