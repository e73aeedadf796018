"""Invalid configuration fails at start-up, naming the key path and the fix."""

import os
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT, build_config

from embodied_async.checkpoint_io import write_manifest
from embodied_async.config import ConfigError, check
from embodied_async.config.validate import to_train_config

ENTRY = os.path.join(REPO_ROOT, "examples", "embodiment", "train_async.py")


def test_small_config_is_valid(tmp_path):
    cfg = build_config(tmp_path)
    assert cfg.env.num_envs == 4 and cfg.cluster.component_placement["actor"] == "3"


CHECKPOINT_HINT = "logs/<run>/checkpoints/global_step_<N>"

# (overrides on SMALL, the key path the message must name, the fix it must give). SMALL: env on
# slots 0-1, rollout on 2, actor on 3; 4 envs x 8 steps; actor.global_batch_size 16, micro 8.
# "{tmp}" is replaced by an existing empty folder.
BAD = [
    # unknown keys, names and types
    ("nonsense.key=1", "unknown config key 'nonsense.key'", "Fix the spelling or remove it"),
    ("env.nmu_envs=3", "unknown config key 'env.nmu_envs'", "Valid keys under 'env' (ManiSkillConfig): name, num_envs"),
    ("model.hiden_sizes=[8]", "unknown config key 'model.hiden_sizes'", "Valid keys under 'model' (MLPConfig): name"),
    ("env.num_envs=many", "env.num_envs",
     "Give a value of the type declared in envs.maniskill.configuration_maniskill"),
    ("env.name=doesnotexist", "env.name='doesnotexist' is not a registered env family", "registered: "),
    ("model.name=transformer9000", "model.name='transformer9000'", "registered: cnn, mlp, openvla"),
    ("model.activation=sigmoid", "model.activation='sigmoid'", "use one of: tanh, relu, gelu"),
    ("env.sim_backend=quantum", "env.sim_backend='quantum'", "use one of: cpu, gpu"),
    ("env.obs_mode=depth", "env.obs_mode='depth'", "use one of: state, rgb"),
    ("env.task=PushCub-v1", "env.task", "PushCube-v1"),  # close matches from ManiSkill's registry
    # model
    (("model.name=openvla", "model.path=/no/such/openvla"), "model.path='/no/such/openvla'",
     "model.tiny_random_init=true"),
    (("model.name=openvla", "model.path=./no_such_checkpoint"), "model.path='./no_such_checkpoint'",
     "give a repo id such as"),
    (("model.name=openvla", "model.path=a/b/c"), "model.path='a/b/c'",
     "neither an existing folder nor a Hugging Face repo id"),
    ("model.path=some/model", "model.path='some/model' is not a folder with a config.json",
     "scripts/export.py wrote"),  # an mlp's model.path is an exported policy
    (("model.name=openvla", "model.path=openvla/openvla-7b", "model.temperature=0"), "model.temperature=0.0",
     "use 1.0"),
    (("model.name=openvla", "model.path=openvla/openvla-7b", "model.top_k=0"), "model.top_k=0",
     "use e.g. 50 (or null to sample from all action tokens)"),
    (("model.name=openvla", "model.path=openvla/openvla-7b", "model.lora.enabled=true", "model.lora.rank=0"),
     "model.lora.rank=0", "use e.g. 32"),
    ("model.name=openvla", "model.path is not set", "'openvla/openvla-7b'"),
    # placement and backend
    ("cluster.device_type=gpu", "cluster.device_type=gpu", "cluster.device_type=auto"),
    ("cluster.component_placement.env=3-1", "cluster.component_placement['env']", "valid examples"),
    ("cluster.component_placement.critic=0", "cluster.component_placement key 'critic'",
     "allowed components: env, rollout, actor"),
    (("cluster.backend=local", "cluster.component_placement.actor=2-3"), "cluster.component_placement",
     "place actor on a single id (e.g. 'actor': '0'), or use cluster.backend=ray"),
    ("cluster.component_placement.rollout=2-4", "cluster.component_placement", "place a multiple of the rollout count"),
    ("cluster.cpu_threads_per_worker=0", "cluster.cpu_threads_per_worker=0", "set it to 1 or more"),
    # batch shapes
    ("env.num_envs=5", "env.num_envs=5 must divide evenly over 2 env processes", "use a multiple of 2"),
    ("actor.global_batch_size=10", "actor.global_batch_size=10", "pick a divisor of 32"),
    (("algorithm.rollout_store_size_per_rank=3", "actor.global_batch_size=64"),
     "algorithm.rollout_store_size_per_rank x env.num_envs x rollout.num_steps = 3 x 4 x 8 = 96",
     "pick a divisor of 96 for actor.global_batch_size"),
    ("actor.micro_batch_size=5", "actor.micro_batch_size=5", "use a divisor of 16"),
    ("runner.eval_episodes=3", "runner.eval_episodes=3 must be a multiple of runner.eval_num_envs=2",
     "round it to a multiple"),
    # algorithm
    ("algorithm.rollout_store_size_per_rank=0", "algorithm.rollout_store_size_per_rank=0", "set it to 1 or more"),
    ("algorithm.on_policy_min_ratio=1.5", "algorithm.on_policy_min_ratio=1.5", "use 0 to accept any version-valid mix"),
    ("algorithm.on_policy_min_ratio=-0.1", "algorithm.on_policy_min_ratio=-0.1", "1 for all fresh"),
    ("algorithm.behave_weight_threshold=1.0", "algorithm.behave_weight_threshold=1.0", "use e.g. 2.0 (or null"),
    ("algorithm.behave_weight_threshold=0.5", "algorithm.behave_weight_threshold=0.5", "masks (nearly) every sample"),
    ("algorithm.target_kl=0", "algorithm.target_kl=0.0", "use e.g. 0.1 (or null to disable it)"),
    ("algorithm.value_clip=-0.2", "algorithm.value_clip=-0.2", "use e.g. 0.2 (or null to disable it)"),
    ("algorithm.staleness_threshold=-1", "algorithm.staleness_threshold=-1", "use 0 for synchronous PPO"),
    ("algorithm.staleness_control=adaptive", "algorithm.staleness_control='adaptive' is not allowed",
     "use one of: fixed, kl"),
    (("algorithm.staleness_control=kl", "algorithm.staleness_max=-1"),
     "algorithm.staleness_max=-1 must be >= algorithm.staleness_min (0)", "the trajectory queues are sized for it"),
    ("algorithm.staleness_max=3", "algorithm.staleness_max=3 does nothing under algorithm.staleness_control=fixed",
     "set algorithm.staleness_control=kl"),
    (("algorithm.staleness_control=kl", "algorithm.staleness_min=-1"), "algorithm.staleness_min=-1",
     "0 allows synchronous updates"),
    (("algorithm.staleness_control=kl", "algorithm.staleness_kl_low=-0.1"), "algorithm.staleness_kl_low=-0.1",
     "e.g. 0.01"),
    (("algorithm.staleness_control=kl", "algorithm.staleness_kl_high=0.01"), "algorithm.staleness_kl_high=0.01",
     "the band between them holds the bound"),
    (("algorithm.staleness_control=kl", "algorithm.staleness_kl_patience=0"), "algorithm.staleness_kl_patience=0",
     "before the bound moves"),
    ("algorithm.batch_from=fastest", "algorithm.batch_from='fastest' is not allowed",
     "use one of: every_stream, first_arrived"),
    ("algorithm.update_epochs=0", "algorithm.update_epochs=0", "set it to 1 or more"),
    (("env.slow_workers=[2]", "env.slow_worker_delay_s=0.1"), "env.slow_workers=[2]: no env worker 2",
     "this placement has 2: ranks 0-1"),
    ("env.slow_workers=[1]", "env.slow_worker_delay_s=0.0: set both", "or neither"),
    (("env.slow_workers=[1]", "env.slow_worker_delay_s=-1"), "env.slow_worker_delay_s=-1",
     "the seconds each step of the env workers in env.slow_workers takes longer"),
    ("algorithm.gamma=0", "algorithm.gamma=0.0", "use e.g. 0.8-0.99"),
    ("algorithm.gamma=1.5", "algorithm.gamma=1.5", "it is the discount factor"),
    ("algorithm.gae_lambda=1.2", "algorithm.gae_lambda=1.2", "use e.g. 0.9-0.95"),
    ("algorithm.clip_ratio_low=0", "algorithm.clip_ratio_low=0.0", "use e.g. 0.2"),
    ("algorithm.clip_ratio_low=1.0", "algorithm.clip_ratio_low=1.0 must be < 1", "must stay positive"),
    ("algorithm.clip_ratio_high=-0.1", "algorithm.clip_ratio_high=-0.1", "use e.g. 0.2"),
    ("algorithm.clip_ratio_c=0.5", "algorithm.clip_ratio_c=0.5", "use e.g. 3.0"),
    ("algorithm.logprob_type=sequence", "algorithm.logprob_type='sequence' is not allowed",
     "use one of: chunk_level, token_level"),
    ("algorithm.logprob_type=token_level", "algorithm.logprob_type=token_level: the 'mlp' policy family reports "
     "chunk_level log-probs only", "use algorithm.logprob_type=chunk_level"),
    ("algorithm.huber_delta=0", "algorithm.huber_delta=0.0", "use e.g. 10.0"),
    ("algorithm.entropy_coef=-0.01", "algorithm.entropy_coef=-0.01", "use 0 to turn the term off"),
    # optimiser
    ("actor.lr=0", "actor.lr=0.0", "use e.g. 3e-4"),
    ("actor.value_lr=-1e-3", "actor.value_lr=-0.001", "use e.g. 3e-3 (or null to use actor.lr)"),
    ("actor.max_grad_norm=0", "actor.max_grad_norm=0.0", "use e.g. 0.5"),
    # env
    ("env.max_abs_value=0", "env.max_abs_value=0.0", "use e.g. 1e6"),
    ("env.image_size=[128]", "env.image_size=[128]", "use e.g. [128, 128]"),
    ("env.image_size=[0,128]", "env.image_size=[0, 128]", "two positive integers"),
    ("env.max_episode_steps=-1", "env.max_episode_steps=-1", "use 0 for the task's own limit"),
    # runner
    ("runner.val_check_interval=-1", "runner.val_check_interval=-1", "use 0 to turn it off"),
    ("runner.save_interval=-5", "runner.save_interval=-5", "use 0 to turn it off"),
    ("runner.max_env_steps=0", "runner.max_env_steps=0", "(or null to stop at runner.max_steps only)"),
    ("runner.eval_stop_once_below_target=true", "runner.eval_stop_once_below_target=true needs a target",
     "set runner.stop_at_eval_success"),
    ("runner.resume_dir=/no/such/folder", "runner.resume_dir='/no/such/folder' is not a folder", CHECKPOINT_HINT),
    ("runner.resume_dir={tmp}", "is a folder but not a checkpoint (it holds no runner.json and manifest.json)",
     CHECKPOINT_HINT),
    # evaluation videos
    (("runner.eval_video=true", "env.sim_backend=gpu"), "runner.eval_video=true needs env.sim_backend=cpu",
     "set runner.eval_video=false or env.sim_backend=cpu"),
    (("runner.eval_video=true", "runner.eval_video_episodes=0"), "runner.eval_video_episodes=0", "set it to 1 or more"),
    ("env.video_size=[256]", "env.video_size=[256]", "use e.g. [256, 256]"),
]


