"""A real two-node Ray cluster on this machine for the Ray tests: `ray start --head` and a second node
(`ray start --address=...`) as separate processes, each with one CPU and a small object store, in a temp
folder of their own; stopped at the end by killing exactly the processes of that folder (and their
children), so nothing else on the machine is touched. Ray names a node by the machine's own address, never
the loopback one (its choice: ray-project/ray#26293), so nothing outside this machine is involved either.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import free_port

RAY = [sys.executable, "-m", "ray.scripts.scripts"]
NODE = ["--num-cpus=1", "--object-store-memory=80000000", "--disable-usage-stats"]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def tree(roots: list[int]) -> list[int]:
    """The processes `roots` and all their descendants."""
    kids, out, todo = _children(), [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class Cluster:
    temp: Path  # --temp-dir: every process of this cluster names it (or descends from one that does)
    address: str  # host:port of the head
    head_node: str = ""
    worker_node: str = ""
    raylets: dict[str, int] = field(default_factory=dict)  # node id -> raylet pid

    def _raylets(self) -> dict[str, int]:
        found = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                cmd = _cmdline(int(entry.name))
                if "raylet/raylet" in cmd and str(self.temp) in cmd:
                    node = re.search(r"--node_id=([0-9a-f]+)", cmd)
                    if node:
                        found[node.group(1)] = int(entry.name)
        return found

    def kill_worker_node(self) -> None:
        """SIGKILL the second node's raylet and every process under it (its workers, its agents)."""
        kill(tree([self.raylets[self.worker_node]]))

    def stop(self) -> None:
        mine = [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and str(self.temp) in _cmdline(int(e.name))]
        kill(tree(mine))


def start_cluster() -> Cluster:
    temp = Path(tempfile.mkdtemp(prefix="labray", dir="/tmp"))  # short: Ray's socket paths must stay short
    port = free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", HOME=str(temp))  # no ~/.ray/auth_token of an earlier cluster
    cluster = Cluster(temp, f"127.0.0.1:{port}")
    try:
        subprocess.run(RAY + ["start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", f"--temp-dir={temp}",
                              "--include-dashboard=false", *NODE], check=True, env=env, capture_output=True, timeout=120)
        cluster.head_node = next(iter(cluster._raylets()))
        subprocess.run(RAY + ["start", f"--address={cluster.address}", *NODE], check=True, env=env,
                       capture_output=True, timeout=120)
        deadline = time.monotonic() + 60
        while len(cluster._raylets()) < 2:
            assert time.monotonic() < deadline, "the second Ray node did not start"
            time.sleep(0.5)
        cluster.raylets = cluster._raylets()
        cluster.worker_node = next(n for n in cluster.raylets if n != cluster.head_node)
        return cluster
    except BaseException:
        cluster.stop()
        raise
