"""The messages' batched operations, written once from their fields."""

import dataclasses

import numpy as np
import torch

from embodied_async.data import PER_STEP, EnvOutput, StepRecord, Trajectory


def step(t: int, batch: int = 4) -> StepRecord:
    rows = torch.arange(batch, dtype=torch.float32)
    return StepRecord(forward_inputs={"states": rows[:, None].repeat(1, 3) + t}, actions=rows[:, None, None] + t,
                      logprobs=-rows - t, values=rows * t, versions=torch.full((batch,), t, dtype=torch.int64),
                      rewards=rows + 10 * t, dones=rows > t, bootstrap_values=torch.zeros(batch),
                      loss_mask=torch.ones(batch, dtype=torch.bool), executed_actions=(rows + t).long() % 3)


def test_a_step_record_holds_exactly_the_per_step_fields():
    per_step = {f.name for f in Trajectory.batched_fields(PER_STEP)}
    assert {f.name for f in dataclasses.fields(StepRecord)} == per_step


def test_stack_split_concat_map_round_trip():
    traj = Trajectory.stack([step(t) for t in range(3)], next_values=torch.arange(4.0), obs_moments={"n": 1})
    assert (traj.num_steps, traj.num_envs) == (3, 4)
    assert traj.forward_inputs["states"].shape == (3, 4, 3) and traj.actions.shape == (3, 4, 1, 1)
    assert traj.versions[:, 0].tolist() == [0, 1, 2]
    shards = traj.split(2)
    assert [s.num_envs for s in shards] == [2, 2] and all(s.obs_moments == {"n": 1} for s in shards)
    assert shards[1].next_values.tolist() == [2.0, 3.0]
    assert shards[1].rewards[:, 0].tolist() == traj.rewards[:, 2].tolist()
    whole = Trajectory.concat(shards)
    for f in Trajectory.batched_fields():
        a, b = getattr(whole, f.name), getattr(traj, f.name)
        for x, y in (zip(a.values(), b.values()) if isinstance(a, dict) else [(a, b)]):
            assert torch.equal(x, y), f.name
    doubled = traj.map(lambda t, env_dim: torch.cat([t, t], dim=env_dim))
    assert doubled.num_envs == 8 and doubled.next_values.shape == (8,) and doubled.obs_moments == {"n": 1}
    # a record that does not say how many actions ran (executed_actions None) stays None throughout
    unsaid = [dataclasses.replace(step(t), executed_actions=None) for t in range(3)]
    traj = Trajectory.stack(unsaid, next_values=torch.arange(4.0))
    assert traj.executed_actions is None and Trajectory.concat(traj.split(2)).executed_actions is None


def test_env_outputs_concat_fills_final_obs_of_unfinished_rows():
    def out(value, final):
        obs = {"states": np.full((2, 1), value, np.float32), "task_descriptions": ["a", "b"]}
        flags = np.array([True, False])
        final_obs = {"states": np.full((2, 1), -value, np.float32), "task_descriptions": ["a", "b"]} if final else None
        return EnvOutput(obs, np.ones(2, np.float32), flags, flags, flags, ~flags, final_obs)

    merged = EnvOutput.concat([out(1.0, final=True), out(2.0, final=False)])
    assert merged.num_envs == 4 and merged.obs["task_descriptions"] == ["a", "b", "a", "b"]
    assert merged.final_obs["states"][:, 0].tolist() == [-1.0, -1.0, 2.0, 2.0]  # unfinished rows repeat obs
    assert merged.dones.tolist() == [True, False, True, False]
