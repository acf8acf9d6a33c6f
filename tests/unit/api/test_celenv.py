"""The offline CEL dialect: the Kubernetes library functions our rules use, and error handling."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.api.celenv import CONDITION_PATTERN, CelError, compile_check, condition_problem, evaluate, holds
from tandem.api.quantity import format_bytes, parse_duration, parse_quantity

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("rule", "variables", "want"),
    [
        pytest.param("self.isSorted()", {"self": [1, 2, 2, 5]}, True, id="isSorted true"),
        pytest.param("self.isSorted()", {"self": [3, 1]}, False, id="isSorted false"),
        pytest.param(
            "isURL(self) && url(self).getScheme() in ['http', 'https']", {"self": "http://p:9090"}, True, id="http url"
        ),
        pytest.param(
            "isURL(self) && url(self).getScheme() in ['http', 'https']", {"self": "ftp://p"}, False, id="ftp url"
        ),
        pytest.param("isURL(self)", {"self": "prometheus"}, False, id="not a url"),
        pytest.param(
            "quantity(self.a).isLessThan(quantity(self.b))",
            {"self": {"a": "64Gi", "b": "80Gi"}},
            True,
            id="quantity less",
        ),
        pytest.param(
            "quantity(self.a).isLessThan(quantity(self.b))",
            {"self": {"a": "1Ti", "b": "1000Gi"}},
            False,
            id="quantity binary vs",
        ),
        pytest.param("duration(self.a) < duration(self.b)", {"self": {"a": "10s", "b": "1m"}}, True, id="duration"),
        pytest.param("self.missing > 1", {"self": {}}, False, id="eval error counts as false"),
        pytest.param("result <= baseline * 1.2", {"result": 1.1, "baseline": 1.0}, True, id="gate condition"),
    ],
)
def test_holds(rule: str, variables: dict[str, object], want: bool) -> None:
    assert holds(rule, variables) is want


def test_evaluate_raises_on_errors() -> None:
    with pytest.raises(CelError):
        evaluate("1 / self", {"self": 0})


def test_compile_check_reports_syntax_errors() -> None:
    assert compile_check("result < 1.0") is None
    assert compile_check("result <") is not None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("64Gi", 64 * 2**30, id="Gi"),
        pytest.param("500m", Fraction(1, 2), id="milli"),
        pytest.param("1.5T", 1_500_000_000_000, id="decimal T"),
        pytest.param("8", 8, id="plain"),
    ],
)
def test_parse_quantity(text: str, want: Fraction | int) -> None:
    assert parse_quantity(text) == want


@pytest.mark.parametrize("text", ["", "10GB", "-1Gi", "1e3"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [pytest.param("30s", 30.0, id="s"), pytest.param("1h30m", 5400.0, id="h m"), pytest.param("500ms", 0.5, id="ms")],
)
def test_parse_duration(text: str, want: float) -> None:
    assert parse_duration(text) == want


@pytest.mark.parametrize("text", ["", "5", "5x", "1h 30m", "m5"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_format_bytes_round_trips() -> None:
    assert format_bytes(64 * 2**30) == "64Gi"
    assert parse_quantity(format_bytes(3 * 2**20)) == 3 * 2**20
    assert format_bytes(1000) == "1000"


# --- the gate condition grammar the CRD checks (design note 010) ------------------------------------

_SPACES = st.sampled_from(["", " ", "  ", "\t", "\n"])
_NUMBERS = st.builds(
    lambda whole, frac, exp: f"{whole}.{frac}{exp}",
    st.integers(0, 10**6),
    st.integers(0, 999),
    st.sampled_from(["", "e3", "E-2", "e+10"]),
)
_OPERANDS = st.builds(
    lambda neg, x: neg + x, st.sampled_from(["", "-"]), st.one_of(st.sampled_from(["result", "baseline"]), _NUMBERS)
)


@st.composite
def _arith(draw: st.DrawFn) -> str:
    out = draw(_OPERANDS)
    for _ in range(draw(st.integers(0, 3))):
        out += draw(_SPACES) + draw(st.sampled_from("+-*/")) + draw(_SPACES) + draw(_OPERANDS)
    return out


@st.composite
def conditions(draw: st.DrawFn) -> str:
    def comparison() -> str:
        op = draw(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]))
        return draw(_arith()) + draw(_SPACES) + op + draw(_SPACES) + draw(_arith())

    out = draw(_SPACES) + comparison()
    for _ in range(draw(st.integers(0, 3))):
        out += draw(_SPACES) + draw(st.sampled_from(["&&", "||"])) + draw(_SPACES) + comparison()
    return out + draw(_SPACES)


@settings(max_examples=300, deadline=None)
@given(condition=conditions())
def test_every_sentence_of_the_condition_grammar_is_a_valid_gate_condition(condition: str) -> None:
    """The CRD pattern admits exactly this grammar; every sentence must compile, read only result and
    baseline, and be boolean, or the API server would admit a condition that fails at run time."""
    assert re.search(CONDITION_PATTERN, condition), condition
    assert condition_problem(condition) is None, condition


@pytest.mark.parametrize(
    "condition",
    [
        pytest.param("result <=", id="does-not-parse"),
        pytest.param("latency > 1.0", id="unknown-variable"),
        pytest.param("result * 2.0", id="not-boolean"),
        pytest.param("result <= 1", id="integer-literal"),
        pytest.param("result\u00a0<= 1.0", id="unicode-space"),
        pytest.param("size(result) > 1.0", id="function"),
        pytest.param("result <= 1.0 && (baseline > 0.5)", id="parentheses"),
        pytest.param("result <= 1.0\n#", id="trailing-text"),
        pytest.param("result <= 1.0\n", id="trailing-newline-ok"),
    ],
)
def test_the_condition_grammar_refuses(condition: str) -> None:
    matched = re.search(CONDITION_PATTERN, condition) is not None
    assert matched is condition.endswith("1.0\n")


def test_every_condition_in_examples_and_docs_is_in_the_grammar() -> None:
    texts = [p.read_text(encoding="utf-8") for p in (REPO / "examples").glob("*.yaml")]
    texts.append((REPO / "docs" / "design" / "001-api.md").read_text(encoding="utf-8"))
    found = [
        m.group(2)
        for text in texts
        for m in re.finditer(r"(successCondition|failureCondition):\s*\"?([^\"\n}]+?)\"?\s*[,}\n]", text)
    ]
    assert found
    for condition in found:
        assert re.search(CONDITION_PATTERN, condition), condition
