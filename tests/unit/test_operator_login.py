"""The operator's login inside a pod: the apiserver's address as client-go finds it."""

from __future__ import annotations

import pytest

from trainguard.operator.handlers import in_cluster_server

pytestmark = [pytest.mark.unit]

KOPF_DEFAULT = "https://kubernetes.default.svc"


def test_the_service_address_from_the_environment_needs_no_cluster_dns() -> None:
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_server(environ, KOPF_DEFAULT) == "https://10.96.0.1:443"


def test_an_ipv6_service_address_is_bracketed() -> None:
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_server(environ, KOPF_DEFAULT) == "https://[fd00::1]:6443"


@pytest.mark.parametrize(
    "environ", [{}, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT": "443"}]
)
def test_without_the_service_environment_kopf_default_stays(environ: dict[str, str]) -> None:
    assert in_cluster_server(environ, KOPF_DEFAULT) == KOPF_DEFAULT
