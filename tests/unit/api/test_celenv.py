"""The offline CEL dialect: the Kubernetes library functions our rules use, and error handling."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tandem.api.celenv import CelError, compile_check, evaluate, holds
from tandem.api.quantity import format_bytes, parse_duration, parse_quantity

pytestmark = pytest.mark.unit


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
