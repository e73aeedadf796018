"""``runner.mode: collect``: env workers, each with a source acting in its env
(``workers/collect_worker.py``), run numbered episodes; the driver writes them, in number order, to
a LeRobot dataset (``collection.py``: the source, the checks, the writer). A step is one episode per
worker. What the loop gives every mode applies: placement, Ray, Ctrl-C and a scheduler's SIGTERM
(the episodes of the step in flight are kept, the dataset closed whole), progress and metrics."""

from __future__ import annotations

import time
from typing import Dict, List, Optional

from embodied_async.collection import ACTION_KEY, check_plan, first_episode, open_writer
from embodied_async.runner.graph import Graph, Mode, placement_slots
from embodied_async.scheduler.worker_group import Pending, WorkerGroup
from embodied_async.workers.collect_worker import CollectWorker


class CollectMode(Mode):
    name = "collect"
    trains = False

    def build(self) -> Graph:
        cfg, topology = self.cfg, self.topology
        self.plan = check_plan(cfg)  # again here: the command checked it before anything started
        self.next_number = first_episode(cfg.collect.out, cfg.collect.seed)
        self.wanted, self.limit = cfg.collect.episodes, cfg.collect.attempt_limit()
        self.tally = dict(kept=0, attempted=0, successes=0, frames=0)
        self.writer, self.started = None, time.time()
        print(f"[collect] {topology.num_env_workers} worker(s) building the {cfg.env.name} env and the "
              f"{cfg.collect.source} source; episodes from seed {cfg.collect.seed + self.next_number}", flush=True)
        slots = placement_slots(cfg, topology, ("env",))
        env = WorkerGroup("env", CollectWorker, kwargs_for=lambda r: dict(cfg=cfg, topology=topology, rank=r,
                                                                          plan=self.plan),
                          slots=slots.get("env"), topology=topology, backend=cfg.cluster.backend)
        spec = env.call_rank(0, "spec").result()
        self.writer = open_writer(cfg.collect, self.plan, spec)
        self.started = time.time()
        return Graph({"env": env}, None, spec)

    def step(self, graph: Graph) -> List[Pending]:
        """The next episode numbers, one per worker (no more than the attempts left)."""
        count = min(len(graph.env), self.limit - self.tally["attempted"])
        numbers = range(self.next_number, self.next_number + count)
        self.next_number += count
        return [graph.env.call_rank(rank, "run_episode", number, self.cfg.collect.seed + number)
                for rank, number in enumerate(numbers)]

    def take_step(self, results: list) -> Dict[str, float]:
        """Write the step's episodes in number order (the dataset does not depend on the workers'
        timing) until enough are kept; the rest are dropped."""
        tally, steps = self.tally, 0
        for episode in sorted(results, key=lambda e: e["number"]):
            if tally["kept"] >= self.wanted:
                break
            tally["attempted"] += 1
            tally["successes"] += int(episode["success"])
            steps += len(episode["frames"][ACTION_KEY])
            if episode["success"] or self.cfg.collect.keep_failures:
                self.writer.add_episode(episode["frames"], episode["task"], seed=episode["seed"],
                                        source=self.cfg.collect.source, success=episode["success"],
                                        return_=episode["return_"])
                tally["kept"] += 1
                tally["frames"] += len(episode["frames"][ACTION_KEY])
        elapsed = max(time.time() - self.started, 1e-9)
        return {"collect/kept": float(tally["kept"]), "collect/attempted": float(tally["attempted"]),
                "collect/source_success_rate": tally["successes"] / max(tally["attempted"], 1),
                "collect/episodes_per_s": tally["attempted"] / elapsed, "env/env_steps": float(steps)}

    def done(self, step: int) -> bool:
        return self.tally["kept"] >= self.wanted or self.tally["attempted"] >= self.limit

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def summary(self) -> Dict[str, object]:
        episodes, frames = (self.writer.total_episodes, self.writer.total_frames) if self.writer is not None else (0, 0)
        return {**{f"collect/{key}": value for key, value in self.tally.items()}, "collect/wanted": self.wanted,
                "collect/dataset_episodes": episodes, "collect/dataset_frames": frames}

    def version_after_step(self, metrics: Dict[str, float], step: int) -> int:
        return 0

    def progress_line(self, record: Dict[str, float], max_steps: int, last_eval: Optional[float]) -> str:
        attempted = self.tally["attempted"]
        success = f"{self.tally['successes'] / attempted:.0%}" if attempted else "n/a"
        return (f"[collect] {self.tally['kept']}/{self.wanted} episodes kept, {attempted} attempted (source success "
                f"{success}), {record['collect/episodes_per_s']:.2f} episodes/s, {record['wall_time_s']:.0f}s")
