"""The picture of a failing output: its failing share over channel groups (rows) x blocks of each channel's positions
(columns: the other axes flattened in storage order), one character a cell, so that a stride, a tail or a tile shows
at a glance. The counts are judge/heat_map.py's HeatMap; here they are only drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from bnbwd_cli.judge.comparison import Comparison
    from bnbwd_cli.judge.heat_map import HeatMap

# the failing share of a cell: none, then up to a quarter, a half, three quarters, more
SHADES = ("·", "░", "▒", "▓", "█")
LEGEND = "· none  ░ < 25%  ▒ < 50%  ▓ < 75%  █ >= 75% of the cell's elements fail"


def shade(share: float) -> str:
    """One cell's character: · for no failure, then by the quarter its failing share reaches."""
    if share <= 0:
        return SHADES[0]
    return SHADES[1 + min(3, int(share * 4))]


def _span(lo: int, hi: int) -> str:
    return f"{lo}" if lo == hi else f"{lo}..{hi}"


def picture_lines(picture: HeatMap, channel: str, others: str) -> list[str]:
    """The map as plain lines: a header, one row per channel group (its channels, then its cells), the legend.
    ``channel``: the channel axis's name; ``others``: the other axes' names, as flattened."""
    labels = [f"{channel}={_span(*rows)}" for rows in picture.channels]
    width = max(len(label) for label in labels)
    first, last = picture.positions[0][0], picture.positions[-1][1]
    columns = len(picture.positions)
    ends = f"{first}".ljust(columns - len(f"{last}")) + f"{last}" if columns > len(f"{first}{last}") else f"{first}..{last}"
    lines = [f"failing share: rows {channel}, columns {columns} blocks of each channel's {last + 1} positions "
             f"({others} flattened in storage order)",
             f"{'':{width}}  {ends}"]
    for label, failing, elements in zip(labels, picture.failing, picture.elements):
        lines.append(f"{label:>{width}}  " + "".join(shade(f / e) for f, e in zip(failing, elements)))
    lines.append(f"{'':{width}}  {LEGEND}")
    return lines


def render_output_picture(console: Console, c: Comparison) -> None:
    """A failing output's map, its axes named as the report names them."""
    names = c.axis_names or tuple(f"dim{a}" for a in range(len(c.shape)))
    axis = c.channel_axis
    render_picture(console, c.details.picture, names[axis], ", ".join(n for a, n in enumerate(names) if a != axis))


def render_picture(console: Console, picture: HeatMap, channel: str, others: str) -> None:
    """The map in the report: failing cells in red where the terminal has colour."""
    for line in picture_lines(picture, channel, others):
        text = Text(line)
        for shaded in SHADES[1:]:
            text.highlight_words([shaded], style="red")
        console.print(text, soft_wrap=True, highlight=False)
