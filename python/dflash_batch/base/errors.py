"""Errors raised from Python carry what the core's do: a ``kind`` and the ``setting`` (or ``row``) they
are about, so a bad setting is the same class with the same fields wherever it is checked."""

from __future__ import annotations

from .._core import Error, PlanError


def invalid_setting(name: str, message: str) -> PlanError:
    """A ``PlanError`` (a ``ValueError``) of kind ``invalid_setting`` about setting ``name``."""
    error = PlanError(message)
    error.kind, error.reason, error.setting = "invalid_setting", "invalid_setting", name
    return error


def retold(error: Error, message: str) -> Error:
    """``error`` with another message — the same class, with its fields (``kind``, ``row``, ``path``, ...)."""
    told = type(error)(message)
    for field in ("kind", "reason", "row", "setting", "path"):
        if hasattr(error, field):
            setattr(told, field, getattr(error, field))
    return told
