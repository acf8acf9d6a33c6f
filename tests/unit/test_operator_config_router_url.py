"""Where the operator tells eval Jobs to reach the router: ``--router-url``, else derived from
``--router-service``, else nowhere (eval Jobs call decode pods)."""

from __future__ import annotations

import pytest

from tandem.controller.config import OperatorConfig


@pytest.mark.parametrize(
    ("service", "url", "want"),
    [
        pytest.param("", "", "", id="no router configured"),
        pytest.param(
            "tandem-system/tandem-router", "", "http://tandem-router.tandem-system.svc:8000", id="derived from service"
        ),
        pytest.param("tandem-system/tandem-router", "http://r.x.svc:9000/", "http://r.x.svc:9000", id="url wins"),
        pytest.param("", "http://r.x.svc:9000", "http://r.x.svc:9000", id="url alone"),
        pytest.param("not-a-ref", "", "", id="malformed service ref"),
    ],
)
def test_eval_router_url(service: str, url: str, want: str) -> None:
    assert OperatorConfig(router_service=service, router_url=url).eval_router_url() == want


def test_router_url_from_env() -> None:
    config = OperatorConfig.from_env({"TANDEM_ROUTER_URL": "http://r.x.svc:9000"})
    assert config.eval_router_url() == "http://r.x.svc:9000"