def _overrides(overrides, tmp_path):
    overrides = (overrides,) if isinstance(overrides, str) else overrides
    return [o.replace("{tmp}", str(tmp_path)) for o in overrides]


def _case_id(case):
    overrides = (case[0],) if isinstance(case[0], str) else case[0]
    return "+".join(overrides)


@pytest.mark.parametrize("overrides, key, fix", BAD, ids=[_case_id(c) for c in BAD])
def test_bad_values_name_the_key_and_the_fix(tmp_path, overrides, key, fix):
    with pytest.raises(ConfigError) as err:
        build_config(tmp_path, *_overrides(overrides, tmp_path))
    message = str(err.value)
    assert key in message, message
    assert fix in message, message


def test_the_battery_is_broad():
    assert len(BAD) >= 25


@pytest.mark.parametrize("overrides", [
    # fresh-data ratio with synchronous PPO: every trajectory is fresh anyway
    ("algorithm.on_policy_min_ratio=0.5", "algorithm.staleness_threshold=0"),
    ("algorithm.on_policy_min_ratio=1.0", "algorithm.rollout_store_size_per_rank=3"),
    # the store multiplies the update batch: 2 x 4 x 8 = 64 fits a batch of 64 (32 alone would not)
    ("algorithm.rollout_store_size_per_rank=2", "actor.global_batch_size=64", "actor.micro_batch_size=16"),
    # None turns these off
    ("algorithm.behave_weight_threshold=null", "algorithm.target_kl=null", "algorithm.value_clip=null"),
    ("algorithm.behave_weight_threshold=1.5", "algorithm.target_kl=0.05", "algorithm.value_clip=0.2"),
    # CPU slots may be shared by components (ray backend), and local runs everything on one slot
    ("cluster.component_placement.env=3", "cluster.component_placement.rollout=3"),
    ("cluster.backend=local", "cluster.component_placement.env=0", "cluster.component_placement.rollout=0",
     "cluster.component_placement.actor=0"),
    # a hub repo id is looked up by the worker; a tiny checkpoint is created where model.path says
    ("model.name=openvla", "model.path=openvla/openvla-7b"),
    ("model.name=openvla", "model.path=./not/yet/there", "model.tiny_random_init=true"),
    ("model.name=openvla", "model.path={tmp}"),
    ("runner.val_check_interval=0", "runner.save_interval=0", "env.max_episode_steps=0"),
    # the KL-controlled bound may pin a single value, and start outside its range (clamped into it)
    ("algorithm.staleness_control=kl", "algorithm.staleness_min=2", "algorithm.staleness_max=2"),
    ("algorithm.staleness_control=kl", "algorithm.staleness_threshold=0", "algorithm.staleness_min=1"),
], ids=lambda o: "+".join(o))
def test_edge_values_that_are_valid(tmp_path, overrides):
    build_config(tmp_path, *_overrides(overrides, tmp_path))


