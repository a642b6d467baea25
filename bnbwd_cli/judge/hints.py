"""Likely causes of a failure, named from the shape of the deviation (filled in below)."""

from __future__ import annotations


def diff_src_hints(comparison, fit, facts, inputs) -> tuple[str, ...]:
    return ()


def sum_hints(output, comparison, actual, reference, facts, inputs) -> tuple[str, ...]:
    return ()
