"""The command line (python -m embodied_async): its commands, the one table that turns errors into
a line and an exit code, and a run started through it (its log folder, the launcher's line)."""

import importlib
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from embodied_async.checkpoint_io import CheckpointError
from embodied_async.cli import COMMANDS, main
from embodied_async.cli.errors import ERROR_KINDS, CommandError, report
from embodied_async.config import ConfigError
from embodied_async.config.recipes import recipe_names
from embodied_async.run_folder import StorageError


def test_without_a_command_it_prints_the_commands_and_an_unknown_one_is_named(capsys):
    assert main([]) == 2
    listed = capsys.readouterr().err
    assert all(f"  {name} " in listed for name in COMMANDS)
    assert main(["--help"]) == 0 and "train" in capsys.readouterr().out
    assert main(["trian"]) == 2
    commands = "train, plan, collect, eval, export, miniature, recipes"
    assert f"no command 'trian'; the commands: {commands}" in capsys.readouterr().err


def test_every_command_names_a_function_that_exists():
    for name, command in COMMANDS.items():
        for target in filter(None, (command.target, command.here)):
            module, _, function = target.partition(":")
            assert callable(getattr(importlib.import_module(module), function)), name


def test_a_command_run_here_hands_back_what_it_made_and_one_that_cannot_is_refused(capsys):
    """A pipeline's phase: the command's exit code and its result (a refusal: the code, no result)."""
    from embodied_async.cli import Outcome, run_here

    refused = run_here(["eval", "no_such_checkpoint_or_model", "--episodes", "1"])
    assert isinstance(refused, Outcome) and refused.code == 2 and refused.result is None
    assert "no_such_checkpoint_or_model" in capsys.readouterr().err
    with pytest.raises(ValueError, match="cannot run as a pipeline's phase"):
        run_here(["recipes"])


def test_every_error_kind_names_a_class_that_exists():
    """A row naming a class that was renamed or moved would never match, and its errors would
    surface as tracebacks."""
    for qualified, _, _ in ERROR_KINDS:
        module, _, name = qualified.rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), name), type), qualified


def test_errors_become_one_line_with_their_kinds_exit_code(capsys):
    assert report(ConfigError("env.num_envs=0: pick at least 1"), "eval") == 2
    assert capsys.readouterr().err == "config error: env.num_envs=0: pick at least 1\n"
    assert report(CommandError("--episodes 3 must be a multiple of --num-envs 2"), "eval") == 2
    assert capsys.readouterr().err.startswith("eval error: --episodes 3")
    assert report(CheckpointError("a file is damaged"), "export") == 2
    assert capsys.readouterr().err.startswith("checkpoint error: a file is damaged")
    assert report(StorageError("no space left"), "train") == 1
    assert report(KeyboardInterrupt(), "export", note="nothing was written to --out") == 130
    err = capsys.readouterr().err
    assert err.endswith("[export] stopped by Ctrl-C; nothing was written to --out\n")


def test_an_error_no_row_names_keeps_its_traceback():
    with pytest.raises(ZeroDivisionError):
        try:
            1 / 0
        except ZeroDivisionError as err:
            report(err, "eval")


def test_recipes_lists_every_recipe_with_its_own_description(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(("env=", "model="))}
    assert set(lines) == set(recipe_names())
    assert "Synchronous PPO baseline: the default recipe with staleness_threshold 0" in lines["maniskill_ppo_mlp"]
    assert "env=<name> picks one of configs/env/: " in out and "maniskill_pushcube" in out
    assert main(["recipes", "extra"]) == 2


def test_plan_prints_a_gpu_recipes_placement_without_a_gpu_and_refuses_a_bad_key(capsys):
    assert main(["plan", "maniskill_async_ppo_openvla"]) == 0
    out = capsys.readouterr().out
    assert "nothing started" in out and "GPU 0: env 0, rollout 0, actor 0" in out
    assert main(["plan", "maniskill_async_ppo_openvla", "env.nmu_envs=3"]) == 2
    assert capsys.readouterr().err.startswith("config error: ")
    assert main(["plan"]) == 2


def test_train_asks_for_a_recipe_and_refuses_one_configs_lacks_before_starting(capsys):
    assert main(["train"]) == 2
    assert main(["train", "runner.max_steps=1"]) == 2
    assert "name the recipe first" in capsys.readouterr().err
    assert main(["train", "maniskill_async_ppo_mpl", "runner.max_steps=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: no recipe 'maniskill_async_ppo_mpl' (configs/maniskill_async_ppo_mpl.yaml); "
                          "the recipes: ") and "maniskill_async_ppo_mlp" in err
    assert main(["train", "maniskill_async_ppo_openpi_tiny"]) == 2
    assert "is now 'maniskill_async_ppo_pi0_tiny'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_started_through_the_command_line_logs_to_a_dated_folder_of_its_recipe(tmp_path):
    """As a user types it, from a folder of their own: the launcher names the folder, the driver
    writes the run's config and metrics there."""
    proc = subprocess.run([sys.executable, "-m", "embodied_async", "train", "maniskill_ppo_mlp", "runner.max_steps=1",
                           "runner.val_check_interval=0", "env.num_envs=4", "rollout.num_steps=8",
                           "actor.global_batch_size=16", "actor.micro_batch_size=8"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    announced = re.search(r"^\[train\] recipe: maniskill_ppo_mlp; logs: (logs/\d{8}-\d{6}-maniskill_ppo_mlp)$",
                          proc.stdout, re.M)
    assert announced, proc.stdout[:2000]
    folder = tmp_path / announced.group(1)
    assert os.path.isfile(folder / "metrics.jsonl") and os.path.isfile(folder / ".hydra" / "config.yaml")
    assert "[train] done: {'step': 1" in proc.stdout
    assert not os.path.exists(os.path.join(REPO_ROOT, announced.group(1)))