def test_resume_dir_checkpoint_and_checkpoints_root(tmp_path):
    root = tmp_path / "logs" / "run" / "checkpoints"
    step = root / "global_step_4"
    step.mkdir(parents=True)
    (step / "runner.json").write_text("{}")
    (root / "latest").write_text("global_step_4\n")
    with pytest.raises(ConfigError, match="holds no runner.json and manifest.json"):  # never sealed
        build_config(tmp_path, f"runner.resume_dir={step}")
    write_manifest(str(step))
    assert build_config(tmp_path, f"runner.resume_dir={step}").runner.resume_dir == str(step)
    with pytest.raises(ConfigError, match="holds no runner.json") as err:
        build_config(tmp_path, f"runner.resume_dir={root}")
    assert repr(str(step)) in str(err.value)  # points to the newest checkpoint under the root


def test_env_family_check_through_the_registry(tmp_path, monkeypatch):
    import envs.maniskill.tasks
    from embodied_async.registry import family_config
    from envs.maniskill import ManiSkillConfig

    assert family_config("env", "maniskill") is ManiSkillConfig
    with pytest.raises(ConfigError, match="close: .*PushCube-v1"):
        ManiSkillConfig(task="PushCub-v1").check()
    with pytest.raises(ConfigError, match="registered: .*maniskill"):
        family_config("env", "nosuchsim")

    def assets_missing(task_id, robot_uids=None):
        raise FileNotFoundError(f"ManiSkill task '{task_id}' needs assets that are not downloaded")

    # missing assets are the env worker's to report (with the download command), not a config error
    monkeypatch.setattr(envs.maniskill.tasks, "check_task_assets", assets_missing)
    assert build_config(tmp_path).env.task == "PushCube-v1"


