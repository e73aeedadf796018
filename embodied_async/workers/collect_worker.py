"""Collection worker (``runner.mode: collect``): one env of one sub-env and the source acting in
it (``embodied_async.collection``); runs the episodes the driver numbers and sends them back whole."""

from __future__ import annotations

import time

from embodied_async.collection import Plan, build_source, run_episode
from embodied_async.contracts import EnvSpec
from embodied_async.registry import build_env
from embodied_async.workers.base import setup_worker_process


class CollectWorker:
    def __init__(self, cfg, topology, rank: int, device_id: int, plan: Plan):
        # the same seeds in every worker. An episode still depends a little on those its worker ran
        # before it (the simulator keeps some state across resets: returns differ in the 4th digit),
        # and episode k runs on worker k mod W: a collection repeats for the same --num-workers
        setup_worker_process(topology.device_kind, device_id, cfg.cluster.cpu_threads_per_worker, cfg.collect.seed)
        self.env = build_env(plan.env_cfg, 1, 0)
        try:
            self.act = build_source(plan, self.env)
        except BaseException:
            self.env.close()
            raise

    def spec(self) -> EnvSpec:
        return self.env.spec

    def run_episode(self, number: int, seed: int) -> dict:
        """Episode ``number`` of the collection, from a reset with ``seed``."""
        started = time.monotonic()
        episode = run_episode(self.env, self.act, seed)
        return dict(episode, number=number, seed=seed, seconds=time.monotonic() - started)

    def stop(self) -> None:
        """An episode under way finishes (a collection's step is whole episodes)."""

    def close(self) -> None:
        self.env.close()
