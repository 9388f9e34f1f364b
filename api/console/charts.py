"""Server-drawn line charts: the geometry of an SVG chart (axes, ticks, one polyline per
series, rings on chosen points, a legend) as plain values. The `chart` macro of
`templates/_macros.html` writes them as inline SVG, escaped like the rest of the page,
so the console fetches nothing to draw (no script, no third-party asset).

A chart with no point at all is `empty`: the template shows its `empty_text` ("no data
yet") in the frame instead of axes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#be185d",
           "#4b5563")
WIDTH, PLOT_HEIGHT = 560, 200
EMPTY_PLOT_HEIGHT = 80
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 30, 44
LEGEND_ROW = 18
Point = tuple[float, float]


@dataclass(frozen=True)
class Series:
    """One named line: (x, y) points; x is a category's value when the chart has
    categories."""

    name: str
    points: Sequence[Point]
    dashed: bool = False
    color: str | None = None


@dataclass(frozen=True)
class Tick:
    at: float  # pixels along its axis
    label: str


@dataclass(frozen=True)
class Mark:
    x: float
    y: float
    title: str


@dataclass(frozen=True)
class Line:
    name: str
    color: str
    dashed: bool
    points: str  # the SVG polyline's "x,y x,y ..."
    marks: tuple[Mark, ...]


@dataclass(frozen=True)
class Legend:
    name: str
    color: str
    dashed: bool
    x: float
    y: float


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    x_label: str
    y_label: str
    width: int = WIDTH
    height: int = TOP + PLOT_HEIGHT + BOTTOM
    left: int = LEFT
    top: int = TOP
    right: int = WIDTH - RIGHT
    bottom: int = TOP + PLOT_HEIGHT
    x_ticks: tuple[Tick, ...] = ()
    y_ticks: tuple[Tick, ...] = ()
    lines: tuple[Line, ...] = ()
    rings: tuple[Mark, ...] = ()
    legend: tuple[Legend, ...] = ()
    empty_text: str = "no data yet"
    empty: bool = True
    notes: tuple[str, ...] = field(default=())


def nice_step(span: float, count: int) -> float:
    """A 1, 2 or 5 times a power of ten step that cuts `span` into about `count` parts."""
    raw = span / max(count, 1)
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * power:
            return m * power
    return 10 * power


def y_domain(values: Sequence[float], floor_zero: bool = True) -> tuple[float, float, float]:
    """(low, high, step) of a value axis that holds every value, on round numbers."""
    lo = min(0.0, min(values)) if floor_zero else min(values)
    hi = max(values)
    if hi - lo < 1e-12:
        hi = lo + (abs(lo) or 1.0)
    step = nice_step(hi - lo, 4)
    return math.floor(lo / step) * step, math.ceil(hi / step) * step, step


def number(v: float) -> str:
    """A tick label: no trailing zeros, thousands separated."""
    if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
        return f"{v:.1e}"
    text = f"{v:,.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


class _Scale:
    def __init__(self, lo: float, hi: float, a: float, b: float) -> None:
        self.lo, self.hi, self.a, self.b = lo, hi, a, b

    def __call__(self, v: float) -> float:
        span = self.hi - self.lo or 1.0
        return round(self.a + (v - self.lo) / span * (self.b - self.a), 1)


def _x_axis(series: Sequence[Series], categories: Sequence[float] | None,
            x_range: tuple[float, float] | None, fmt: Callable[[float], str],
            x_step: float | None) -> tuple[Callable[[float], float], tuple[Tick, ...]]:
    """Where each x goes, and the ticks: evenly spaced categories, else a linear axis over
    `x_range` (or the points' span)."""
    left, right = LEFT + 8, WIDTH - RIGHT - 8
    if categories is not None:
        slots = {c: i for i, c in enumerate(categories)}
        scale = _Scale(0, max(len(categories) - 1, 1), left, right)
        if len(categories) == 1:
            scale = _Scale(-1, 1, left, right)
        ticks = tuple(Tick(scale(i), fmt(c)) for c, i in slots.items())
        return (lambda x: scale(slots[x])), ticks
    xs = [x for s in series for x, _ in s.points]
    lo, hi = x_range or (min(xs), max(xs))
    if hi <= lo:
        lo, hi = lo - 1, hi + 1
    scale = _Scale(lo, hi, left, right)
    step = x_step or nice_step(hi - lo, 6)
    if all(float(x).is_integer() for x in xs):  # steps, counts: no tick between two
        step = max(step, 1.0)
    first = math.ceil(lo / step) * step
    ticks = tuple(Tick(scale(first + i * step), fmt(first + i * step))
                  for i in range(int((hi - first) / step + 1e-9) + 1))
    return scale, ticks


def line_chart(chart_id: str, title: str, series: Sequence[Series], x_label: str,
               y_label: str, *, categories: Sequence[float] | None = None,
               x_range: tuple[float, float] | None = None,
               x_format: Callable[[float], str] = number, x_step: float | None = None,
               rings: Sequence[tuple[float, float, str]] = (),
               empty_text: str = "no data yet") -> Chart:
    """The chart of `series` (module docstring). `rings`: (x, y, title) points to circle."""
    shown = [s for s in series if s.points]
    base = Chart(chart_id, title, x_label, y_label, empty_text=empty_text)
    if not shown:  # a short frame with the empty text
        return Chart(chart_id, title, x_label, y_label, height=TOP + EMPTY_PLOT_HEIGHT + 8,
                     bottom=TOP + EMPTY_PLOT_HEIGHT, empty_text=empty_text)
    to_x, x_ticks = _x_axis(shown, categories, x_range, x_format, x_step)
    lo, hi, step = y_domain([y for s in shown for _, y in s.points])
    to_y = _Scale(lo, hi, base.bottom, base.top)
    y_ticks = tuple(Tick(to_y(lo + i * step), number(lo + i * step))
                    for i in range(int(round((hi - lo) / step)) + 1))
    lines = []
    for i, s in enumerate(shown):
        color = s.color or PALETTE[i % len(PALETTE)]
        marks = tuple(Mark(to_x(x), to_y(y), f"{s.name}: {x_format(x)} -> {number(y)}")
                      for x, y in s.points)
        lines.append(Line(s.name, color, s.dashed,
                          " ".join(f"{m.x},{m.y}" for m in marks), marks))
    per_row = 3
    legend = tuple(Legend(line.name, line.color, line.dashed,
                          LEFT + (i % per_row) * 160,
                          base.bottom + 56 + (i // per_row) * LEGEND_ROW)
                   for i, line in enumerate(lines))
    rows = -(-len(lines) // per_row)
    return Chart(chart_id, title, x_label, y_label,
                 height=base.height + rows * LEGEND_ROW + 10, x_ticks=x_ticks, y_ticks=y_ticks,
                 lines=tuple(lines), empty=False, empty_text=empty_text, legend=legend,
                 rings=tuple(Mark(to_x(x), to_y(y), t) for x, y, t in rings))
