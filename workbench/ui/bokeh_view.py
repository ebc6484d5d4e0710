"""The base of the app's Bokeh views: one document shown through jupyter_bokeh, re-sent in full
whenever a browser view of it reports ready.

Messages sent before the browser view exists are lost for good: a trial streamed in the same
cell as `display` once left a chart blank. So each view keeps its whole state on the Python
side, replaces whole (small) sources rather than streaming deltas, and pushes everything again
on `DocumentReady`, which BokehJS sends from every new view. BokehJS itself is published
inline (`load_bokehjs`): the machine may have no internet, and the CDN default then renders nothing.
"""

from __future__ import annotations

from typing import Any

from bokeh.document import Document
from bokeh.events import DocumentReady, Event
from jupyter_bokeh import BokehModel


class BokehView:
    """Subclasses call `bokeh_model(root)` once and implement `resend()` from their own state."""

    document: Document
    ready_count: int = 0
    """How many front-end views reported ready (each triggers a full re-send)."""

    def bokeh_model(self, root: Any) -> BokehModel:
        """Put `root` in this view's document; the widget that shows it."""
        self.document = Document()
        self.document.add_root(root)
        self.document.on_event(DocumentReady, self._on_view_ready)
        return BokehModel(root)

    def resend(self) -> None:
        """Push the view's whole state to its sources."""
        raise NotImplementedError

    def _on_view_ready(self, event: Event) -> None:
        # Runs on the kernel's thread when the browser's jsevent arrives.
        self.ready_count += 1
        self.resend()


_BOKEHJS_LOADED = False


def load_bokehjs(force: bool = False) -> None:
    """Publish BokehJS inline (no CDN: there may be no internet) once per kernel, before the first chart."""
    global _BOKEHJS_LOADED
    if _BOKEHJS_LOADED and not force:
        return
    from bokeh.io.notebook import load_notebook
    from bokeh.resources import Resources

    load_notebook(resources=Resources(mode="inline", components=["bokeh"]), hide_banner=True)
    _BOKEHJS_LOADED = True
