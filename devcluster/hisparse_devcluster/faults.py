"""Fault injection through KWOK's upstream chaos Stages.

The dev cluster's KWOK loads these Stages; each acts only on objects carrying
its opt-in label, so everything else behaves normally. Set the label on a pod
template (or a node) to make KWOK report the failure, e.g. to drive an
operator's rollback path.
"""

from __future__ import annotations

__all__ = ["NODE_NOT_READY", "POD_CONTAINER_FAILED", "POD_INIT_CONTAINER_FAILED", "STAGES"]

NODE_NOT_READY = "node-not-ready.stage.kwok.x-k8s.io"
"""Label a Ready node ``"true"``: about a second later its conditions turn NotReady."""

POD_CONTAINER_FAILED = "pod-container-running-failed.stage.kwok.x-k8s.io"
"""Label a pod ``"true"``: once Running, its containers terminate (exit code 1) and
the pod turns ``Failed``. Annotations ``<label>/exit-code``, ``/reason``,
``/message``, ``/container-name`` and ``/delay`` refine it."""

POD_INIT_CONTAINER_FAILED = "pod-init-container-running-failed.stage.kwok.x-k8s.io"
"""Label a pod ``"true"``: its init containers fail."""

STAGES = ("node-not-ready", "pod-container-running-failed", "pod-init-container-running-failed")
"""Names of the upstream Stages behind these labels (checked at start)."""
