"""Compare's curves as one chart (lab/views/curve_figures.py): losses and accuracies in panels of their own,
each axis titled, and the export (matplotlib, slide size) the page's figure (plotly): the same panels, titles,
a colour per run and a dash per measure. A loss and an accuracy picked together once shared one unlabelled
axis from 0 to 7 (the accuracy flat at the bottom), and the export gave every line its own colour."""
from __future__ import annotations

import io

import pandas as pd
from matplotlib.colors import to_hex
from PIL import Image

from lab.views.compare_figures import curve_chart, curves_png, page_curves
from lab.views.curve_figures import EXPORT_WIDTH_IN, LINESTYLES, measure_kind
from lab.views.plots import to_png

METRICS = ["held-out loss", "held-out exact-match", "train loss"]


def frame(values: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"x": [0.0, 10.0, 20.0][:len(values)], "value": values})


def two_runs() -> tuple[dict, dict]:
    """Two runs x three metrics, named and styled as lab.views.compare_frames.curve_series names them."""
    series, styles = {}, {}
    for run, scale in (("run a", 1.0), ("run b", 2.0)):
        for i, m in enumerate(METRICS):
            name = f"{run} · {m}"
            series[name] = frame([0.1 * scale, 0.5, 0.9] if "exact" in m else [2.3 * scale, 1.0, 0.2])
            styles[name] = (run, i)
    return series, styles


def test_a_loss_and_an_accuracy_get_panels_of_their_own_each_axis_titled():
    series, styles = two_runs()
    fig = page_curves(series, styles, METRICS, "step")
    layout = fig.layout
    assert layout.yaxis.title.text == "loss" and layout.yaxis2.title.text == "held-out exact-match"
    assert tuple(layout.yaxis2.range) == (-0.02, 1.02) and layout.yaxis.range is None  # accuracy: all of 0 to 1
    assert layout.xaxis2.title.text == "step" and not layout.xaxis.title.text  # one x title, under the last panel
    assert layout.title.text == " / ".join(METRICS)
    on = {t.name: t.yaxis for t in fig.data}
    assert {n for n, y in on.items() if y == "y2"} == {"run a · held-out exact-match", "run b · held-out exact-match"}
    assert all(y == "y" for n, y in on.items() if "loss" in n)
    colours = {t.name: t.line.color for t in fig.data}
    dashes = {t.name: t.line.dash for t in fig.data}
    assert len({colours[n] for n in series if n.startswith("run a")}) == 1  # a colour per run
    assert colours["run a · train loss"] != colours["run b · train loss"]
    assert len({dashes[n] for n in series if n.startswith("run a")}) == 3  # a dash per measure
    assert {dashes[n] for n in series if n.endswith("train loss")} == {"dot"}


def test_one_measure_is_one_panel_titled_by_it():
    series = {"run a": frame([2.0, 1.0, 0.5]), "run b": frame([2.5, 1.5, 0.7])}
    styles = {"run a": ("run a", 0), "run b": ("run b", 0)}
    fig = page_curves(series, styles, ["held-out loss"], "tokens")
    assert fig.layout.yaxis.title.text == "held-out loss" and fig.layout.xaxis.title.text == "tokens"
    assert "yaxis2" not in fig.layout.to_plotly_json() and [t.name for t in fig.data] == ["run a", "run b"]
    assert measure_kind("held-out accuracy (predictable positions)") == "accuracy"
    assert measure_kind("held-out loss (longer lengths)") == "loss"


