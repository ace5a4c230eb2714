"""Scheduling policies, one stage each, found by name: see :mod:`gpuloom.policies.base`."""

from .base import (
    STAGES,
    FreeState,
    GroupPolicy,
    OrderPolicy,
    PlacePolicy,
    PolicyError,
    Request,
    SizePolicy,
    View,
    lookup,
    make,
    names,
    register,
)

__all__ = [
    "STAGES", "FreeState", "GroupPolicy", "OrderPolicy", "PlacePolicy", "PolicyError", "Request",
    "SizePolicy", "View", "lookup", "make", "names", "register",
]
