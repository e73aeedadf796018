"""The RL4VLA story in miniature, on a CPU, for a tiny random-init VLA family: the pipeline
``configs/pipelines/miniature.yaml`` declares (``collect`` scripted demonstrations, ``sft`` on them,
``eval_sft``, then per RL seed ``rl_seed<S>``, async PPO from the SFT checkpoint, and
``eval_rl_seed<S>`` on the same episode seeds), with the family's recipes and keys from
``miniature_<family>.yaml``. Every evaluation runs under the deterministic decision rule and the
sampled policy; the record (``records.py``): ``<out>/record.json`` / ``.png`` and one JSON per RL
seed. ``cli/miniature.py`` is its command; ``docs/miniature.md`` the manual.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from typing import Dict, List, Optional, Sequence, Tuple

from embodied_async.cli.errors import CommandError
from embodied_async.pipeline import PIPELINES, Phase, Pipeline, declared_phases, pipeline_file
from embodied_async.records import SFT_PHASES, build_record, copy_record, summary_line, summary_record, write_record

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECISION_RULES = ("deterministic", "sampled")
EVAL_SEED = 20_260_000  # the episode seeds every evaluation shares
# the evaluation report's entries a phase keeps
REPORT_KEYS = ("checkpoint", "episodes", "success_rate", "success_rate_ci95", "episode_length", "episode_return",
               "seed", "episode_successes")


@dataclasses.dataclass(frozen=True)
class Family:
    """A family's miniature, as ``configs/pipelines/miniature_<family>.yaml`` declares it."""

    sft_recipe: str
    rl_recipe: str
    decision_rule: str
    sampling_keys: Sequence[str] = ()
    rule_keys: Sequence[str] = ()
    sft_steps: int = 2000


@dataclasses.dataclass(frozen=True)
class Sizes:
    demos: int
    sft_steps: int
    rl_updates: int
    eval_episodes: int


def families() -> Dict[str, Family]:
    return {name[len("miniature_"):-len(".yaml")]: Family(**pipeline_file(name[:-len(".yaml")]))
            for name in sorted(os.listdir(PIPELINES)) if name.startswith("miniature_")}


SHARED = pipeline_file("miniature")
FULL, SMOKE = Sizes(**SHARED["full"]), Sizes(**SHARED["smoke"])
SMOKE_RUN, SMOKE_SFT, SMOKE_RL = (SHARED["smoke_overrides"][k] for k in ("every_run", "sft", "rl"))


