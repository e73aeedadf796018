"""Evaluator (``runner.mode: eval``): a policy with its weights and an env of its share of
``env.num_envs`` in one process, placed as the rollout component (and env, one evaluator each);
scores its share of the episodes as the in-run evaluation does (``evaluation.run_episodes``)."""

from __future__ import annotations

from dataclasses import replace

import torch

from embodied_async.checkpoint_io import CheckpointError
from embodied_async.config.checks import ConfigError
from embodied_async.contracts import EnvSpec
from embodied_async.evaluation import EvalResult, run_episodes
from embodied_async.registry import build_env, build_policy
from embodied_async.run_folder import load_policy_weights
from embodied_async.workers.base import setup_worker_process


class EvalWorker:
    def __init__(self, cfg, topology, rank: int, device_id: int):
        evaluation, num_envs = cfg.evaluation, topology.envs_per_stage  # env.num_envs over the evaluators
        # sub-env i of evaluator r starts from seed + r x num_envs + i: one evaluator with all the
        # sub-envs would start from the same states
        self.seed = evaluation.seed + rank * num_envs
        self.mode = "train" if evaluation.sampled else "eval"
        self.videos = evaluation.videos if rank == 0 else 0
        device = setup_worker_process(topology.device_kind, device_id, cfg.cluster.cpu_threads_per_worker, self.seed)
        try:  # a camera, assets, rendering
            self.env = build_env(replace(cfg.env, render_video=bool(self.videos)), num_envs, self.seed)
        except (ValueError, FileNotFoundError, RuntimeError) as err:
            raise ConfigError(f"cannot build the env: {err}") from None
        try:
            self.policy = self._policy(cfg, device)
        except BaseException:
            self.env.close()
            raise

    def _policy(self, cfg, device):
        try:
            policy = build_policy(cfg.model, self.env.spec, device=device).eval()
        except (ValueError, FileNotFoundError, KeyError) as err:
            raise ConfigError(f"cannot build the policy: {err}") from None
        checkpoint = cfg.evaluation.checkpoint
        if checkpoint is not None:
            try:
                load_policy_weights(policy, checkpoint, "eval")
            except (CheckpointError, KeyError, ValueError) as err:
                raise CheckpointError(f"cannot load {checkpoint}: {err}") from None
        return policy

    def spec(self) -> EnvSpec:
        return self.env.spec

    def evaluate(self, episodes: int) -> EvalResult:
        torch.manual_seed(self.seed)  # the sampled policy's draws repeat with the episodes
        with torch.no_grad():
            return run_episodes(self.policy, self.env, episodes, self.videos, seed=self.seed, mode=self.mode)

    def stop(self) -> None:
        """An evaluation under way finishes (its step is the whole share)."""

    def close(self) -> None:
        self.env.close()
