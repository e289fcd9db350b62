"""One look for every plot of the project: each method's colour, line style and marker, the same in
``kr_curve.png`` (one run), ``kr_curves.png`` (the comparison runner) and any later plot.

- A method has the colour and marker it declares (``MethodSpec.style``: the caller passes ``styles``,
  method -> (colour, marker)), drawn solid; colours are strong (none pale) and pairwise distinct.
- A recipe variant (``"METHOD (RECIPE)"``) keeps its method's colour and marker shape, drawn
  dash-dotted or dotted with hollow markers (``paper`` is the method itself).
- A marked run (validity flagged, or not carried out) is drawn dashed, whatever else it is.
- A name without a declared style gets a colour and marker picked by a stable hash of the name (the
  same in every process, unlike ``hash``), so a new method looks the same in every plot until it
  declares one.

Also: a legend outside the data area (:func:`legend_outside`), whole-round x ticks
(:func:`whole_rounds`) and a per-line draw order that keeps lines at the same value visible
(:func:`overlap_style`). Lives in ``tasks`` so ``tasks.diagnostics`` and ``server_app`` both import it;
it names no method and imports matplotlib only inside the functions that need it.
"""

from __future__ import annotations

import re
import zlib
from typing import Mapping

Styles = Mapping[str, tuple[str, str]]

PAPER = "paper"

#: colours and markers an unknown method is given (by a stable hash of its name): strong ones too.
FALLBACK_COLOURS = ("#2166ac", "#b2182b", "#1b7837", "#762a83", "#b35806", "#01665e", "#8c510a", "#c51b7d")
FALLBACK_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")
#: a recipe variant's line style (by a stable hash of the recipe): dash-dotted or dotted, never dashed
#: (named styles only: matplotlib reports any custom dash pattern as "--", the mark of a flagged run).
VARIANT_LINESTYLES = ("-.", ":")
MARKED_LINESTYLE = "--"  # a flagged run or one not carried out

#: the features plot: retained points grey, forget points red.
RETAINED_COLOUR = "#7f7f7f"
FORGET_COLOUR = "#d62728"
#: the original model's reference line in a KR plot (the reference methods draw in their own styles).
ORIGINAL_COLOUR = "#555555"

_LABEL = re.compile(r"^\s*(?P<method>[^()]+?)\s*(?:\((?P<recipe>[^()]*)\))?\s*$")


def _stable(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


def split_label(label: str) -> tuple[str, str]:
    """``"METHOD (RECIPE)"`` -> ``("METHOD", "RECIPE")``; ``"METHOD"`` -> ``("METHOD", "paper")``."""
    match = _LABEL.match(label or "")
    if not match:
        return (label or "?").strip(), PAPER
    return match["method"], (match["recipe"] or PAPER).strip() or PAPER


def method_colour(method: str, styles: Styles | None = None) -> str:
    """The method's colour: its declared one in ``styles``, else picked by a stable hash of its name."""
    if styles and method in styles:
        return styles[method][0]
    return FALLBACK_COLOURS[_stable(method) % len(FALLBACK_COLOURS)]


def method_marker(method: str, styles: Styles | None = None) -> str:
    if styles and method in styles:
        return styles[method][1]
    return FALLBACK_MARKERS[_stable(method) % len(FALLBACK_MARKERS)]


def line_style(method: str, recipe: str | None = None, marked: bool = False, styles: Styles | None = None) -> dict:
    """``ax.plot`` keyword arguments of a method's curve: ``color``, ``linestyle``, ``marker``,
    ``markerfacecolor`` (hollow for a recipe variant) and ``markeredgecolor``. ``marked``: a flagged
    run or one not carried out, drawn dashed. ``styles``: method -> declared (colour, marker)."""
    colour = method_colour(method, styles)
    variant = bool(recipe) and recipe != PAPER
    linestyle = VARIANT_LINESTYLES[_stable(recipe) % len(VARIANT_LINESTYLES)] if variant else "-"
    return {"color": colour, "linestyle": MARKED_LINESTYLE if marked else linestyle, "marker": method_marker(method, styles),
            "markerfacecolor": "white" if variant else colour, "markeredgecolor": colour}


def label_style(label: str, marked: bool = False, styles: Styles | None = None) -> dict:
    """:func:`line_style` of a plot label ``"method"`` or ``"method (recipe)"``."""
    return line_style(*split_label(label), marked=marked, styles=styles)


def overlap_style(index: int) -> dict:
    """What the ``index``-th line of an axes adds so lines at the same value stay apart: the first
    drawn is the widest with the largest markers, each later one thinner and on top, so a line
    covering another shows it as a coloured rim (and the markers differ in size too)."""
    return {"linewidth": max(0.8, 3.2 * 0.8 ** index), "markersize": max(3.0, 8.0 * 0.85 ** index),
            "markeredgewidth": 1.2, "zorder": 3 + 0.1 * index}


def whole_rounds(ax, points: int) -> None:
    """An x axis of rounds ``0 .. points-1``: whole-round ticks only, also for a 1- or 2-round axis."""
    from matplotlib.ticker import MaxNLocator

    last = max(points - 1, 1)
    ax.set_xlim(-0.3, last + 0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=2))


def legend_outside(ax, width: int = 44, **kwargs):
    """The axes' legend to the right of its data area (never over a curve); an entry longer than
    ``width`` characters is wrapped onto more lines (the lines' own labels stay as they are), so a long
    name does not squeeze the axes."""
    import textwrap

    handles, labels = ax.get_legend_handles_labels()
    labels = [textwrap.fill(label, width, break_long_words=False) for label in labels]
    options = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0, "fontsize": 8,
               "frameon": False}
    return ax.legend(handles, labels, **{**options, **kwargs})