def test_wrong_type_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="env.num_envs"):
        to_train_config({"model": {"name": "mlp"}, "env": {"name": "maniskill", "num_envs": "many"}})


def test_a_renamed_key_still_works_with_a_warning_naming_the_new_one(capsys, tmp_path):
    cfg = build_config(tmp_path, "env.task_id=PullCube-v1", "env.robot_uids=panda")
    assert (cfg.env.task, cfg.env.robot, cfg.env.task_id, cfg.env.robot_uids) == ("PullCube-v1", "panda", None, None)
    err = capsys.readouterr().err
    assert "env.task_id is renamed env.task" in err and "env.robot_uids is renamed env.robot" in err
    # on a recipe's command line: Hydra still knows the old key
    from embodied_async.config.recipes import compose_recipe

    raw = compose_recipe("maniskill_async_ppo_mlp", ["env.task_id=PullCube-v1", "cluster.device_type=cpu"])
    assert to_train_config(raw).env.task == "PullCube-v1"


def test_a_required_key_left_unset_is_named():
    with pytest.raises(ConfigError, match=r"env.task is required but not set: .*\(env.task=...\)"):
        to_train_config({"model": {"name": "mlp"}, "env": {"name": "maniskill"}})


@pytest.mark.parametrize("section", ["model", "env"])
def test_a_missing_family_name_lists_the_registered_ones(section):
    cfg = {"model": {"name": "mlp"}, "env": {"name": "maniskill", "task": "PushCube-v1"}}
    del cfg[section]["name"]
    with pytest.raises(ConfigError, match=rf"{section}.name is not set; registered: .*embodied_async\.") as err:
        to_train_config(cfg)
    assert ("mlp" if section == "model" else "maniskill") in str(err.value)


