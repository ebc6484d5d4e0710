"""Live charts: HoloViews' `Buffer` stream against the raw Bokeh update the app uses — the Python-side
cost of one update, as a ratio.

The app's live step-time chart gets a few new points several times a second while a trial runs, in the
notebook kernel that also drives the trial (`ui.charts`: the whole small data of a ColumnDataSource
replaced, unchanged data not sent). HoloViews could do the same with a `DynamicMap` over a `Buffer`
stream. Both here draw one line of step times into a Bokeh document, `--points` new points per update,
the last `--length` points shown, and time `--updates` updates each, interleaved in rounds (raw, hv,
hv, raw, ...) so a drifting machine hits both alike. The document's change events are what a notebook
would send to the browser; they are counted, so neither side is timed doing nothing.

    .venv/bin/python benchmarks/live_stream_views.py [--updates 200] [--points 4] [--length 600] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np


def raw_bokeh(points: int, length: int) -> tuple[Callable[[int], None], Callable[[], int]]:
    """The app's way: one ColumnDataSource in a Document, its data replaced per update."""
    from bokeh.document import Document
    from bokeh.models import ColumnDataSource
    from bokeh.plotting import figure

    source = ColumnDataSource({"step": [], "ms": []})
    plot = figure(height=200)
    plot.line("step", "ms", source=source)
    doc = Document()
    doc.add_root(plot)
    events: list[object] = []
    doc.on_change(lambda event: events.append(event))
    xs: list[float] = []
    ys: list[float] = []

    def update(i: int) -> None:
        start = i * points
        xs.extend(range(start, start + points))
        ys.extend(np.random.default_rng(i).normal(50.0, 2.0, points).tolist())
        source.data = {"step": xs[-length:], "ms": ys[-length:]}

    return update, lambda: len(events)


def holoviews_buffer(points: int, length: int) -> tuple[Callable[[int], None], Callable[[], int]]:
    """HoloViews' way: a DynamicMap of a Curve over a Buffer stream, rendered into a Bokeh Document."""
    import holoviews as hv
    import pandas as pd
    from bokeh.document import Document

    hv.extension("bokeh", logo=False)
    buffer = hv.streams.Buffer(pd.DataFrame({"step": [], "ms": []}), length=length, index=False)
    dmap = hv.DynamicMap(lambda data: hv.Curve(data, "step", "ms"), streams=[buffer])
    doc = Document()
    plot = hv.renderer("bokeh").get_plot(dmap, doc=doc)
    doc.add_root(plot.state)
    events: list[object] = []
    doc.on_change(lambda event: events.append(event))

    def update(i: int) -> None:
        start = i * points
        buffer.send(
            pd.DataFrame(
                {"step": np.arange(start, start + points), "ms": np.random.default_rng(i).normal(50.0, 2.0, points)}
            )
        )

    return update, lambda: len(events)


def timed(update: Callable[[int], None], first: int, count: int) -> float:
    """Milliseconds per update over `count` updates."""
    began = time.perf_counter()
    for i in range(first, first + count):
        update(i)
    return (time.perf_counter() - began) * 1000.0 / count


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--updates", type=int, default=200, help="updates timed per side and round")
    parser.add_argument("--points", type=int, default=4, help="new points per update")
    parser.add_argument("--length", type=int, default=600, help="points the chart keeps")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    raw, raw_events = raw_bokeh(args.points, args.length)
    hv_update, hv_events = holoviews_buffer(args.points, args.length)
    for side in (raw, hv_update):  # warm: the first updates import and build lazily
        timed(side, 0, 20)
    per_update: dict[str, list[float]] = {"raw Bokeh": [], "HoloViews Buffer": []}
    first = 20
    for r in range(args.rounds):
        order = [("raw Bokeh", raw), ("HoloViews Buffer", hv_update)]
        for name, update in order if r % 2 == 0 else order[::-1]:
            per_update[name].append(timed(update, first, args.updates))
        first += args.updates
    for name, values in per_update.items():
        shown = ", ".join(f"{v:.3f}" for v in values)
        print(f"{name:>16}: {statistics.median(values):.3f} ms per update (rounds: {shown})")
    ratios = [h / r for h, r in zip(per_update["HoloViews Buffer"], per_update["raw Bokeh"])]
    shown = ", ".join(f"{x:.2f}" for x in ratios)
    print(f"HoloViews Buffer / raw Bokeh: median {statistics.median(ratios):.2f}x per update (rounds: {shown})")
    print(f"document change events: raw Bokeh {raw_events()}, HoloViews {hv_events()}")


if __name__ == "__main__":
    main()
