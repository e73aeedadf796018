"""Small start-up check helpers, shared by the framework's validation and the families' ``check``.

Every message names the key path, what is wrong and how to fix it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional


class ConfigError(ValueError):
    """A configuration problem found at start-up; the message names the key and the fix."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def choice(value: Any, key: str, allowed: Iterable) -> None:
    allowed = list(allowed)
    require(value in allowed, f"{key}={value!r} is not allowed; use one of: {', '.join(map(str, allowed))}")


def bound(value: Any, key: str, ok: Callable[[Any], bool], rule: str, fix: str, null: Optional[str] = None) -> None:
    """``value`` (of ``key``) must satisfy ``ok`` (``rule`` says how in words); ``fix`` says what to set.

    ``null``: None is allowed and means this (e.g. "to disable it"); it is not passed to ``ok``.
    """
    if null is not None and value is None:
        return
    require(ok(value), f"{key}={value!r} {rule}; {fix}" + (f" (or null {null})" if null else ""))


def positive(value: Any, key: str) -> None:
    bound(value, key, lambda v: v >= 1, "must be a positive integer", "set it to 1 or more")