def test_placement_beyond_the_gpus_present(tmp_path):
    cfg = build_config(tmp_path)
    cfg.cluster.device_type = "gpu"
    cfg.cluster.component_placement = {"env,rollout": "0-1", "actor": "0-3"}
    with pytest.raises(ConfigError, match="GPU 2, but this machine has 2 GPUs"):
        check(cfg, num_gpus=2)
    cfg.cluster.component_placement = {"env,rollout,actor": "0-1"}
    check(cfg, num_gpus=2)  # fits


def _run_entry(*overrides):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, ENTRY, *overrides], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)
    return proc, time.monotonic() - start


@pytest.mark.slow  # runs the entry point in a subprocess
@pytest.mark.parametrize("override", ["nonsense.key=1", "+nonsense.key=1"])
def test_cli_rejects_unknown_key_before_starting(override, tmp_path):
    proc, seconds = _run_entry(override, f"runner.logger.log_path={tmp_path}/logs")
    assert proc.returncode != 0
    assert "nonsense.key" in proc.stderr + proc.stdout
    assert "building workers" not in proc.stdout
    assert seconds < 30


@pytest.mark.slow  # runs the entry point in a subprocess
def test_cli_rejects_gpu_placement_without_gpus(tmp_path):
    proc, _ = _run_entry("cluster.device_type=gpu", f"runner.logger.log_path={tmp_path}/logs")
    assert proc.returncode == 2
    assert "asks for GPUs, but this machine has none" in proc.stderr


