"""How fast a run goes, as the benchmarks measure it: the machine's cores and steal, the raw env
rate of a recipe's env processes (no policy, no messages: the simulation's own cost), and a
training run's steady-state figures from its metrics (env steps/s, each component's busy / waiting
/ idle share, CPU and traffic per env step). ``benchmarks/throughput.py`` and
``benchmarks/async_tradeoff.py`` both read them."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Dict, List, Optional

from embodied_async.workers.base import children_cpu_s


# ---- the machine ---------------------------------------------------------------------------
def cpu_times() -> List[int]:
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


def steal_share(before: List[int], after: List[int]) -> float:
    """Share of the machine's CPU time the hypervisor gave to others (``steal`` in /proc/stat)."""
    delta = [b - a for a, b in zip(before, after)]
    return round(delta[7] / max(1, sum(delta)), 3) if len(delta) > 7 else 0.0


def num_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def compose(config_name: str, overrides: list):
    from embodied_async.config.recipes import resolve_recipe

    return resolve_recipe(config_name, overrides)  # (config, topology)


# ---- the raw env rate --------------------------------------------------------------------------
def _load_policy(cfg, spec, checkpoint: str):
    """The policy a run saved in ``checkpoint`` (its trainable weights and observation statistics)."""
    from embodied_async.registry import build_policy
    from embodied_async.run_folder import load_policy_weights

    policy = build_policy(cfg.model, spec)
    try:
        load_policy_weights(policy, checkpoint)
    except (KeyError, ValueError) as err:
        raise RuntimeError(f"{checkpoint} does not fit this recipe's policy: {err}") from None
    return policy.eval()


def _raw_env_process(config_name, overrides, rank, seconds, queue, checkpoint=None) -> None:
    import numpy as np
    import torch

    import envs  # noqa: F401  (env families register themselves; sets rendering defaults)
    from embodied_async.registry import build_env

    torch.set_num_threads(1)  # as in the env workers
    cfg, topology = compose(config_name, overrides)
    rng = np.random.default_rng(rank)
    built = [build_env(cfg.env, topology.envs_per_stage, 1000 * rank + s) for s in range(topology.stages)]
    outputs = [env.reset() for env in built]
    spec = built[0].spec
    low = np.asarray(spec.action_low or [-1.0] * spec.action_dim, np.float32)
    high = np.asarray(spec.action_high or [1.0] * spec.action_dim, np.float32)
    shape = (topology.envs_per_stage, cfg.env.num_action_chunks, spec.action_dim)
    policy = _load_policy(cfg, spec, checkpoint) if checkpoint else None
    sim_cpu = [0.0]

    def actions_for(out):
        if policy is None:
            return rng.uniform(low, high, size=shape).astype(np.float32)
        # the trained policy's sampled actions, as the rollout draws them (its statistics frozen)
        return policy.predict(out.obs, mode="train").actions.numpy()

    def step_all():
        for stage, env in enumerate(built):
            actions = actions_for(outputs[stage])
            start = time.thread_time()
            outputs[stage] = env.step(actions)
            sim_cpu[0] += time.thread_time() - start

    step_all()  # warm-up
    sim_cpu[0] = 0.0
    # a family whose simulators run in child processes simulates there
    steps, cpu0, children0, wall0 = 0, time.thread_time(), children_cpu_s(), time.perf_counter()
    while time.perf_counter() - wall0 < seconds:
        step_all()
        steps += topology.envs_per_stage * topology.stages * cfg.env.num_action_chunks
    children = children_cpu_s() - children0
    queue.put({"env_steps": steps, "cpu_s": time.thread_time() - cpu0 + children, "sim_cpu_s": sim_cpu[0] + children,
               "wall_s": time.perf_counter() - wall0})
    for env in built:
        env.close()


def measure_raw_env(config_name: str, overrides: list, seconds: float, checkpoint: Optional[str] = None) -> Dict:
    """The env workers' processes stepping at once, as in training, with random actions, or with
    the actions of the policy in ``checkpoint`` (inferred in the same process: no messages). A
    policy that pushes the cube makes contacts and ends episodes early (resets): its simulation
    costs more per step than random flailing."""
    _, topology = compose(config_name, overrides)
    context = mp.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_raw_env_process, args=(config_name, overrides, r, seconds, queue, checkpoint))
             for r in range(topology.num_env_workers)]
    for p in procs:
        p.start()
    parts = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    steps = sum(p["env_steps"] for p in parts)
    wall = max(p["wall_s"] for p in parts)
    out = {"processes": len(parts), "env_steps": steps, "env_steps_per_s": round(steps / wall, 1),
           "sim_cpu_ms_per_env_step": round(1000 * sum(p["sim_cpu_s"] for p in parts) / steps, 3),
           "actions": "policy" if checkpoint else "random"}
    if checkpoint:
        out["inference_cpu_ms_per_env_step"] = round(1000 * sum(p["cpu_s"] - p["sim_cpu_s"] for p in parts) / steps, 3)
    return out


# ---- a run's figures ---------------------------------------------------------------------------
def summarize_run(records: List[Dict], warmup: int, cores: int, workers: Dict[str, int]) -> Dict:
    """Steady-state figures over the records after ``warmup`` updates."""
    if len(records) <= warmup + 1:
        raise RuntimeError(f"only {len(records)} updates: raise --env-steps above the warm-up")
    base, window = records[warmup], records[warmup + 1:]
    steps = sum(r["env/env_steps"] for r in window)
    wall = window[-1]["wall_time_s"] - base["wall_time_s"]
    total = lambda key: sum(r.get(key) or 0.0 for r in window)  # noqa: E731
    per_step_ms = lambda key: round(1000 * total(key) / steps, 3)  # noqa: E731
    out = {"updates": len(window), "env_steps": int(steps), "wall_s": round(wall, 2),
           "env_steps_per_s": round(steps / wall, 1), "cpu_ms_per_env_step": {}, "shares": {},
           "messages_per_env_step": 0.0, "bytes_per_env_step": 0.0}
    # busy: the component's own work; waiting: blocked on a channel (or, for the actor, on data);
    # idle: the rest of its wall time (the actor between updates, messaging outside the sections)
    sections = {"env": ("time/env", "time/env_wait"), "rollout": ("time/rollout", "time/rollout_wait"),
                "actor": ("time/actor_training", "time/actor_data_wait")}
    for name, (busy_key, wait_key) in sections.items():
        busy, waiting = total(busy_key) / wall, total(wait_key) / wall  # time/* are per-worker means
        out["shares"][name] = {"busy": round(busy, 3), "waiting": round(waiting, 3),
                               "idle": round(max(0.0, 1.0 - busy - waiting), 3)}
        out["cpu_ms_per_env_step"][name] = {"work": per_step_ms(f"cpu/{name}_work"),
                                            "process": per_step_ms(f"cpu/{name}_process")}
        out["messages_per_env_step"] += total(f"traffic/{name}_messages") / steps
        out["bytes_per_env_step"] += total(f"traffic/{name}_bytes") / steps
    out["messages_per_env_step"] = round(out["messages_per_env_step"], 3)
    out["bytes_per_env_step"] = round(out["bytes_per_env_step"], 1)
    # weights go through the object store once per rollout rank and update
    out["weight_bytes_per_env_step"] = round(total("train/actor/published_bytes") * workers["rollout"] / steps, 1)
    process_s = sum(total(f"cpu/{name}_process") for name in sections)
    out["our_processes_cpu_share"] = round(process_s / (wall * cores), 3)
    out["collect_s"] = round(wall - total("time/actor_training"), 2)
    out["train_s"] = round(total("time/actor_training"), 2)
    return out
