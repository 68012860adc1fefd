"""The workers as Ray actors, placed across a Ray cluster (`bench --workers N --ray auto|ADDRESS`).

Ray does the placing and the processes: each worker is an actor (one CPU each, spread over the cluster's nodes)
whose one method runs the ordinary worker (worker.py), which connects back to the coordinator over TCP, so
requests, records and clock pings take the same path as with local worker processes. servelab (with this extra,
`pip install 'servelab[ray]'`) must be installed on every node, in the same Python version.

    ray start --head --port 6379                      # on the first host (the coordinator's, usually)
    ray start --address HEAD_IP:6379                  # on every other host
    servelab bench URL --mode concurrency --concurrency 2048 --workers 16 --ray auto   # on a host of the cluster

`--ray auto` joins the cluster `ray start` made on this host; an address joins that one. When a Ray runtime is
already initialised in this process (a test's `ray.init(num_cpus=4)`), it is used as is.
"""

from __future__ import annotations

import time
from typing import Any

from servelab.ray_support import first_line, import_ray, join


class _WorkerActor:
    def run(self, host: str, port: int, worker_id: int, token: str) -> int:
        import ray

        from servelab.bench.workers.worker import run

        context = ray.get_runtime_context()
        return run(host, port, worker_id, token, about={"node": context.get_node_id()})


class RayActors:
    name = "ray"

    def __init__(self, address: str = "auto"):
        self.address = address
        self.ray = import_ray("--ray", hint="pip install 'servelab[ray]'")
        self.listen_host = "127.0.0.1"
        self.actors: dict[int, Any] = {}
        self.refs: dict[int, Any] = {}
        self._started_ray = False

    def prepare(self) -> None:
        """Join the cluster (unless this process already has), and listen where its nodes can reach us."""
        ray = self.ray
        if not ray.is_initialized():
            join(ray, self.address, "the workers", "start one with `ray start --head` (README: scaling out)",
                 include_dashboard=False)
            self._started_ray = True
        self.listen_host = ray.util.get_node_ip_address()

    def cluster_workers(self) -> int:
        """--workers auto under Ray: one per CPU the cluster has, but one (the coordinator's)."""
        cpus = int(self.ray.cluster_resources().get("CPU", 1))
        return max(1, cpus - 1)

    def start(self, count: int, host: str, port: int, token: str) -> None:
        actor = self.ray.remote(num_cpus=1)(_WorkerActor)
        for i in range(count):
            self.actors[i] = actor.options(scheduling_strategy="SPREAD").remote()
            self.refs[i] = self.actors[i].run.remote(host, port, i, token)

    def _ended(self, worker_id: int, timeout_s: float) -> str | None:
        ref = self.refs.get(worker_id)
        if ref is None:
            return None
        ready, _ = self.ray.wait([ref], timeout=timeout_s)
        if not ready:
            return None
        try:
            self.ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - the actor's death, as Ray tells it
            return f"Ray: {first_line(exc)}"[:300]
        return "the actor returned"

    def failed(self) -> str | None:
        for i in self.refs:
            why = self._ended(i, 0)
            if why:
                return f"worker {i}: {why}"
        return None

    def exit_status(self, worker_id: int) -> str | None:
        return self._ended(worker_id, 0.5)

    def pids(self) -> list[int]:
        return []

    def stop(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        if self.refs:
            self.ray.wait(list(self.refs.values()), num_returns=len(self.refs),
                          timeout=max(deadline - time.monotonic(), 0.1))
        for a in self.actors.values():
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors.clear()
        if self._started_ray:
            self.ray.shutdown()
            self._started_ray = False