@pytest.mark.slow  # runs the entry point in a subprocess
@pytest.mark.parametrize("override, key, fix", [
    ("algorithm.rollout_store_size_per_rank=0", "algorithm.rollout_store_size_per_rank=0", "set it to 1 or more"),
    ("env.task=PushCub-v1", "env.task", "PushCube-v1"),
])
def test_cli_rejects_bad_values_before_starting(override, key, fix, tmp_path):
    proc, seconds = _run_entry(override, f"runner.logger.log_path={tmp_path}/logs")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert key in proc.stderr and fix in proc.stderr, proc.stderr
    assert "building workers" not in proc.stdout
    assert seconds < 30


def _compose(recipe, *overrides):
    from hydra import compose, initialize_config_dir

    from embodied_async.config.hydra_schema import register_schema

    register_schema()
    with initialize_config_dir(config_dir=os.path.join(REPO_ROOT, "configs"), version_base=None):
        return compose(config_name=recipe, overrides=list(overrides))


@pytest.mark.parametrize("recipe", ["maniskill_async_ppo_mlp", "maniskill_ppo_mlp", "maniskill_async_ppo_cnn",
                                    "maniskill_async_ppo_openvla_tiny", "mujoco_async_ppo_mlp", "mujoco_async_ppo_cnn"])
def test_cpu_recipes_are_valid_here(recipe, tmp_path):
    cfg = to_train_config(_compose(recipe, f"runner.logger.log_path={tmp_path}"))
    assert cfg.runner.max_steps > 0


def test_openvla_recipe_needs_its_gpus_and_points_to_the_tiny_one(tmp_path):
    raw = _compose("maniskill_async_ppo_openvla", f"runner.logger.log_path={tmp_path}")
    with pytest.raises(ConfigError, match="maniskill_async_ppo_openvla_tiny"):
        to_train_config(raw)
    cfg = to_train_config(_compose("maniskill_async_ppo_openvla", "cluster.device_type=cpu",
                                   f"runner.logger.log_path={tmp_path}"))
    cfg.cluster.device_type = "gpu"
    check(cfg, num_gpus=4)  # batch sizes and placement fit 4 GPUs
    with pytest.raises(ConfigError, match="on GPU 2, but this machine has 2 GPUs"):
        check(cfg, num_gpus=2)


def test_supervised_and_init_from_settings_are_checked_at_start_up(make_config, tmp_path):
    with pytest.raises(ConfigError, match="runner.mode=sft needs dataset.root"):
        make_config("runner.mode=sft")
    with pytest.raises(ConfigError, match="runner.mode"):
        make_config("runner.mode=distill")
    with pytest.raises(ConfigError, match="model.init_from=.* is not a folder"):
        make_config(f"model.init_from={tmp_path}/nowhere")
    with pytest.raises(ConfigError, match="model.init_from=.* is a folder but not a checkpoint"):
        make_config(f"model.init_from={tmp_path}")
    with pytest.raises(ConfigError, match="sft.lr_schedule"):
        make_config("runner.mode=sft", f"dataset.root={tmp_path}", "sft.lr_schedule=linear")
    with pytest.raises(ConfigError, match="dataset.validation_fraction"):
        make_config("runner.mode=sft", f"dataset.root={tmp_path}", "dataset.validation_fraction=1.0")
    cfg = make_config("runner.mode=sft", f"dataset.root={tmp_path}", "actor.global_batch_size=7",
                      "actor.micro_batch_size=7")
    assert cfg.runner.mode == "sft"  # a supervised batch need not divide a rollout batch
    # a key only the PPO mode reads is refused in a supervised run, naming the key and the mode
    for override in ("runner.stop_at_eval_success=0.9", "runner.eval_pauses_training=true", "runner.max_env_steps=9",
                     "actor.policy_lr_schedule=cosine", "actor.frozen_parameter_prefixes=[actor.]",
                     "algorithm.adv_type=grpo", "rollout.num_steps=7"):
        key = override.split("=")[0]
        with pytest.raises(ConfigError, match=rf"{key}=.* with runner.mode=sft: only runner.mode=ppo reads it"):
            make_config("runner.mode=sft", f"dataset.root={tmp_path}", override)


