"""Shared runs: a configuration asked for again is the run already trained, training or queued.

Thirty students who click one preset ask for one configuration, seed and code: one result
(lab/engine/identity.py). The job manager (lab/engine/jobs.py `claim_many`) looks each config's identity up
here and attaches the asker to the run that answers it instead of training a copy; only configurations no
run answers are trained. What a run answers:
  - a run this manager has queued or is training (not a continuation: it changes the run), or
  - a completed run in the store whose status records this identity, whose config still has it (a
    continued run's config was rewritten) and whose weights are there: trained by this server, restored
    from its backup, or loaded from a lesson bundle (lab/engine/bundle.py) built with the same code.
A run that failed, was stopped or was interrupted answers nothing, nor does one from another code version.

Who holds a run: its first starter and everyone attached to it (`holders.json` in its folder, written only
by the app's job manager under its lock). On a shared server (LAB_PUBLIC) a holder's Stop or Delete detaches
that holder only while others hold the run; the run is stopped or deleted when its last holder asks. A run
no student started (owner "": a lesson bundle's, or one trained from the command line) stays for everyone.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from lab.config import ConfigError, RunConfig
from lab.engine.identity import code_version, identity, seeded
from lab.engine.store import RunStore
from lab.engine.storefs import DamagedRunError, RunNotFoundError

HOLDERS = "holders.json"


@dataclass(frozen=True)
class Claim:
    """A request's answer for one config: the run that answers it, and whether the asker was attached to a
    run that existed before (then `state`, `trained_at`, `device` and `code_version` describe that run)."""

    run_id: str
    attached: bool
    state: str = "queued"
    trained_at: str = ""  # ISO time the run was created (queued) on this server or in its bundle
    device: str = ""  # where it trained ("cpu", "cuda:0"); "" while it has not finished
    code_version: str = ""
    bundle: str = ""  # the lesson bundle it came from (lab/engine/bundle.py), if any

    @property
    def same_result(self) -> bool:
        """Whether training this config again here would give the same weights bit for bit: it trained (or
        trains) on this server's CPU path with this code. A GPU run is the same configuration, not
        necessarily the same numbers."""
        return self.code_version == code_version() and (self.device in ("", "cpu"))


class SharedRuns:
    """The identity -> run index and the holders of each run, for one job manager (call under its lock)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._index: Optional[dict[str, str]] = None  # read from the store on first use

    # ---- the index ------------------------------------------------------------------------------------
    def _loaded(self) -> dict[str, str]:
        if self._index is None:
            self._index = {}
            found: list[tuple[str, str, str]] = []
            for run_id in self.store.run_ids():
                status = self._completed(run_id)
                if status is not None:
                    found.append((str(status.get("created_at") or ""), run_id, str(status["identity"])))
            for _, run_id, ident in sorted(found):  # the newest run of an identity answers it
                self._index[ident] = run_id
        return self._index

    def _completed(self, run_id: str, states: tuple[str, ...] = ("completed",)) -> Optional[dict]:
        """The run's status if it is in one of `states`, of this code, and its config still has its identity
        (a completed run: with its weights)."""
        try:
            status = self.store.status(run_id)  # a live state whose writer died reads interrupted
            if (status.get("state") not in states or status.get("code_version") != code_version()
                    or not status.get("identity") or status.get("continue_steps")
                    or status["state"] == "completed" and not (self.store.path(run_id) / "weights.safetensors").exists()):
                return None
            if identity(self.store.config(run_id)) != status["identity"]:
                return None  # continued to more steps: no longer what its first config asked for
            return status
        except (RunNotFoundError, DamagedRunError, OSError, ConfigError):
            return None

    def find(self, ident: str, live: set[str]) -> Optional[str]:
        """The run that answers `ident`: one of `live` (this manager's queued or running new runs), a run
        training outside its queue (in GPU chunks: ui/gpu.py), or a completed run of the store; a run that no
        longer answers it is dropped from the index."""
        index = self._loaded()
        run_id = index.get(ident)
        if run_id is None:
            return None
        if run_id in live or self._completed(run_id, ("completed", "queued", "running")) is not None:
            return run_id
        del index[ident]
        return None

    def add(self, ident: str, run_id: str) -> None:
        self._loaded()[ident] = run_id

    def drop(self, run_id: str) -> None:
        """The run answers no identity any more (it failed, stopped, is continued or deleted)."""
        index = self._loaded()
        for ident in [i for i, r in index.items() if r == run_id]:
            del index[ident]

    # ---- holders --------------------------------------------------------------------------------------
    def holders(self, run_id: str) -> list[str]:
        return self.store.holders(run_id)

    def hold(self, run_id: str, owner: str) -> None:
        holders = self.holders(run_id)
        if owner not in holders:
            self.store.write_json(run_id, HOLDERS, holders + [owner])

    def release(self, run_id: str, owner: str) -> list[str]:
        """Detach `owner`; returns who still holds the run."""
        left = [h for h in self.holders(run_id) if h != owner]
        self.store.write_json(run_id, HOLDERS, left)
        return left


def describe_claim(claim: Claim, now_date: str = "") -> str:
    """The sentence a page shows for an attached run: when (UTC; the day too when it is not `now_date`, default
    today) and where it was trained, and what that means."""
    when = claim.trained_at[11:16] if len(claim.trained_at) >= 16 else ""
    day, now_date = claim.trained_at[:10], now_date or time.strftime("%Y-%m-%d", time.gmtime())
    at = f" at {when} UTC" + (f" on {day}" if day and day != now_date else "") if when else ""
    if claim.state in ("queued", "running"):
        what = f"is {'training' if claim.state == 'running' else 'queued'} on this server (started{at})"
    elif claim.bundle:
        what = f"was trained for this lesson{at} (the lesson bundle {claim.bundle})"
    else:
        what = f"was trained on this server{at}"
    if claim.same_result:
        return (f"This configuration {what}: same configuration, same seed, so the same result. You are watching "
                "that run; nothing is trained twice.")
    return (f"This configuration {what} on a GPU ({claim.device}): the same configuration and seed, though a GPU "
            "does not give the same numbers bit for bit.")



def class_runs(store: RunStore, cfgs: list[RunConfig]) -> list[str]:
    """The class's runs of these configurations: every run started with "my own seed" (status seed_from
    "class") whose config is one of `cfgs` but for the seed, and that has not failed; oldest first. Compare
    draws each configuration's as one band (the class's band)."""
    wanted = {seeded(c, 0) for c in cfgs}
    found = []
    for run_id in store.run_ids():
        try:
            status = store.status(run_id)
            if status.get("seed_from") != "class" or status.get("state") in ("failed", "interrupted"):
                continue
            if seeded(store.config(run_id), 0) in wanted:
                found.append((str(status.get("created_at") or ""), run_id))
        except (RunNotFoundError, DamagedRunError, OSError):
            continue
    return [run_id for _, run_id in sorted(found)]


def provenance(status: dict) -> str:
    """Where a stored run came from, when that is not this server's code: a lesson bundle
    (lab/engine/bundle.py), another version of the lab. "" for a run this code trained here."""
    bundle, version = status.get("bundle"), status.get("code_version")
    other = isinstance(version, str) and version and version != code_version()
    if not bundle and not other:
        return ""
    text = f"From the lesson bundle {bundle}" if bundle else "Trained"
    if other:
        text += f"{',' if bundle else ''} trained by another version of the lab ({version}; this server runs " \
                f"{code_version()})"
    return text + "."
