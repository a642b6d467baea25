"""Reading JSON documents bnbwd wrote (`bnbwd report` merges check's --json documents): a regular file, or "-"
for stdin, parsed strictly (no NaN or Infinity: bnbwd never writes them), at most MAX_BYTES."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.common import display, open_regular, reason

MAX_BYTES = 1 << 30  # a check document of 100k cases is ~300 MB; more is not one of ours


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_document(source: str) -> Any:
    """The parsed JSON of a file (or stdin for "-"): an InputError naming the file when it cannot be read or is
    not JSON."""
    shown = "stdin" if source == "-" else display(source)
    try:
        if source == "-":
            data = sys.stdin.buffer.read(MAX_BYTES + 1)
        else:
            with open_regular(Path(source), shown) as file:
                data = file.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise BnbwdError(f"{shown}: no such file or directory") from None  # as the tensor readers say it
    except OSError as exc:
        raise BnbwdError(f"{shown}: {reason(exc)}") from None
    if len(data) > MAX_BYTES:
        raise BnbwdError(f"{shown}: over {MAX_BYTES >> 20} MiB; not a bnbwd JSON document")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BnbwdError(f"{shown}: not JSON ({reason(exc)})") from None
