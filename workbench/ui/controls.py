"""The control panel, generated from `TrainConfig`'s fields and `capabilities()` — no hand list.

Every enumerated field becomes a row of toggle buttons whose per-option tooltips carry
the field's docstring and, for a choice this device cannot run, the reason. ipywidgets
cannot disable one option of a selection widget, so an unavailable choice is labelled
"(n/a)", and choosing it is refused: the control snaps back and the reason is shown in
red under it. Fields that `capabilities()` lists are the main toggles; the rest
(numbers, names, workload options) go under "More settings". An open-ended field that
`capabilities()` lists values for (world sizes) is offered those values.
"""

from __future__ import annotations

import html
import typing
from collections.abc import Mapping
from typing import Any

import ipywidgets as widgets

from workbench.config import (
    ConfigError,
    TrainConfig,
    field_choices,
    field_doc,
    field_names,
    field_type,
    parse_overrides,
)
from workbench.config import parse_value as parse_field_value
from workbench.device import Availability

UNAVAILABLE_MARK = " (n/a)"


def choice_label(value: Any) -> str:
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


class ChoiceControl:
    """Toggle buttons for one enumerated field; refuses unavailable choices with the reason."""

    def __init__(self, name: str, choices: tuple[Any, ...], default: Any, table: Mapping[Any, Availability]) -> None:
        self.name = name
        self.availability = {c: table.get(c, Availability(True)) for c in choices}
        doc = field_doc(name)
        labels, tips = [], []
        for choice in choices:
            avail = self.availability[choice]
            label = choice_label(choice)
            if not avail.available:
                labels.append(label + UNAVAILABLE_MARK)
                tips.append(f"Not available here: {avail.reason}")
            else:
                labels.append(label)
                tips.append(f"{doc}" + (f"\nNote: {avail.reason}" if avail.reason else ""))
        self.buttons = widgets.ToggleButtons(
            options=list(zip(labels, choices)),
            value=default,
            tooltips=tips,
            description=name,
            tooltip=doc,
            style={"description_width": "150px", "button_width": "auto"},
        )
        self.note = widgets.HTML("")
        self.widget = widgets.VBox([self.buttons, self.note], layout=widgets.Layout(margin="0 0 2px 0"))
        self._previous = default
        self._reverting = False
        self.buttons.observe(self._changed, names="value")

    @property
    def value(self) -> Any:
        return self.buttons.value

    @value.setter
    def value(self, new: Any) -> None:
        self.buttons.value = new

    def unavailable(self) -> dict[Any, str]:
        return {c: a.reason for c, a in self.availability.items() if not a.available}

    def _changed(self, change: dict[str, Any]) -> None:
        if self._reverting:
            return
        new = change["new"]
        avail = self.availability.get(new, Availability(True))
        if avail.available:
            self._previous = new
            self.note.value = _note(avail.reason, "#8a6d3b") if avail.reason else ""
            return
        self._reverting = True
        try:
            self.buttons.value = self._previous
        finally:
            self._reverting = False
        self.note.value = _note(f"{self.name}={choice_label(new)} is not available here: {avail.reason}", "#b00020")


class TextControl:
    """A typed text box for a non-enumerated field, parsed the way the CLI parses `--set`."""

    def __init__(self, name: str, default: Any) -> None:
        self.name = name
        hint = field_type(name)
        optional = type(None) in typing.get_args(hint)
        self.box = widgets.Text(
            value="" if default is None else _format_default(default),
            placeholder="preset default" if optional else ("key=value, ..." if name == "extra" else ""),
            description=name,
            tooltip=field_doc(name),
            style={"description_width": "150px"},
            layout=widgets.Layout(width="420px"),
        )
        self.widget = self.box

    @property
    def value(self) -> Any:
        raw = self.box.value.strip()
        if self.name == "extra":
            text = ",".join(f"extra.{item.strip()}" for item in raw.split(",") if item.strip())
            return parse_overrides(text).get("extra", {})
        if not raw:
            hint = field_type(self.name)
            if type(None) in typing.get_args(hint):
                return None
            if hint is str:
                return ""
            raise ConfigError(f"{self.name} needs a value")
        return parse_field_value(self.name, raw)

    @value.setter
    def value(self, new: Any) -> None:
        self.box.value = "" if new is None else _format_default(new)


class ConfigPanel:
    """All TrainConfig fields as controls; `config()` builds (and validates) the TrainConfig."""

    def __init__(self, capabilities: Mapping[str, Mapping[Any, Availability]]) -> None:
        defaults = TrainConfig()
        self.controls: dict[str, ChoiceControl | TextControl] = {}
        for name in field_names():
            # An open-ended field that capabilities() lists values for (e.g. world sizes) is offered those values.
            choices = field_choices(name) or (tuple(capabilities[name]) if capabilities.get(name) else None)
            default = getattr(defaults, name)
            if choices is not None:
                self.controls[name] = ChoiceControl(name, choices, default, capabilities.get(name, {}))
            else:
                self.controls[name] = TextControl(name, default)
        main = [c.widget for n, c in self.controls.items() if n in capabilities]
        more = [c.widget for n, c in self.controls.items() if n not in capabilities]
        self.more = widgets.Accordion(children=[widgets.VBox(more)], titles=("More settings",), selected_index=None)
        self.unavailable = widgets.Accordion(
            children=[widgets.HTML(self._unavailable_html())],
            titles=("Not available on this device — why",),
            selected_index=None,
        )
        # Two columns: the generated list is long, and a tall panel pushes the charts off screen.
        grid = widgets.GridBox(main, layout=widgets.Layout(grid_template_columns="repeat(2, minmax(0, 1fr))"))
        self.widget = widgets.VBox([grid, self.more, self.unavailable])

    def __getitem__(self, name: str) -> ChoiceControl | TextControl:
        return self.controls[name]

    def config(self) -> TrainConfig:
        """The panel's values as a TrainConfig; a bad value or combination raises ConfigError."""
        return TrainConfig(**{name: control.value for name, control in self.controls.items()})

    def set_config(self, config: TrainConfig) -> None:
        for name, control in self.controls.items():
            control.value = getattr(config, name)

    def _unavailable_html(self) -> str:
        rows = [
            f"<li><code>{html.escape(name)}={html.escape(choice_label(value))}</code>: {html.escape(reason)}</li>"
            for name, control in self.controls.items()
            if isinstance(control, ChoiceControl)
            for value, reason in control.unavailable().items()
        ]
        return f"<ul style='margin:0'>{''.join(rows)}</ul>" if rows else "<i>Every choice can run here.</i>"


def _note(text: str, color: str) -> str:
    return f"<span style='color:{color};font-size:90%;margin-left:158px'>{html.escape(text)}</span>"


def _format_default(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)
