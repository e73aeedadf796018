"""The deterministic graph that the default recipe's guard compares two codes on
(``benchmarks/default_recipe.py``, its same-learning check): one env process, synchronous
updates and paused evaluations repeat a run's learning to the last bit, through Ray."""

import default_recipe as guard
import pytest
from conftest import run_recipe

pytestmark = pytest.mark.slow  # two runs of the default recipe in subprocesses


def test_the_deterministic_graph_repeats_every_learning_figure(tmp_path):
    overrides = [o for o in guard.DETERMINISTIC if not o.startswith("runner.val_check_interval")]
    overrides += ["runner.seed=3", "runner.max_steps=3", "runner.val_check_interval=2", "runner.eval_episodes=8",
                  "runner.logger.backends=[]"]
    _, first = run_recipe(guard.RECIPE, tmp_path / "first", *overrides)
    _, second = run_recipe(guard.RECIPE, tmp_path / "second", *overrides)
    assert [r["step"] for r in first] == [1, 2, 3]
    assert "eval/success_rate" in first[1]  # the paused evaluation is part of what repeats
    assert guard.first_difference(first, second) is None
    # what is compared holds the learning itself (losses, KL, returns), not only its bookkeeping
    figures = guard.learning_figures(first)[0]
    assert {"train/actor/policy_loss", "train/actor/proximal_approx_kl", "train/critic/value_loss",
            "env/episode_return"} <= set(figures)
