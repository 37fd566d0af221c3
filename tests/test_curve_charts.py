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
