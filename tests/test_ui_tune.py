"""The app's Tune tab, driven as a user drives it: narrow the space, click Tune, watch trials arrive.

Real (inline, tiny) trials of a model whose step time is set by the OS clock: per sample, batch 8
is faster than batch 4 by construction, so the winner the view shows has an independent truth."""

from __future__ import annotations

from typing import Any

import pytest
from sleepy_workload import sleepy_workload

from workbench.protocol import Protocol
from workbench.workloads import Workload

pytest.importorskip("ipywidgets")
pytest.importorskip("jupyter_bokeh")

from workbench.ui.tune_view import TuneView


def _spec(workload: Workload) -> dict[str, Any]:
    options = {"isolation": "inline", "track_memory": True, "protocol": Protocol(design="processes", precision=0.1),
               "store": None, "seed_from_diagnosis": False}  # fmt: skip
    return {"workload": workload, "preset": "tiny", "device": "cpu", "warmup": 1, "steps": 4, "trial_options": options}


def test_tune_tab_shows_trials_arriving_then_the_verified_winner_and_its_export() -> None:
    workload = sleepy_workload()
    view = TuneView(lambda: _spec(workload), insert_cell=lambda text: "inserted")
    view.refresh_space()
    assert "batch_size" in view._selectors and "amp" in view._selectors
    compile_select, compile_values = view._selectors["compile"]  # widening: offered, not chosen by default
    assert "max-autotune" in compile_values and "reduce-overhead" not in compile_values  # CUDA graphs: not on a CPU
    assert [compile_values[i] for i in compile_select.value] == ["off", "default"]
    for name, (select, values) in view._selectors.items():  # narrow: batch size only
        select.value = tuple(range(len(values))) if name == "batch_size" else (0,)
    assert view.space()["batch_size"] == [2, 4, 8]

    seen: list[int] = []
    forward = view.on_update

    def watch(update: dict[str, Any]) -> None:
        forward(update)
        if update["event"] == "trial":  # what the view shows at that moment, before the search ends
            seen.append(view.trials.value.count("<tr>") - 1)

    view.on_update = watch  # type: ignore[method-assign]
    view.budget.value = 30
    assert view.start()
    assert view.cancel_button.disabled is False
    view.wait(timeout=120)
    assert seen == list(range(1, len(seen) + 1)) and len(seen) >= 3, "each finished trial adds a row as it ends"
    assert view.result is not None and view.result["best"]["config"]["batch_size"] == 8
    assert "Winner" in view.best.value and "[" in view.best.value  # the interval is shown
    front = next(el for el in view.chart.view if el.label == "Pareto front").dframe()
    (winner,) = [el for el in view.chart.view if el.label == "verified winner"]
    assert len(front) >= 1 and winner.dframe()["config"].tolist() == ["batch_size: default → 8"]
    assert "torch" in view.export.snippet.value
    assert view.start_button.disabled is False and view.cancel_button.disabled is True


def test_a_bad_max_memory_is_refused_in_the_view() -> None:
    workload = sleepy_workload()
    view = TuneView(lambda: _spec(workload), insert_cell=lambda text: "inserted")
    view.max_memory.value = "lots"
    assert not view.start()
    assert "not a size" in view.status.value


def test_the_app_has_a_tune_tab() -> None:
    from workbench.ui import Workbench

    app = Workbench(sleepy_workload(), device="cpu")
    try:
        tabs = [w for w in app.widget.children if hasattr(w, "titles") and "Tune" in (w.titles or ())]
        assert tabs and app.tune.widget in tabs[0].children
        assert app.tune.space()  # generated from this device's capabilities
    finally:
        app.close()
