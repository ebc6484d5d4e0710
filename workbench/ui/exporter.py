"""The export panel: the selected run's configuration as a snippet, a copy button, a new cell, JSON.

The text comes from `workbench.export` unchanged. Copy is a real button: a few lines of
inline JavaScript in an HTML widget (ipywidgets renders widget HTML as is) that use the
Clipboard API, falling back to `execCommand('copy')` where the page is not a secure
context. "Insert as next cell" runs JupyterLab's own commands through ipylab, because
`set_next_input` from a button callback only lands after the *next* executed cell
(jupyterlab/jupyterlab#8893); `Workbench.insert_snippet()` in a cell is the fallback
for front ends without ipylab.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets

from workbench.config import TrainConfig
from workbench.export import to_json, to_snippet

_COPY_JS = (
    "const b=this,t=b.parentElement.querySelector('textarea');"
    "const done=()=>{b.textContent='Copied';setTimeout(()=>{b.textContent='Copy snippet'},1500)};"
    "const fallback=()=>{t.style.display='block';t.select();document.execCommand('copy');t.style.display='none';done()};"
    "if(navigator.clipboard&&window.isSecureContext){navigator.clipboard.writeText(t.value).then(done,fallback)}else{fallback()}"
)


class ExportPanel:
    """Pick a finished run; show its snippet; copy it, insert it below, or download its JSON."""

    def __init__(self, insert_cell: Callable[[str], str]) -> None:
        self._insert_cell = insert_cell
        self._labels: list[str] = []
        self._configs: list[TrainConfig] = []
        self.choice = widgets.Dropdown(
            description="export", options=[], style={"description_width": "60px"}, layout=widgets.Layout(width="560px")
        )
        self.device = widgets.ToggleButtons(
            options=["cuda", "cpu"],
            value="cuda",
            description="for device",
            style={"button_width": "auto"},
            tooltip="The device the snippet moves the model and batches to",
        )
        self.snippet = widgets.Textarea(value="", layout=widgets.Layout(width="100%", height="260px"))
        self.copy = widgets.HTML("")
        self.download = widgets.HTML("")
        self.insert = widgets.Button(
            description="Insert as next cell",
            icon="plus",
            tooltip="Add a code cell below the app holding this snippet",
            layout=widgets.Layout(width="auto"),
        )
        self.message = widgets.HTML("")
        self.insert.on_click(lambda _: self._on_insert())
        self.choice.observe(lambda _: self.refresh(), names="value")
        self.device.observe(lambda _: self.refresh(), names="value")
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.choice, self.device]),
                self.snippet,
                widgets.HBox([self.copy, self.insert, self.download]),
                self.message,
            ]
        )

    def set_choices(self, choices: Sequence[tuple[str, TrainConfig]], preferred: int | None) -> None:
        """`choices` are (label, config) of finished ok runs; `preferred` indexes the winner.

        A new set of runs selects the winner again; a user's pick stands until then.
        """
        labels = [label for label, _ in choices]
        if labels == self._labels:
            return
        self._labels, self._configs = labels, [config for _, config in choices]
        self.choice.options = [(label, i) for i, label in enumerate(labels)]
        if labels:
            self.choice.value = preferred if preferred is not None else len(labels) - 1
        self.refresh()

    @property
    def config(self) -> TrainConfig | None:
        index = self.choice.value
        return self._configs[index] if index is not None and index < len(self._configs) else None

    def refresh(self) -> None:
        config = self.config
        if config is None:
            self.snippet.value = ""
            self.copy.value = self.download.value = ""
            return
        self.snippet.value = to_snippet(config, device=self.device.value)
        self.copy.value = copy_button_html(self.snippet.value)
        self.download.value = download_link_html(to_json(config), "workbench-config.json")

    def _on_insert(self) -> None:
        if not self.snippet.value:
            self.message.value = "<i>Nothing to insert yet: finish a run first.</i>"
            return
        self.message.value = html.escape(self._insert_cell(self.snippet.value))


def copy_button_html(text: str) -> str:
    """A button that copies `text` (kept in a hidden textarea, so no escaping into JavaScript)."""
    return (
        "<div style='display:inline-block;margin-right:8px'>"
        f"<button class='jupyter-button widget-button' title='Copy the snippet to the clipboard' onclick=\"{_COPY_JS}\">Copy snippet</button>"
        f"<textarea style='display:none' readonly>{html.escape(text)}</textarea></div>"
    )


def download_link_html(text: str, filename: str) -> str:
    payload = base64.b64encode(text.encode()).decode()
    return (
        f"<a download='{html.escape(filename)}' href='data:application/json;base64,{payload}' "
        "style='margin-left:8px;line-height:28px' title='Save the configuration as JSON (TrainConfig.from_json loads it)'>"
        "Download JSON</a>"
    )


def insert_cell_via_jupyterlab(text: str, frontend: Any) -> str:
    """Insert a code cell below the active one (the app's, once clicked) holding `text`."""
    frontend.commands.execute("notebook:insert-cell-below")
    frontend.commands.execute("notebook:replace-selection", {"text": text})
    return "Inserted the snippet as a new cell below the app."
