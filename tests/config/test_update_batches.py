"""The batch arithmetic and the update settings, each derived from the config in one place."""

from embodied_async.algorithms.ppo import UpdateSettings
from embodied_async.config.batches import update_batches
from embodied_async.config.schema import TrainConfig


def _config() -> TrainConfig:
    cfg = TrainConfig()
    cfg.env.num_envs, cfg.rollout.num_steps, cfg.algorithm.rollout_store_size_per_rank = 8, 10, 3
    cfg.actor.global_batch_size, cfg.actor.micro_batch_size, cfg.algorithm.update_epochs = 60, 16, 4
    return cfg


def test_update_batches_follow_the_store_the_sub_envs_the_steps_and_the_ranks():
    batches = update_batches(_config(), world_size=2)
    assert (batches.decisions, batches.minibatch, batches.minibatches) == (240, 60, 4)
    assert (batches.optimizer_steps, batches.per_rank, batches.micro) == (16, 30, 16)
    assert update_batches(_config(), world_size=4).micro == 15  # capped at a rank's share


def test_update_settings_take_each_config_key_once():
    cfg = _config()
    alg, actor = cfg.algorithm, cfg.actor
    alg.clip_ratio_low, alg.clip_ratio_high, alg.clip_ratio_c = 0.11, 0.12, 4.5
    alg.behave_weight_threshold, alg.value_clip, alg.huber_delta = 3.5, 0.25, 7.0
    alg.value_loss_coef, alg.entropy_coef, alg.normalize_advantages, alg.target_kl = 0.7, 0.01, False, 0.05
    actor.max_grad_norm, actor.lr, actor.policy_lr_warmup_steps, actor.critic_warmup_steps = 0.9, 2e-4, 30, 7
    cfg.rollout.recompute_logprobs = False
    early = UpdateSettings.from_config(cfg, world_size=2, version=3, optimizer_steps=5)
    assert (early.epochs, early.minibatch_size, early.micro_batch_size, early.world_size, early.version) == \
        (4, 30, 16, 2, 3)
    assert (early.clip_ratio_low, early.clip_ratio_high, early.clip_ratio_c) == (0.11, 0.12, 4.5)
    assert (early.behave_weight_threshold, early.value_clip, early.huber_delta) == (3.5, 0.25, 7.0)
    assert (early.value_loss_coef, early.entropy_coef, early.normalize_advantages, early.target_kl) == \
        (0.7, 0.01, False, 0.05)
    assert (early.max_grad_norm, early.policy_lr, early.policy_lr_warmup_steps) == (0.9, 2e-4, 30)
    assert early.recompute_logprobs is False
    # 5 of the 7 critic warm-up steps taken: 2 left, and no policy step yet
    assert (early.critic_warmup_left, early.policy_steps_before) == (2, 0)
    later = UpdateSettings.from_config(cfg, world_size=2, version=9, optimizer_steps=20)
    assert (later.critic_warmup_left, later.policy_steps_before) == (0, 13)
