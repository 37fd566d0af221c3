"""The action box: how Inspect, its interventions panel and its circuits panel answer their controls.

Each of the three has one hidden textbox, its action box, and one server event that draws from it. Every
control that should redraw something writes what it asked into that box, in the browser (a `js` listener,
no server function and no round trip): "<name> <random>", the random number making every write a change,
and for a click on a grid's cell "<name> <random>\\n<row>\\n<column>\\n<row label>". The box's change
event (`draw_from`) runs the panel's one drawing function, with `trigger_mode="always_last"`, which reads
the action (`read`), the controls' values, and which run the panel shows (a gr.State), never the event
data.

Why so: Gradio (6.x, in the browser) runs an `always_last` event that was triggered again while it ran once
more when it ends, but by dispatching the *first* trigger's event again, to every listener of that event,
with that first trigger's event data. Two server listeners on one control (the heatmaps and the positional
panel both on the run picker) re-ran each other for ever, and a re-run answered a stale click. With the
box, each control's event has one listener and it runs in the browser at once, so a burst of changes
(a drag, arrow keys, typing then Tab or Enter, quick clicks) ends in one last draw of what the page holds,
and a run change merged into a later action is still drawn as a run change because the panel compares the
run picked with the run it shows. An idle page writes nothing and so sends nothing.
tests/test_event_wiring.py checks the rule for every event of the app.

The listeners here exist for the page's own wiring: they are private (not in the API's list). The panels'
endpoints for scripts take everything explicitly and are wired beside them.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence, Union

import gradio as gr

from ui.common import PRIVATE


def action_box(elem_id: str) -> gr.Textbox:
    """A panel's hidden action box: what the last click or change asked."""
    return gr.Textbox(visible=False, elem_id=elem_id)


def read(action: Any, names: Iterable[str]) -> tuple[str, list[str]]:
    """The action box's value -> (the action's name, or "" for one not in `names`; the lines after it):
    "cell 0.42\\n1\\n0\\nlayer 1" -> ("cell", ["1", "0", "layer 1"])."""
    lines = str(action or "").split("\n")
    name = lines[0].split(" ")[0]
    return (name if name in names else ""), lines[1:]


def stamp(name: str) -> str:
    """A JavaScript expression: the action `name` with a fresh random number."""
    return f"'{name} ' + Math.random()"


def write_on(box: gr.Textbox, triggers: dict[str, Union[Any, list]], prefix: str) -> None:
    """Each trigger (or list of triggers) writes its action's name into `box`, in the browser; a listener is
    named `<prefix>_<name>`."""
    for name, trigger in triggers.items():
        gr.on(trigger if isinstance(trigger, list) else [trigger], None, None, box, js=f"() => {stamp(name)}",
              api_name=f"{prefix}_{name}", show_progress="hidden", api_visibility=PRIVATE)


def cell_js(grid_id: str, name: str) -> str:
    """The browser function that writes a click (or Enter or Space) on a grid's cell: the grid focuses the
    cell after its select event, so the function waits for that, then reads the cell's row, its column
    counted from the first after the row labels, and its row's label. A click on a row label keeps the box."""
    grid = f"#{grid_id}"
    return f"""async (current) => {{
  await new Promise((done) => setTimeout(done, 0));
  const focused = document.activeElement && document.activeElement.closest('{grid} [data-row][data-col]');
  const cell = focused || document.querySelector('{grid} [data-row][data-col][aria-selected="true"]');
  const col = cell ? Number(cell.dataset.col) - 1 : -1;
  if (col < 0) return current;
  const row = cell.dataset.row;
  const label = document.querySelector('{grid} [data-testid="cell-' + row + '-0"]');
  return {stamp(name)} + '\\n' + row + '\\n' + col + '\\n' + (label ? label.innerText.trim() : '');
}}"""


def write_cell_on(grid: gr.Dataframe, box: gr.Textbox, name: str, api_name: str) -> None:
    """A click on a cell of `grid` (its first column the row labels) writes `name` and the cell into `box`."""
    grid.select(None, box, box, js=cell_js(str(grid.elem_id), name), api_name=api_name, show_progress="hidden",
                api_visibility=PRIVATE)


def draw_from(box: gr.Textbox, fn: Callable, inputs: Sequence, outputs: Any, api_name: str,
              show_progress_on: Sequence) -> Any:
    """The panel's one drawing event: `fn(action, *inputs)` on every change of `box`, the last one when
    several came while it ran. preprocess=False: the panels' own checks name the field of a bad value."""
    return box.change(fn, inputs=[box, *inputs], outputs=outputs, api_name=api_name, trigger_mode="always_last",
                      preprocess=False, show_progress_on=list(show_progress_on), api_visibility=PRIVATE)
