"""The controller: kopf handlers around a pure render, server-side apply of what differs, status."""

from .reconcile import Outcome, reconcile

__all__ = ["Outcome", "reconcile"]
