"""User data as printed: names, paths and values shown literally, whatever bytes they hold.

Every name bnbwd prints came from somewhere it does not control (a file's member names, a directory's file
names, a command line), so it reaches the terminal through literal(): control characters are shown as
escapes (ESC as \\x1b, a newline as \\n), so that no name can recolour the terminal, retitle its window or
forge a report line; a long value is cut in the middle. The consoles are built without rich markup
(render/text.make_console), so `[bold red]` or `[/]` in a name is printed as it is, never interpreted.
A leaf: errors.py makes every InputError's message printable with it, and no rich is loaded for an error line.
"""

from __future__ import annotations

import re

VALUE_LIMIT = 200  # characters of one value (a name, a path) in a line
LINE_LIMIT = 1000  # characters of one error or note line, whatever it quotes

# C0 and C1 controls, DEL, the line and paragraph separators, the bidirectional overrides (they reorder what
# follows on the line), and lone surrogates (bytes of a name that are not UTF-8, from os.fsdecode).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_LONG_WORD = re.compile(r"\S{%d,}" % (VALUE_LIMIT + 1))
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def clip(text: str, limit: int = VALUE_LIMIT) -> str:
    """`text` cut to at most `limit` characters, the middle elided."""
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return f"{text[:half]}...{text[-half:]}"


def _escape(match: re.Match) -> str:
    char = match.group()
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape): shown as that byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def literal(value: object, limit: int | None = VALUE_LIMIT) -> str:
    """`value` as printable text: each control character as an escape, at most `limit` characters (the middle
    elided; None: all of them)."""
    text = str(value)
    if limit is None:
        return _UNPRINTABLE.sub(_escape, text)
    # Cut before escaping (a 10 MB name costs nothing), and again after (escapes are up to 4 characters each).
    return clip(_UNPRINTABLE.sub(_escape, clip(text, limit)), limit)


def literal_line(text: str) -> str:
    """A whole error or note line as printable text: each value in it (a run of non-blank characters: a path, a
    key) cut to VALUE_LIMIT characters, the line to LINE_LIMIT, control characters escaped."""
    text = clip(text, 4 * LINE_LIMIT)  # what a line may quote at most, before the work below
    text = _LONG_WORD.sub(lambda match: literal(match.group()), text)
    return literal(text, LINE_LIMIT)
