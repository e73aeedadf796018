"""``runner.mode: eval``: evaluators (``workers/eval_worker.py``, one per id of the rollout component,
each a policy and its own env, as the in-run evaluation) score a policy on ``evaluation.episodes``
episodes, split evenly; the one step is every evaluator's share, pooled in evaluator order. The
loop gives it what every mode has: placement, Ray, Ctrl-C, the record in ``metrics.jsonl``."""

from __future__ import annotations

from typing import Dict, List, Optional

from embodied_async.evaluation import EvalResult
from embodied_async.runner.graph import Graph, Mode, placement_slots
from embodied_async.scheduler.worker_group import Pending, WorkerGroup
from embodied_async.workers.eval_worker import EvalWorker


def pooled(results: List[EvalResult]) -> EvalResult:
    """The evaluators' results as one (episodes in evaluator order; the videos are the first's)."""
    total = EvalResult(videos=results[0].videos)
    for result in results:
        total.successes += result.successes
        total.returns += result.returns
        total.lengths += result.lengths
        total.tasks += result.tasks
    return total


class EvalMode(Mode):
    name = "eval"
    trains = False

    def build(self) -> Graph:
        cfg, topology = self.cfg, self.topology
        slots = placement_slots(cfg, topology, ("rollout",))
        evaluators = WorkerGroup("rollout", EvalWorker, kwargs_for=lambda r: dict(cfg=cfg, topology=topology, rank=r),
                                 slots=slots.get("rollout"), topology=topology, backend=cfg.cluster.backend)
        self.result: Optional[EvalResult] = None
        self.spec = evaluators.call_rank(0, "spec").result()
        print(f"[eval] {len(evaluators)} evaluator(s) of {topology.envs_per_stage} sub-envs ready: "
              f"{cfg.evaluation.episodes} episodes", flush=True)
        return Graph({"rollout": evaluators}, None, self.spec)

    def step(self, graph: Graph) -> List[Pending]:
        return graph.rollout.call("evaluate", self.cfg.evaluation.episodes // len(graph.rollout))

    def take_step(self, results: list) -> Dict[str, float]:
        self.result = pooled(results)
        summary = self.result.summary(self.spec.reports_success)
        return {"eval/success_rate": summary["success_rate"], "eval/episode_return": summary["episode_return"],
                "eval/episode_len": summary["episode_length"], "eval/episodes": float(summary["episodes"]),
                "env/env_steps": float(sum(self.result.lengths))}

    def done(self, step: int) -> bool:
        return step >= 1

    def summary(self) -> Dict[str, object]:
        return {"evaluation": self.result, "evaluation/reports_success": self.spec.reports_success}

    def version_after_step(self, metrics: Dict[str, float], step: int) -> int:
        return 0

    def progress_line(self, record: Dict[str, float], max_steps: int, last_eval: Optional[float]) -> str:
        return (f"[eval] {int(record['eval/episodes'])} episodes scored in {record['wall_time_s']:.0f}s, "
                f"mean length {record['eval/episode_len']:.1f} env steps")