def test_a_key_only_the_supervised_mode_reads_is_refused_in_a_ppo_run(make_config):
    for override in ("sft.lr_schedule=constant", "sft.validation_batches=3", "dataset.validation_fraction=0.2"):
        key = override.split("=")[0]
        with pytest.raises(ConfigError, match=rf"{key}=.* with runner.mode=ppo: only runner.mode=sft reads it, and "
                                              r"this run would ignore it; remove it \(its default is"):
            make_config(override)
    # the demonstrations themselves are read by the PPO loss's demonstration term too
    assert make_config("dataset.root=demos").dataset.root == "demos"


def test_group_relative_and_demonstration_settings_are_checked_at_start_up(make_config, tmp_path):
    grpo = ["algorithm.adv_type=grpo", "rollout.num_steps=12", "algorithm.normalize_advantages=false"]
    with pytest.raises(ConfigError, match="algorithm.adv_type='ppo' is not allowed"):
        make_config("algorithm.adv_type=ppo")
    with pytest.raises(ConfigError, match="algorithm.group_size=1 must be >= 2"):
        make_config(*grpo)
    # 4 sub-envs over 2 env processes: a policy batch of 2 cannot hold a group of 4
    with pytest.raises(ConfigError, match="algorithm.group_size=4: every policy batch .* a multiple of 8"):
        make_config(*grpo, "algorithm.group_size=4")
    with pytest.raises(ConfigError, match="actor.critic_warmup_steps=5 .* no critic to warm up"):
        make_config(*grpo, "algorithm.group_size=2", "actor.critic_warmup_steps=5")
    with pytest.raises(ConfigError, match="model.add_value_head=True .* builds no critic"):
        make_config(*grpo, "algorithm.group_size=2", "model.add_value_head=true")
    with pytest.raises(ConfigError, match="model.add_value_head=False .* GAE needs the critic"):
        make_config("model.add_value_head=false")
    # 8 decisions of one action cannot hold a 10-step episode
    with pytest.raises(ConfigError, match="env.max_episode_steps=10; set rollout.num_steps to at least 10"):
        make_config("algorithm.adv_type=grpo", "algorithm.group_size=2")
    assert make_config(*grpo, "algorithm.group_size=2").model.add_value_head is False
    assert make_config().model.add_value_head is True
    # group-relative advantages are normalised per group already: a second normalisation is refused
    with pytest.raises(ConfigError, match=r"algorithm.normalize_advantages=true \(its default\) with "
                                          "algorithm.adv_type=grpo"):
        make_config("algorithm.adv_type=grpo", "rollout.num_steps=12", "algorithm.group_size=2")
    with pytest.raises(ConfigError, match="algorithm.demo_loss_coef=0.1 needs demonstrations: set dataset.root"):
        make_config("algorithm.demo_loss_coef=0.1")
    with pytest.raises(ConfigError, match="algorithm.demo_loss_coef=-1.0 must be >= 0"):
        make_config("algorithm.demo_loss_coef=-1.0")
    with pytest.raises(ConfigError, match="algorithm.demo_batch_size=0"):
        make_config("algorithm.demo_loss_coef=0.1", f"dataset.root={tmp_path}", "algorithm.demo_batch_size=0")


def test_success_ends_and_reward_scale_have_one_name_across_families(make_config):
    robosuite = ("env.name=robosuite", "env.task=Reach")
    with pytest.raises(ConfigError, match="env.end_on_success=false, but the 'maniskill' env family's tasks end an "
                                          "episode at success"):
        make_config("env.end_on_success=false")
    assert make_config(*robosuite, "env.end_on_success=false").env.end_on_success is False
    with pytest.raises(ConfigError, match="env.terminal_on_success=true with env.end_on_success=false"):
        make_config(*robosuite, "env.end_on_success=false", "env.terminal_on_success=true")
    with pytest.raises(ConfigError, match=r"env.reward_scale=2.0 was removed: set algorithm.reward_scale=2.0"):
        make_config(*robosuite, "env.reward_scale=2.0")