class Miniature:
    """The miniature's ``pipeline.Definition``: each phase's commands and settings."""

    def __init__(self, args) -> None:
        known = families()
        if args.family not in known:
            raise CommandError(f"unknown family {args.family!r}: use one of {sorted(known)}")
        self.args, self.family = args, known[args.family]
        if args.rl_recipe:
            self.family = dataclasses.replace(self.family, rl_recipe=args.rl_recipe)
        base = SMOKE if args.smoke else FULL
        self.sizes = Sizes(demos=args.demos or base.demos,
                           sft_steps=args.sft_steps or base.sft_steps or self.family.sft_steps,
                           rl_updates=args.rl_updates or base.rl_updates,
                           eval_episodes=args.eval_episodes or base.eval_episodes)
        for name, value in (("--demos", self.sizes.demos), ("--sft-steps", self.sizes.sft_steps),
                            ("--eval-episodes", self.sizes.eval_episodes)):
            if value < 1:
                raise CommandError(f"{name} must be >= 1, not {value}")
        self.common, self.sft_only, self.rl_only = split_overrides(args.overrides)
        self.rl_seeds = list(dict.fromkeys(args.rl_seeds if args.rl_seeds is not None else [args.seed]))
        for recipe in (self.family.sft_recipe, self.family.rl_recipe):
            if not os.path.isfile(os.path.join(REPO_ROOT, "configs", f"{recipe}.yaml")):
                raise CommandError(f"the recipe configs/{recipe}.yaml is missing from this checkout")
        out = os.path.abspath(args.out or os.path.join(REPO_ROOT, "logs", f"miniature_{args.family}"))
        phases = declared_phases(SHARED["phases"], self.rl_seeds, os.path.join(PIPELINES, "miniature.yaml"))
        if args.restart and os.path.isdir(out):
            shutil.rmtree(out)
        self.pipeline = Pipeline("miniature", out, phases, self)
        self.out = out
        if args.sft_from:
            self.pipeline.take_phases(os.path.abspath(args.sft_from), SFT_PHASES, "--sft-from")

    def run(self) -> None:
        updates = self.sizes.rl_updates or "the recipe's"
        self.pipeline.say(f"{self.args.family}: {self.sizes.demos} demonstrations, {self.sizes.sft_steps} SFT steps, "
                          f"{updates} PPO updates per RL seed {self.rl_seeds}, {self.sizes.eval_episodes} evaluation "
                          f"episodes before and after RL; in {self.out}")
        started = time.time()
        state = {"phases": self.pipeline.run()}
        records = [build_record(state, self.args.family, self.family, self.sizes, seed) for seed in self.rl_seeds]
        record = summary_record(records)
        write_record(record, records, self.out)
        if self.args.record:
            stem = copy_record(self.out, self.args.record, record, records)
            self.pipeline.say(f"records copied to {stem}[-seed<S>].json / .png")
        print(summary_line(record) + f"; record: {os.path.join(self.out, 'record.json')} / .png "
              f"({time.time() - started:.0f} s in this command)", flush=True)

    # ---- the pipeline's definition ------------------------------------------------------------

    def settings(self, phase: Phase) -> Dict:
        """What a phase's result depends on besides the phases it stands on (an RL seed's phases:
        on SFT's, not on the other seeds')."""
        sizes = self.sizes
        if phase.kind == "rl":
            return {"updates": sizes.rl_updates, "overrides": self.rl_only, "seed": phase.seed,
                    "recipe": self.family.rl_recipe}
        if phase.kind == "eval_rl":
            return {"episodes": sizes.eval_episodes, "rules": list(DECISION_RULES)}
        if phase.kind == "eval_sft":
            rule = self._rl_model_values(self.family.rule_keys)
            return {"episodes": sizes.eval_episodes, "rules": list(DECISION_RULES),
                    "sampling": self._rl_model_values(self.family.sampling_keys), **({"rule": rule} if rule else {})}
        return {"collect": {"family": self.args.family, "demos": sizes.demos, "seed": self.args.seed,
                            "smoke": self.args.smoke, "overrides": self.common},
                "sft": {"steps": sizes.sft_steps, "overrides": self.sft_only}}[phase.kind]

    def continuation(self, phase: Phase, earlier: Optional[Dict], settings: Dict) -> Optional[Tuple[Dict, str]]:
        """An RL run asking for more updates than the earlier finished one, all else the same,
        continues from its last checkpoint (``runner.resume_dir``)."""
        if phase.kind != "rl" or not (run := continuation(earlier, settings)):
            return None
        return run, f"continuing the earlier run's {run['updates']} updates from {run['checkpoint']} to " \
                    f"{settings['updates']}"

    def run_phase(self, phase: Phase, pipeline: Pipeline, continued: Optional[Dict]) -> Dict:
        if phase.kind == "rl":
            return self._rl(phase, continued)
        if phase.kind == "eval_rl":
            return self._evaluate(phase, self.results()[f"rl_seed{phase.seed}"]["checkpoint"])
        return getattr(self, f"_{phase.kind}")(phase)

    def results(self) -> Dict[str, Dict]:
        return self.pipeline.state["phases"]

    def _collect(self, phase: Phase) -> Dict:
        demos = os.path.join(self.out, "demos")
        shutil.rmtree(demos, ignore_errors=True)  # an unfinished collection is made anew, not appended to
        return self.pipeline.command(phase, phase.name, [
            self.family.sft_recipe, "--source", "scripted", "--episodes", str(self.sizes.demos), "--out", demos,
            "--num-workers", "2" if self.sizes.demos > 1 else "1", "--seed", str(self.args.seed),
            f"runner.logger.log_path={os.path.join(self.out, 'collect_log')}",
            *self.common, "env.num_action_chunks=1"])  # recorded one action a frame, whatever the chunk

    def _sft(self, phase: Phase) -> Dict:
        overrides = [f"dataset.root={self.results()['collect']['dataset']}", f"runner.max_steps={self.sizes.sft_steps}",
                     f"runner.seed={self.args.seed}", *self._smoke_overrides(SMOKE_SFT), *self.common, *self.sft_only]
        return self._train(phase, self.family.sft_recipe, overrides)

    def _eval_sft(self, phase: Phase) -> Dict:
        return self._evaluate(phase, self.results()["sft"]["checkpoint"],
                              self._rl_model_values(self.family.sampling_keys),
                              self._rl_model_values(self.family.rule_keys))

    def _rl(self, phase: Phase, continued: Optional[Dict]) -> Dict:
        # dataset.root: the SFT run's demonstrations, for algorithm.demo_loss_coef (unread without it)
        overrides = [f"model.init_from={self.results()['sft']['checkpoint']}", f"runner.seed={phase.seed}",
                     f"dataset.root={self.results()['collect']['dataset']}", *self._smoke_overrides(SMOKE_RL),
                     *self.common, *self.rl_only]
        if self.sizes.rl_updates:
            overrides.insert(1, f"runner.max_steps={self.sizes.rl_updates}")
        if continued:  # its metrics.jsonl and checkpoints stay: this run appends to them
            overrides.append(f"runner.resume_dir={continued['checkpoint']}")
        return {**self._train(phase, self.family.rl_recipe, overrides, keep_log=bool(continued)),
                "rl_seed": phase.seed}

    def _rl_model_values(self, keys: Sequence[str]) -> List[str]:
        """``model.<key>=<value>`` of the RL recipe for ``keys`` (its YAML, then rl: overrides)."""
        from embodied_async.config.recipes import recipe_section

        model = recipe_section(self.family.rl_recipe, "model")
        values = {f"model.{key}": f"model.{key}={model[key]}" for key in keys if key in model}
        for item in (*self.common, *self.rl_only):
            key = item.split("=", 1)[0]
            if key in {f"model.{k}" for k in keys}:
                values[key] = item
        return sorted(values.values())  # a key moving from an override into the recipe changes nothing

    def _smoke_overrides(self, phase: Sequence[str]) -> List[str]:
        return [*SMOKE_RUN, *phase] if self.args.smoke else []

    def _train(self, phase: Phase, recipe: str, overrides: Sequence[str], keep_log: bool = False) -> Dict:
        log = os.path.join(self.out, phase.name)
        if not keep_log:
            shutil.rmtree(log, ignore_errors=True)  # metrics.jsonl appends: a half-run's records would mix in
        result = self.pipeline.command(phase, phase.name, [recipe, f"runner.logger.log_path={log}", *overrides])
        if not result.get("checkpoint"):
            raise CommandError(f"{phase.name}: the run in {log} left no checkpoint: set runner.save_interval "
                               "or runner.max_steps so that it saves one")
        return {"log": result["log"], "checkpoint": result["checkpoint"]}

    def _evaluate(self, phase: Phase, checkpoint: str, sampling: Sequence[str] = (),
                  rule: Sequence[str] = ()) -> Dict:
        """The checkpoint on the shared episode seeds, with the deterministic decision rule (the
        phase's result) and with the sampled policy (under ``sampled``; ``sampling``: overrides
        that make it the RL recipe's; ``rule``: those that make both rules the RL recipe's)."""
        results, episodes = {}, self.sizes.eval_episodes
        num_envs = max(d for d in range(1, 9) if episodes % d == 0)
        for decision in DECISION_RULES:
            name = phase.name if decision == "deterministic" else f"{phase.name}_sampled"
            report = self.pipeline.command(phase, name, [
                checkpoint, "--episodes", str(episodes), "--num-envs", str(num_envs), "--seed", str(EVAL_SEED),
                "--device", "cpu", "--json", os.path.join(self.out, f"{name}.json"),
                f"runner.logger.log_path={os.path.join(self.out, name + '_log')}", *rule,
                *(["--sampled", *sampling] if decision == "sampled" else [])])
            results[decision] = {key: report[key] for key in REPORT_KEYS}
        return {**results["deterministic"], "sampled": results["sampled"]}


