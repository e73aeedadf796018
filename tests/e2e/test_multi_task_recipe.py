"""A recipe on two Meta-World tasks at once (env.tasks): it trains, and its evaluation reports
each task's success beside the overall rate."""

import pytest
from conftest import assert_logs_every_recipe_metric, run_recipe

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess


@pytest.mark.slow
def test_the_two_task_recipe_trains_and_its_evaluation_scores_each_task(tmp_path):
    _, records = run_recipe("metaworld_mt2_async_ppo_mlp", tmp_path / "run", "runner.max_steps=2",
                            "runner.val_check_interval=2", "runner.eval_episodes=8", "env.max_episode_steps=20")
    last = records[-1]
    assert_logs_every_recipe_metric(last)
    rates = [last[f"eval/success_rate/{task}"] for task in ("reach-v3", "drawer-close-v3")]
    assert all(0.0 <= rate <= 1.0 for rate in rates)
    # the evaluation's 8 sub-envs hold 4 episodes of each task: the overall rate is their mean
    assert last["eval/success_rate"] == pytest.approx(sum(rates) / 2)
