"""The generic argument checks: an integer, a flag, a choice among names.

Every layer may use them (the API's validation, the launchers' options, the GPU bucket table's routes), so they live
below all of them and import nothing of the package; ``validate`` holds the checks of the calls' arrays.
"""

from __future__ import annotations

import numbers

import numpy as np


def check_flag(name: str, value) -> bool:
    """``value`` is a ``bool`` (or ``numpy.bool_``); ``None``, ``0``, ``[]`` or an array are refused, not read."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__}")
    return bool(value)


def check_choice(name: str, value, choices: tuple[str, ...]) -> str:
    """``value`` is a ``str`` among ``choices``: ``TypeError`` for other types (arrays too), else ``ValueError``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, one of {', '.join(map(repr, choices))}, not {type(value).__name__}")
    value = str.__str__(value)  # a plain str: a subclass's own __eq__ or __hash__ cannot pass for a choice
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, not {value!r}")
    return value


def check_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as a Python int: the one integer check of the package.

    ``TypeError`` when ``value`` is not of an integer type (``bool``, floats, strings and
    ``numpy.timedelta64``, which NumPy counts as an integer, are refused); ``ValueError`` when it lies
    outside ``[minimum, maximum]`` (inclusive bounds, each optional). The message names ``name``.
    """
    if (isinstance(value, (bool, np.bool_, np.timedelta64)) or not isinstance(value, numbers.Integral)):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value
