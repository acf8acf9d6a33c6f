"""`tandem validate` over the generated hostile corpus (issue 19 classes 1-5): every mutant refused, on its field.

The contract test (tests/contract/test_crds_server.py) runs the same generator against the real API server;
this offline half runs a smaller draw of it in the unit tier.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tandem.api.validate import validate_object
from tests.support.hostile_corpus import FAMILIES, Mutant, corpus

SMALL = corpus(per_family=2)


@pytest.mark.parametrize("mutant", [pytest.param(m, id=m.id) for m in SMALL])
def test_validate_refuses_each_mutant_on_its_field(mutant: Mutant) -> None:
    errors = validate_object(mutant.obj)
    assert errors, f"{mutant.id} accepted"
    assert mutant.field in [e.path for e in errors], [str(e) for e in errors]


def test_the_corpus_covers_every_class_and_family_and_is_seeded() -> None:
    full = corpus()
    assert 200 <= len(full) <= 400
    assert set(Counter(m.klass for m in full)) == {1, 2, 3, 4, 5}
    assert len({m.id for m in full}) == len(full)
    for family in FAMILIES:
        assert any(f"-{family}-" in m.id for m in full), family
    assert [m.id for m in corpus()] == [m.id for m in full]
    assert [m.id for m in corpus(seed=7)] != [m.id for m in full]
