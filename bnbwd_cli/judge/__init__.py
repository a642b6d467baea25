"""Judge a kernel's outputs against a reference: pure comparison, arrays in, frozen dataclasses out.

The comparison itself is in judge/sets.py (``compare_sets``), the per-array statistics in
judge/compare.py, the error model in judge/model.py. This package loads them on first use
(module ``__getattr__``, PEP 562): `bnbwd run` without --reference needs only judge/tolerance.py
(the defaults its comparison options show), and the rest costs start-up time.
"""

from __future__ import annotations

import importlib

# Public name -> submodule that defines it.
_LAZY = {
    "Judging": "tolerance",
    "Comparison": "comparison",
    "compare_arrays": "compare",
    "OutputResult": "sets",
    "SetComparison": "sets",
    "compare_sets": "sets",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
