"""Compare's "Publish to a class board": the runs picked in Compare (a selection, a whole grid) go to a
Trackio project (lab/engine/trackio_board.py does the work, as `python -m lab publish` does): locally, or to the Hugging
Face Space named by LAB_TRACKIO_SPACE with the server's token, so students need no account.

Shown where Trackio is installed (requirements-scale.txt) and the server is not public: on a class
server (LAB_PUBLIC) any student could otherwise fill the teacher's board; there the teacher publishes with
the command line. What the board shows and what stays in this app: docs/class-board.md.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Optional

import gradio as gr

from lab.config import ConfigError
from lab.engine.trackio_board import SPACE_ENV, PublishReport, check_project, publish_runs
from ui.common import AppContext, errors_as_messages

DEFAULT_PROJECT = "class-board"


def publish_available(ctx: AppContext) -> bool:
    """Trackio installed, and a server whose limits are known and not public."""
    return (ctx.jobs is not None and not ctx.jobs.limits.public
            and importlib.util.find_spec("trackio") is not None)


def where(space: Optional[str]) -> str:
    return f"the Space **{space}**" if space else "the local Trackio board"


def report_text(report: PublishReport) -> str:
    """What happened, in a few lines: how many runs went, where, how to open the board, and each skip's reason."""
    lines = [f"Published **{len(report.published)}** run(s) to project **{report.project}** on "
             f"{where(report.space_id)}" + (f"; {len(report.already)} already there" if report.already else "") + "."]
    if not report.space_id and (report.published or report.already):
        lines.append(f"Open it with `trackio show --project {report.project}`.")
    lines += [f"- skipped {run_id}: {why}" for run_id, why in report.skipped]
    return "\n\n".join(lines[:2]) + ("\n\n" + "\n".join(lines[2:]) if lines[2:] else "")


def publish_selection(ctx: AppContext, run_ids: Any, project: Any) -> str:
    run_ids = [r for r in run_ids or [] if isinstance(r, str)]
    if not run_ids:
        raise gr.Error("Runs to compare: pick the runs to publish first.", print_exception=False)
    for run_id in run_ids:
        ctx.store.path(run_id)  # RunIdError for anything that is not a run id
    project = str(project or "").strip()
    try:
        check_project(project)
    except ConfigError as exc:
        raise ConfigError("Board project", str(exc).split(": ", 1)[1]) from None
    return report_text(publish_runs(ctx.store, run_ids, project))


def build_publish_panel(ctx: AppContext, pick: gr.Dropdown) -> None:
    """The accordion under Compare's selection (nothing where publishing is not offered)."""
    if not publish_available(ctx):
        return
    space = os.environ.get(SPACE_ENV) or None
    with gr.Accordion("Publish to a class board (Trackio)", open=False, elem_id="compare-publish"):
        gr.Markdown(f"Sends the runs picked above to {where(space)}: each with its configuration, every metric "
                    "point, and a grid's axes as its group, so a class's runs can be shown together next week. "
                    "Runs still training are skipped; publishing again sends nothing twice to a local board. "
                    "Attention maps and interventions stay in this app.")
        with gr.Row():
            project = gr.Textbox(DEFAULT_PROJECT, label="Board project", max_lines=1, scale=3,
                                 info="Letters, digits, '-' and '_'; one project per class or topic.")
            button = gr.Button("Publish the selection", scale=1, elem_id="compare-publish-btn")
        said = gr.Markdown(elem_id="compare-publish-report")
    button.click(errors_as_messages(lambda runs, name: publish_selection(ctx, runs, name)), inputs=[pick, project],
                 outputs=said, api_name="publish")
