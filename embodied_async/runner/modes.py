"""``runner.mode`` -> the mode that builds the graph and supplies the step."""

from embodied_async.runner.collect import CollectMode
from embodied_async.runner.evaluate import EvalMode
from embodied_async.runner.ppo import PPOMode
from embodied_async.runner.sft import SupervisedMode

MODES = {"ppo": PPOMode, "sft": SupervisedMode, "collect": CollectMode, "eval": EvalMode}
