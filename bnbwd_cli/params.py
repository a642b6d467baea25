"""Click parameter types: validation at the edge gives click's usage errors (exit 2)."""

from __future__ import annotations

import re

import click

from bnbwd_cli.layout import FORMAT_ALIASES
from bnbwd_cli.profiles import OUTPUT_NAMES


class ArraySource(click.ParamType):
    """FILE.npy, FILE.npz:key, FILE.npz (one array), FILE.safetensors[:key], raw:DTYPE:SHAPE:FILE or '-' for stdin."""

    name = "PATH"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        if not isinstance(value, str) or not value:
            self.fail("expected FILE.npy, FILE.npz:key, FILE.safetensors:key, raw:DTYPE:SHAPE:FILE or -", param, ctx)
        return value


# Tiles under this budget cost more in per-call overhead than they gain (`--block-size 1` took minutes for a
# 2 MB problem): smaller values are raised to it.
MIN_BLOCK_BYTES = 64 << 10


class ByteSize(click.ParamType):
    """A size such as 4096, 512K, 8M or 1G; values under `minimum` are raised to it."""

    name = "SIZE"
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

    def __init__(self, minimum: int = 1) -> None:
        self.minimum = minimum

    def convert(self, value, param, ctx):  # noqa: ANN001
        if isinstance(value, int):
            return max(value, self.minimum)
        match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(I?B)?\s*", str(value).upper())
        if not match or int(match.group(1)) <= 0:
            self.fail(f"{value!r} is not a size such as 4096, 512K or 8M", param, ctx)
        return max(int(match.group(1)) * self.units[match.group(2)], self.minimum)


class OutputList(click.ParamType):
    """Comma-separated output names, e.g. diff_src,diff_gamma."""

    name = "NAMES"

    def convert(self, value, param, ctx):  # noqa: ANN001
        if isinstance(value, tuple):
            return value
        names = tuple(part.strip() for part in str(value).split(",") if part.strip())
        unknown = [name for name in names if name not in OUTPUT_NAMES]
        if unknown or not names:
            self.fail(f"{value!r}: expected a comma-separated subset of {', '.join(OUTPUT_NAMES)}", param, ctx)
        return tuple(name for name in OUTPUT_NAMES if name in names)


FORMAT_CHOICE = click.Choice(list(FORMAT_ALIASES), case_sensitive=False)
