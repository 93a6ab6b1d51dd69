"""The one palette every hetplan picture draws GPU types (and models) with: a colour and a line style each.

A fleet easily holds more GPU types than a colour cycle has colours (the default catalog has 17; matplotlib's
cycle repeats after 10, so A10 and L40S came out the same blue). Keys get a distinct (colour, line style,
marker) triple, in sorted order: 10 colours x 4 line styles tell 40 keys apart, and the same set of keys always
gets the same styles, so one report's panels agree with each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# matplotlib's "tab10", spelled out so the palette does not depend on the style in force
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


@dataclass(frozen=True)
class Style:
    """How one key is drawn: `ax.plot(x, y, **style.line())`."""

    colour: str
    linestyle: str
    marker: str

    def line(self) -> dict[str, str]:
        return {"color": self.colour, "linestyle": self.linestyle}


def styles(keys: Iterable[object]) -> dict[str, Style]:
    """A distinct style per key (as a string), assigned in sorted order; beyond `distinct_capacity()` keys the
    styles repeat."""
    names = sorted({str(k) for k in keys})
    out = {}
    for i, name in enumerate(names):
        colour = COLOURS[i % len(COLOURS)]
        linestyle = LINESTYLES[(i // len(COLOURS)) % len(LINESTYLES)]
        out[name] = Style(colour, linestyle, MARKERS[(i + i // len(COLOURS)) % len(MARKERS)])
    return out


def distinct_capacity() -> int:
    """How many keys `styles` tells apart."""
    return len(COLOURS) * len(LINESTYLES)