def test_the_export_is_the_pages_figure_at_slide_size():
    series, styles = two_runs()
    page = page_curves(series, styles, METRICS, "step")
    png = curves_png(series, styles, METRICS, "step")
    axes = png.axes
    assert [ax.get_ylabel() for ax in axes] == [page.layout.yaxis.title.text, page.layout.yaxis2.title.text]
    assert axes[-1].get_xlabel() == "step" and axes[0].get_title(loc="left") == page.layout.title.text
    assert axes[1].get_ylim() == (-0.02, 1.02)
    drawn = {line.get_label(): (to_hex(line.get_color()), line.get_linestyle()) for ax in axes for line in ax.lines}
    assert drawn == {t.name: (t.line.color, LINESTYLES[t.line.dash]) for t in page.data}  # same colours, dashes
    for ax, panel in zip(axes, ("y", "y2")):  # each line in the same panel, with the same points
        for line in ax.lines:
            trace = next(t for t in page.data if t.name == line.get_label())
            assert trace.yaxis == panel and list(line.get_ydata()) == list(trace.y)
    width, height = Image.open(io.BytesIO(to_png(png))).size
    assert width >= 1600 and width == round(EXPORT_WIDTH_IN * 110) and height < width
    assert sorted(t.get_text() for t in png.legends[0].get_texts()) == sorted(series)


def test_a_chart_titled_by_its_caller_and_without_runs():
    chart = curve_chart({}, {}, ["held-out loss"], "step", title="My runs")
    assert chart.title == "My runs" and chart.panels == ()
    fig = page_curves({}, {}, ["held-out loss"], "step")
    assert fig.layout.annotations[0].text == "Pick runs above to draw their curves."
    assert curves_png({}, {}, ["held-out loss"], "step").axes[0].texts[0].get_text() == "No runs to draw."


def test_the_steps_a_sentence_quotes_are_marked_on_every_panel_of_the_page_and_the_export():
    from lab.views.curve_figures import MARK_COLOUR, Mark

    series, styles = two_runs()
    marks = (Mark(10.0, "test accuracy passes 90%: step 10"),)
    fig = page_curves(series, styles, METRICS, "step", marks)
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert sorted(s.yref for s in lines) == ["y domain", "y2 domain"] and all(s.x0 == s.x1 == 10.0 for s in lines)
    assert [a.text for a in fig.layout.annotations if a.x == 10.0] == ["test accuracy passes 90%: step 10"]
    assert not page_curves(series, styles, METRICS, "time (s)", marks).layout.shapes  # steps mark a step axis only
    png = curves_png(series, styles, METRICS, "step", marks=marks)
    for ax in png.axes:
        dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":" and to_hex(ln.get_color()) == MARK_COLOUR]
        assert [tuple(ln.get_xdata()) for ln in dotted] == [(10.0, 10.0)]
    assert "test accuracy passes 90%: step 10" in [t.get_text().strip() for t in png.axes[0].texts]


def test_compare_draws_the_marks_its_note_gives_and_redraws_the_curves_when_they_come(tmp_path):
    from lab.config import RunConfig
    from lab.engine.jobs import JobManager
    from lab.engine.store import RunStore
    from lab.records import EvalRecord, StepRecord
    from lab.views.curve_figures import Mark
    from ui.common import AppContext
    from ui.compare.render import Controls, render

    store = RunStore(tmp_path / "runs")
    ctx = AppContext(store=store, jobs=JobManager(store, max_concurrent=1))
    run_id = store.create(RunConfig())
    for step, loss in ((1, 2.0), (2, 1.0)):
        store.append(run_id, StepRecord(step, loss, 1e-3, 1.0, 64 * step, 0.1 * step, 100.0))
        store.append(run_id, EvalRecord(step=step, elapsed_s=0.1 * step, tokens=64 * step, loss=loss, token_acc=0.5,
                                        exact_match=0.25))
    store.set_status(run_id, "completed", step=2)
    marks: list[Mark] = []
    controls = Controls.of([], [run_id], ["held-out loss"], "step", 0.0, True, True)
    first = render(ctx, controls, {}, lambda ids: ("the preset's sentence", tuple(marks)))
    assert not first["curves"].layout.shapes and first["note"] == "the preset's sentence"
    marks.append(Mark(2, "what the sentence quotes: step 2"))  # the preset's last run finished: its steps come
    second = render(ctx, controls, first["shown"], lambda ids: ("the preset's sentence", tuple(marks)))
    assert [s.x0 for s in second["curves"].layout.shapes] == [2]
    assert "curves" not in render(ctx, controls, second["shown"], lambda ids: ("the preset's sentence", tuple(marks)))
    store.close()