def continuation(earlier: Optional[Dict], settings: Dict) -> Optional[Dict]:
    """The earlier finished RL run (its checkpoint, updates and seconds) that a run asking for more
    updates, with all else the same, continues from its last checkpoint (``runner.resume_dir``);
    None: start afresh."""
    from embodied_async.run_folder import STEP_FOLDER

    if not earlier or not earlier.get("checkpoint") or not os.path.isdir(earlier["checkpoint"]):
        return None
    theirs, ours = dict(earlier.get("settings") or {}), dict(settings)
    theirs.pop("updates", None)
    wanted = ours.pop("updates", None)
    # the updates it made, from its checkpoint's name: a run of the recipe's own count (updates 0) too
    made = STEP_FOLDER.fullmatch(os.path.basename(earlier["checkpoint"].rstrip(os.sep)))
    if made is None or not isinstance(wanted, int) or wanted <= int(made.group(1)) or theirs != ours:
        return None
    return {"checkpoint": earlier["checkpoint"], "updates": int(made.group(1)), "seconds": earlier["seconds"]}


def split_overrides(overrides: Sequence[str]):
    """``(every phase's, SFT's, RL's)`` overrides of ``key=value``, ``sft:key=value``, ``rl:key=value``."""
    common, sft_only, rl_only = [], [], []
    for item in overrides:
        phase, sep, rest = item.partition(":")
        if sep and phase in ("sft", "rl") and "=" in rest:
            (sft_only if phase == "sft" else rl_only).append(rest)
        elif "=" in item:
            common.append(item)
        else:
            raise CommandError(f"override {item!r}: write key=value (every phase), sft:key=value or rl:key=value")
    return common, sft_only, rl_only
