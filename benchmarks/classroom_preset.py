"""A class clicks one preset: N students open the page over --ramp-s seconds and click the same preset button.

    python benchmarks/classroom_load.py --preset induction                 # 30 students, sharing on and off
    python benchmarks/classroom_load.py --preset induction --users 10 --write-results

Each scenario starts `python app.py` with the public defaults (LAB_PUBLIC=1) and a fresh store
(classroom_load.Server). First one student clicks the preset alone on an idle server: the time to answer a
class should be measured against. Then the class: each student clicks the preset's button (what the page
sends: the Presets tab's `preset_<key>` event), then polls as the page's timer does every 2 s (the preset's
line, `preset_poll`, and the cards, `preset_cards_poll`) until the line says every run is done. Time to
answer: from the click to the poll that shows the explanation. Reported per scenario: p50, p95 and max of
it, refusals (a limit named in the answer), students who got no answer before the deadline, the trainings
the server ran (run folders in its store) and the distinct configurations among them. The class runs with
run sharing on (the default: one training per configuration, lab/engine/sharing.py) and, with --before, off
(LAB_SHARE_RUNS=0: every click trains, as the app did before sharing), in the same benchmark run.
"""
from __future__ import annotations

import ast
import json
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from classroom_load import Server, percentile, refusal
from light_client import LightClient, queued_endpoints

POLL_S = 2.0  # the Presets tab's timer (ui/presets.py POLL_S)
TIMEOUT_S = 120.0


def message(exc: RuntimeError) -> str:
    """An error's message as the page shows it (the event stream sends {'error': ..., 'title': ...})."""
    text = str(exc)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return str(value.get("error") or text) if isinstance(value, dict) else text


class Student(threading.Thread):
    """Open the page at `arrive_s`, click the preset, poll until its line says every run is done."""

    def __init__(self, url: str, flags: dict, key: str, arrive_s: float, deadline: float) -> None:
        super().__init__(daemon=True)
        self.url, self.flags, self.key, self.arrive_s, self.deadline = url, flags, key, arrive_s, deadline
        self.owner = uuid.uuid4().hex
        self.answer_s: float | None = None
        self.refused = self.error = ""

    def run(self) -> None:
        time.sleep(self.arrive_s)
        client = LightClient(self.url, self.flags, TIMEOUT_S)
        t0 = time.monotonic()
        try:
            out = client.call(f"preset_{self.key}", [], self.owner, False)
        except RuntimeError as exc:
            text = message(exc)
            if refusal(text) or "queue" in text.lower():
                self.refused = text
            else:
                self.error = text
            return
        last = out[0]
        while time.monotonic() < self.deadline:
            try:
                text, timer = client.call("preset_poll", last)
                client.call("preset_cards_poll", self.owner)  # the page refreshes the cards on the same tick
            except RuntimeError as exc:
                self.error = message(exc)
                return
            if isinstance(timer, dict) and timer.get("active") is False and "runs done" in str(text):
                self.answer_s = time.monotonic() - t0
                return
            time.sleep(POLL_S)


def scenario(users: int, key: str, ramp_s: float, share: bool, limit_s: float) -> dict[str, Any]:
    """One server, `users` students clicking preset `key` over `ramp_s` seconds."""
    with tempfile.TemporaryDirectory(prefix="lab-class-preset-") as tmp:
        server = Server(Path(tmp), {"LAB_SHARE_RUNS": "1" if share else "0"})
        try:
            server.wait_ready()
            flags = queued_endpoints(server.url)
            t0 = time.monotonic()
            crowd = [Student(server.url, flags, key, ramp_s * i / max(users - 1, 1), t0 + limit_s)
                     for i in range(users)]
            for s in crowd:
                s.start()
            for s in crowd:
                s.join(limit_s + 60)
            wall = time.monotonic() - t0
            configs = []
            for folder in server.runs.iterdir():
                if (folder / "config.json").exists():
                    configs.append(json.loads((folder / "config.json").read_text()))
        finally:
            server.stop()
    times = [s.answer_s for s in crowd if s.answer_s is not None]
    return {
        "users": users, "sharing": share, "wall_s": round(wall, 1),
        "answered": len(times), "refused": sum(bool(s.refused) for s in crowd),
        "errors": sum(bool(s.error) for s in crowd),
        "unanswered": sum(s.answer_s is None and not s.refused and not s.error for s in crowd),
        "p50_s": round(statistics.median(times), 1) if times else None,
        "p95_s": round(percentile(times, 0.95), 1) if times else None,
        "max_s": round(max(times), 1) if times else None,
        "trainings": len(configs), "distinct": len({json.dumps(c, sort_keys=True) for c in configs}),
        "refusal_sample": next((s.refused for s in crowd if s.refused), ""),
        "error_sample": next((s.error for s in crowd if s.error), ""),
    }


def preset_class(users: int, key: str, ramp_s: float, before: bool, limit_s: float) -> dict[str, Any]:
    """One student alone, the class with sharing on and, with `before`, off: all in one benchmark run."""
    alone = scenario(1, key, 0.0, True, limit_s)
    after = scenario(users, key, ramp_s, True, limit_s)
    out = {"key": key, "alone": alone, "after": after}
    if before:
        out["before"] = scenario(users, key, ramp_s, False, limit_s)
    return out


def preset_table(r: dict[str, Any]) -> str:
    alone = r["alone"]["p50_s"]
    rows = [("sharing off (before)", r["before"])] if "before" in r else []
    rows += [("sharing on (after)", r["after"]), ("one student alone", r["alone"])]
    lines = ["| scenario | students | answered | refused | no answer in time | time to answer p50 / p95 / max | "
             "p95 / alone | trainings run (distinct configs) |", "|---|---|---|---|---|---|---|---|"]
    for name, s in rows:
        ratio = f"{s['p95_s'] / alone:.2f}x" if s["p95_s"] and alone else "n/a"
        lines.append(f"| {name} | {s['users']} | {s['answered']} | {s['refused']} | {s['unanswered']} | "
                     f"{s['p50_s']} / {s['p95_s']} / {s['max_s']} s | {ratio} | {s['trainings']} ({s['distinct']}) |")
    for name, s in rows:
        if s["refusal_sample"]:
            lines.append(f"\n{name}, a refusal reads: *{s['refusal_sample'][:300]}*")
        if s["error_sample"]:
            lines.append(f"\n{name}, an error: {s['error_sample'][:300]}")
    return "\n".join(lines)
