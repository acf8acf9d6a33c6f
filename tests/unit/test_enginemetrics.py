"""vLLM's metric vocabulary lives in ``tandem.enginemetrics`` only (issue 14): no other module spells a
``vllm:`` metric name or a copy of vLLM's bucket bounds, so a query and a fake engine cannot drift apart."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tandem import enginemetrics as em

PACKAGE = Path(em.__file__).resolve().parent
BUCKET_LISTS = {em.TTFT_BUCKETS, em.TPOT_BUCKETS, em.LATENCY_BUCKETS, em.TOKEN_BUCKETS}

# Modules not yet pointed at enginemetrics. This set may only shrink: a new module that spells a name
# fails the test.
NOT_YET: frozenset[str] = frozenset()


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    ids.add(id(stmt.value))
    return ids


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if "vllm:" in node.value:  # also the literal parts of f-strings
                found.append(f"line {node.lineno}: {node.value[:60]!r}")
        elif isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts) and node.elts:
            values = tuple(
                float(e.value) for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, int | float)
            )  # type: ignore[arg-type]
            if values in BUCKET_LISTS:
                found.append(f"line {node.lineno}: a copy of a vLLM bucket list")
    return found


def test_no_module_but_enginemetrics_spells_the_vllm_vocabulary() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "enginemetrics.py" or rel in NOT_YET:
            continue
        if found := _offences(path):
            offenders[rel] = found
    assert offenders == {}, f"use tandem.enginemetrics instead: {offenders}"


def test_the_exception_list_only_names_modules_that_still_need_it() -> None:
    stale = sorted(rel for rel in NOT_YET if not _offences(PACKAGE / rel))
    assert stale == [], f"these modules no longer spell vLLM names: drop them from NOT_YET: {stale}"


def test_the_detector_sees_names_and_bucket_copies(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        '"""Docstring naming vllm:foo is fine."""\nA = "vllm:num_requests_running"\nB = f"vllm:x{A}"\n'
        f"C = {em.TPOT_BUCKETS!r}\n"
    )
    assert sorted({line.split(":")[0] for line in _offences(probe)}) == ["line 2", "line 3", "line 4"]


@pytest.mark.parametrize("histogram", sorted(em.HISTOGRAMS), ids=lambda h: h.removeprefix("vllm:"))
def test_bucket_bounds_increase(histogram: str) -> None:
    bounds = em.HISTOGRAMS[histogram]
    assert list(bounds) == sorted(set(bounds))


def test_series_names() -> None:
    assert em.total(em.REQUEST_SUCCESS) == "vllm:request_success_total"
    assert em.bucket(em.TTFT) == "vllm:time_to_first_token_seconds_bucket"
    assert (em.count(em.TPOT), em.sum_of(em.TPOT)) == (
        "vllm:request_time_per_output_token_seconds_count",
        "vllm:request_time_per_output_token_seconds_sum",
    )
