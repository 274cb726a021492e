"""The EPP's high availability as rendered: active-active replicas (2 by default), spread, a PodDisruptionBudget
from two replicas, a rolling update that never goes below the replicas, and a graceful removal. The behaviour
under load is proven on the real node (``e2e/tests/test_e2e_cpu_example.py``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hisparse_operator import names
from hisparse_operator.api.spec import RoutingSpec
from hisparse_operator.render import render
from hisparse_operator.render.routing import EPP_PRE_STOP_SECONDS, ROUTE_REQUEST_TIMEOUT_SECONDS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hisparse-deployment.yaml"


def _doc(**routing: Any) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["routing"].pop("eppReplicas", None)
    doc["spec"]["routing"].update(routing)
    return doc


def _epp(objs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    name = names.epp(objs[0]["metadata"]["labels"]["serving.hisparse.dev/deployment"])
    (dep,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget" and o["spec"]["selector"]["matchLabels"]
            == dep["spec"]["selector"]["matchLabels"]]
    return dep, pdbs


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_two_active_replicas_by_default_one_disruption_at_a_time() -> None:
    assert RoutingSpec.model_fields["epp_replicas"].default == 2
    dep, pdbs = _epp(render(_doc()))
    assert dep["spec"]["replicas"] == 2
    (pdb,) = pdbs
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert _matches(pdb["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"])
    # Every replica serves: with GIE's leader election only the leader is Ready.
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert not [a for a in container["args"] if "leader-election" in a], container["args"]
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def test_replicas_spread_over_nodes_and_zones_without_becoming_unschedulable() -> None:
    dep, _ = _epp(render(_doc()))
    pod = dep["spec"]["template"]
    spread = pod["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for c in spread:
        assert c["whenUnsatisfiable"] == "ScheduleAnyway" and c["maxSkew"] == 1
        assert _matches(c["labelSelector"]["matchLabels"], pod["metadata"]["labels"])
        # Counted per ReplicaSet: a rolling update's new pods spread among themselves.
        assert c["matchLabelKeys"] == ["pod-template-hash"]


def test_a_deleted_epp_keeps_routing_then_finishes_its_streams() -> None:
    dep, _ = _epp(render(_doc()))
    spec = dep["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": EPP_PRE_STOP_SECONDS}}}
    assert EPP_PRE_STOP_SECONDS > 0
    # A stream lasts as long as the request it routes, bounded by the HTTPRoute's timeout.
    assert spec["terminationGracePeriodSeconds"] >= EPP_PRE_STOP_SECONDS + ROUTE_REQUEST_TIMEOUT_SECONDS
    route = next(o for o in render(_doc()) if o["kind"] == "HTTPRoute")
    assert route["spec"]["rules"][0]["timeouts"]["request"] == f"{ROUTE_REQUEST_TIMEOUT_SECONDS}s"


def test_an_epp_is_ready_only_once_its_ext_proc_port_accepts() -> None:
    """GIE's health service passes before the ext_proc server listens: the startup probe holds readiness back."""
    from hisparse_operator.render.routing import EPP_GRPC_PORT

    dep, _ = _epp(render(_doc()))
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["startupProbe"]["tcpSocket"] == {"port": EPP_GRPC_PORT}
    assert {"name": "grpc", "containerPort": EPP_GRPC_PORT} in container["ports"]
    assert container["readinessProbe"]["grpc"]["port"] != EPP_GRPC_PORT


def test_one_replica_renders_no_budget_and_scaling_changes_only_the_replicas() -> None:
    one, pdbs = _epp(render(_doc(eppReplicas=1)))
    assert one["spec"]["replicas"] == 1 and pdbs == []
    three, pdbs = _epp(render(_doc(eppReplicas=3)))
    assert three["spec"]["replicas"] == 3 and len(pdbs) == 1
    # The pod template is the same whatever the count: scaling the EPP restarts no EPP pod.
    assert one["spec"]["template"] == three["spec"]["template"]


@pytest.mark.parametrize("value", [0, 17])
def test_replicas_out_of_range_are_refused(value: int) -> None:
    with pytest.raises(Exception) as err:
        render(_doc(eppReplicas=value))
    assert "eppReplicas" in str(err.value) or "epp_replicas" in str(err.value)


def test_the_epp_is_not_part_of_a_revision() -> None:
    """EPP changes (its replicas, its rendering) roll in place: they are not a canary of the serving pods."""
    from hisparse_operator.api import HiSparseDeployment
    from hisparse_operator.render.shaping import revision

    docs = [_doc(eppReplicas=n) for n in (1, 2, 5)]
    revs = {revision(HiSparseDeployment.model_validate(copy.deepcopy(d))) for d in docs}
    assert len(revs) == 1, revs
