"""A light client for the load test: one page's polls over plain HTTP, as the browser sends them.

gradio_client builds a TLS context and a new httpx client for many calls; on a 2-core machine that
client-side work competes with the server it measures. This client keeps one keep-alive connection
per student and sends what the page sends for an event: an unqueued event (`queue=False`) is one
`POST /gradio_api/run/<api_name>`; a queued one joins the queue and reads its answer from the event
stream (`POST /gradio_api/call/<api_name>`, then `GET /gradio_api/call/<api_name>/<event_id>`, which
goes through the same queue as the browser's join). Each student has its own session hash, so
per-session state (gr.State) works as in a browser tab.
"""
from __future__ import annotations

import http.client
import json
import urllib.parse
import urllib.request
import uuid
from typing import Any

API = "/gradio_api"


def queued_endpoints(url: str) -> dict[str, Any]:
    """api_name -> (whether the event goes through Gradio's queue, the positions of its gr.State inputs),
    from the page's /config. A browser sends a state input as null; the server fills it in."""
    with urllib.request.urlopen(url + "/config", timeout=30) as resp:
        config = json.load(resp)
    default = bool(config.get("enable_queue", True))
    states = {c["id"] for c in config.get("components", []) if c.get("type") == "state"}
    return {d["api_name"]: (default if d.get("queue") is None else bool(d["queue"]),
                            [i for i, c in enumerate(d.get("inputs", [])) if c in states])
            for d in config.get("dependencies", []) if d.get("api_name")}


class LightClient:
    """One browser tab's connection: `call(api_name, *data)` returns the outputs or raises RuntimeError."""

    def __init__(self, url: str, queued: dict[str, Any], timeout: float = 60.0) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.timeout, self.queued = timeout, queued
        self.session = uuid.uuid4().hex[:11]
        self.conn: http.client.HTTPConnection | None = None
        self.bytes_received = 0

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        for attempt in (0, 1):  # a keep-alive connection the server closed is reopened once
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                payload = json.dumps(body).encode() if body is not None else None
                headers = {"Content-Type": "application/json"} if payload is not None else {}
                self.conn.request(method, path, body=payload, headers=headers)
                resp = self.conn.getresponse()
                data = resp.read()
                self.bytes_received += len(data)
                return resp.status, data
            except (http.client.HTTPException, ConnectionError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def call(self, api_name: str, *data: Any) -> list[Any]:
        queued, states = self.queued.get(api_name, (True, []))
        if not queued:
            values = list(data)
            for i in states:  # what a browser sends for a gr.State input: null
                values.insert(i, None)
            body = {"data": values, "session_hash": self.session}
            status, raw = self._request("POST", f"{API}/run/{api_name}", body)
            answer = json.loads(raw or b"{}")
            if status != 200 or "error" in answer:
                raise RuntimeError(" ".join(str(answer.get("error") or f"HTTP {status}").split()))
            return answer["data"]  # every output, a gr.State's as null
        body = {"data": list(data), "session_hash": self.session}
        status, raw = self._request("POST", f"{API}/call/{api_name}", body)
        if status != 200:
            raise RuntimeError(" ".join(f"HTTP {status}: {raw.decode(errors='replace')[:300]}".split()))
        event_id = json.loads(raw)["event_id"]
        status, raw = self._request("GET", f"{API}/call/{api_name}/{event_id}")
        event = None
        for line in raw.decode(errors="replace").splitlines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event in ("complete", "error"):
                payload = json.loads(line.split(":", 1)[1].strip() or "null")
                if event == "error":
                    raise RuntimeError(" ".join(str(payload or "error without a message").split()))
                return payload
        raise RuntimeError(f"no answer in the event stream (HTTP {status}): {raw[-300:]!r}")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
