"""Errors raised by the pure planner; `residency.errors` documents the whole tree."""

from __future__ import annotations


class PlannerError(Exception):
    """Base of the planner's errors: a user input that cannot be planned."""


class ModelConfigError(PlannerError):
    """A model config (HF config.json or profile) lacks a field or holds a bad value."""


class CapacityError(PlannerError):
    """The model does not fit, or leaves no room for one request's KV cache."""


class InfeasiblePlanError(PlannerError):
    """The resident budget is at or below zero, or smaller than what must be resident."""
