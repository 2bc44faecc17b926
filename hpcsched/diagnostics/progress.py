"""``progress()``, with distributed's signature: a text bar in a terminal, a widget in Jupyter.

``progress(*futures_or_collections, notebook=None, multi=True, complete=True)``

* Arguments are futures, lists/dicts of them, or dask collections whose graphs
  hold futures (persisted collections). Anything with no future in it is an
  error that says so, not an empty ``0/0`` bar.
* In a terminal it prints a bar and blocks until every future is done (erred
  and cancelled ones count as done and are shown).
* In Jupyter (``notebook=None`` detects it, ``ipywidgets`` must be installed)
  it returns at once and shows a widget updated from the futures' done
  callbacks (at most ten redraws a second): one bar per task group when
  ``multi``; ``complete=False`` hides groups once they are finished.

Nothing polls the scheduler: the client already learns of every future that
finishes.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from html import escape
from typing import Any

from hpcsched.core.client.futures import Future, futures_of
from hpcsched.core.graph.dsk import key_split

WIDGET_REDRAW = 0.1  # seconds between widget redraws at most


class _Tracker:
    """Counts of done futures per task group, updated from done callbacks."""

    def __init__(self, futures: list[Future], on_change: Any = None):
        self.total: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.erred: dict[str, int] = {}
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.left = len(futures)
        self.on_change = on_change
        self.start = time.monotonic()
        groups: dict[Any, str] = {}
        for f in futures:
            g = groups[f.key] = key_split(f.key)
            self.total[g] = self.total.get(g, 0) + 1
            self.done.setdefault(g, 0)
            self.erred.setdefault(g, 0)
        if not futures:
            self.finished.set()
        for f in futures:
            f.add_done_callback(functools.partial(self._one, group=groups[f.key]))

    def _one(self, fut: Future, group: str) -> None:
        with self.lock:
            self.done[group] += 1
            if fut.status != "finished":
                self.erred[group] += 1
            self.left -= 1
            last = self.left == 0
        if self.on_change is not None:
            self.on_change(last)
        if last:
            self.finished.set()

    def totals(self) -> tuple[int, int, int]:
        with self.lock:
            return sum(self.done.values()), sum(self.total.values()), sum(self.erred.values())


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    ip = shell.get_ipython() if hasattr(shell, "get_ipython") else None
    return type(ip).__name__ == "ZMQInteractiveShell"


def _text_bar(done: int, total: int, erred: int, elapsed: float, width: int = 40) -> str:
    frac = done / total if total else 1.0
    bar = "#" * int(width * frac)
    tail = f" | {erred} erred" if erred else ""
    return f"\r[{bar:<{width}}] | {frac:4.0%} Completed | {elapsed:4.1f}s{tail}"


def text_progress(tracker: _Tracker, file: Any = None, interval: float = 0.1) -> None:
    """Draw a text bar on ``file`` (stderr) every ``interval`` s until the futures finish."""
    file = file or sys.stderr
    while True:
        finished = tracker.finished.wait(interval)
        done, total, erred = tracker.totals()
        print(_text_bar(done, total, erred, time.monotonic() - tracker.start), end="",
              file=file, flush=True)
        if finished:
            print(file=file, flush=True)
            return


class ProgressWidget:
    """The Jupyter widget: one bar per task group (``multi``) or one for all."""

    def __init__(self, tracker: _Tracker, multi: bool, complete: bool):
        import ipywidgets

        self.w = ipywidgets
        self.tracker = tracker
        self.multi = multi
        self.complete = complete
        self.bars: dict[str, Any] = {}
        self.labels: dict[str, Any] = {}
        self.rows: dict[str, Any] = {}
        self.box = ipywidgets.VBox([])
        self.elapsed = ipywidgets.HTML()
        self._last = 0.0
        self._lock = threading.Lock()
        self.redraw()

    def _row(self, name: str) -> Any:
        bar = self.bars[name] = self.w.FloatProgress(value=0.0, min=0.0, max=1.0,
                                                     bar_style="info")
        label = self.labels[name] = self.w.HTML()
        return self.w.HBox([self.w.HTML(f"<b>{escape(name)}</b>",
                                        layout=self.w.Layout(width="200px")), bar, label])

    def on_change(self, last: bool) -> None:
        """A future finished: redraw, at most every WIDGET_REDRAW s but for the ``last``."""
        now = time.monotonic()
        if last or now - self._last >= WIDGET_REDRAW:
            self._last = now
            self.redraw()

    def redraw(self) -> None:
        """Set every bar and label from the tracker's counts."""
        t = self.tracker
        with self._lock, t.lock:
            if self.multi:
                groups = [(g, t.done[g], t.total[g], t.erred[g]) for g in t.total]
            else:
                groups = [("total", sum(t.done.values()), sum(t.total.values()),
                           sum(t.erred.values()))]
            shown = []
            for name, done, total, erred in groups:
                if not self.complete and done == total and len(groups) > 1:
                    continue
                if name not in self.rows:
                    self.rows[name] = self._row(name)
                bar = self.bars[name]
                bar.value = done / total if total else 1.0
                bar.bar_style = "danger" if erred else ("success" if done == total else "info")
                self.labels[name].value = f"{done} / {total}" + (f", {erred} erred" if erred
                                                                  else "")
                shown.append(self.rows[name])
            self.elapsed.value = f"{time.monotonic() - t.start:.1f} s"
            self.box.children = [self.elapsed, *shown]

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.box)


def progress(*futures: Any, notebook: bool | None = None, multi: bool = True,
             complete: bool = True, file: Any = None, interval: float = 0.1) -> Any:
    """Show the progress of futures or persisted collections (distributed's signature).

    Blocks in a terminal until all are done; in Jupyter returns a widget at once::

        futures = client.map(slow_inc, range(1000))
        progress(futures)
    """
    flat = futures_of(list(futures))
    if not flat:
        raise ValueError("progress() found no futures in its arguments: pass futures, or "
                         "collections computed on the cluster (client.compute / persist)")
    if notebook is None:
        notebook = _in_notebook()
    if notebook:
        try:
            import ipywidgets  # noqa: F401
        except ImportError:
            notebook = False
    if not notebook:
        text_progress(_Tracker(flat), file=file, interval=interval)
        return None
    holder: list = []
    tracker = _Tracker(flat, on_change=lambda last: holder and holder[0].on_change(last))
    widget = ProgressWidget(tracker, multi, complete)
    holder.append(widget)
    widget.redraw()  # callbacks that ran before the widget existed
    from IPython.display import display

    display(widget.box)
    return widget
