"""The RL4VLA story in miniature, on a CPU, one command per tiny random-init VLA family
(``configs/pipelines/miniature_<family>.yaml``): ``collect`` scripted demonstrations, ``sft`` on
them, ``eval_sft``, then per RL seed ``rl_seed<S>`` (async PPO from the SFT checkpoint) and
``eval_rl_seed<S>`` on the same episode seeds, every evaluation under the deterministic decision
rule and the sampled policy; the record (``embodied_async/records.py``): ``<out>/record.json`` /
``.png`` and one JSON per RL seed. Phases that finished are kept when the command is repeated and
rerun when their settings (or those of a phase they stand on) change. ``docs/miniature.md`` is the
manual: ``--rl-seeds``, ``--rl-recipe``, ``--sft-from``, ``--smoke``, ``--record``, overrides.

    .venv/bin/python scripts/miniature.py openvla            # or pi0
    .venv/bin/python scripts/miniature.py pi0 --rl-seeds 0 1 2 --record benchmarks
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import sys
import time
from typing import Dict, List, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from embodied_async.records import (  # noqa: E402
    SFT_PHASES,
    build_record,
    copy_record,
    summary_line,
    summary_record,
    write_record,
)

RL_PHASES = ("rl", "eval_rl")  # once per RL seed: rl_seed<S>, eval_rl_seed<S>
DECISION_RULES = ("deterministic", "sampled")
STATE_FILE = "pipeline.json"
EVAL_SEED = 20_260_000  # the episode seeds both evaluations share


PIPELINES = os.path.join(REPO_ROOT, "configs", "pipelines")  # miniature.yaml, miniature_<family>.yaml


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


def pipeline_file(name: str) -> Dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(os.path.join(PIPELINES, f"{name}.yaml")))


FAMILIES = {name[len("miniature_"):-len(".yaml")]: Family(**pipeline_file(name[:-len(".yaml")]))
            for name in sorted(os.listdir(PIPELINES)) if name.startswith("miniature_")}
SHARED = pipeline_file("miniature")
FULL, SMOKE = Sizes(**SHARED["full"]), Sizes(**SHARED["smoke"])
SMOKE_RUN, SMOKE_SFT, SMOKE_RL = (SHARED["smoke_overrides"][k] for k in ("every_run", "sft", "rl"))


class PipelineError(Exception):
    """Bad input: printed as one line, exit code 2."""


class PhaseFailed(Exception):
    """A phase's command failed: its log names why."""


def main(argv=None) -> int:
    from embodied_async.signals import is_driver, run_driver_in_own_group

    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    if not is_driver():  # the launcher: the pipeline's driver, in a process group of its own (Ray's too)
        return run_driver_in_own_group([os.path.abspath(__file__), *argv])
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # until a phase's run takes the signals over
    try:
        pipeline = Pipeline(args)
        pipeline.run()
    except PipelineError as err:
        print(f"miniature error: {err}", file=sys.stderr, flush=True)
        return 2
    except PhaseFailed as err:
        print(f"[miniature] {err}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("[miniature] stopped by Ctrl-C: the phases that finished are kept; run the same command to go on",
              file=sys.stderr, flush=True)
        return 130
    return 0


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", help=f"one of {sorted(FAMILIES)}")
    parser.add_argument("--out", default=None, help="the pipeline's folder (default logs/miniature_<family>)")
    parser.add_argument("--demos", type=int, default=None, help=f"demonstration episodes (default {FULL.demos})")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT steps (default: "
                        + ", ".join(f"{name} {family.sft_steps}" for name, family in FAMILIES.items()) + ")")
    parser.add_argument("--rl-updates", type=int, default=None,
                        help="PPO updates (default: the recipe's); more than a finished run made continue it")
    parser.add_argument("--rl-recipe", default=None,
                        help="the RL phase's recipe (default: the family's PPO recipe; e.g. "
                             "maniskill_miniature_grpo_openvla for group-relative advantages)")
    parser.add_argument("--eval-episodes", type=int, default=None,
                        help=f"episodes of each evaluation before and after RL (default {FULL.eval_episodes})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demonstrations and the training runs")
    parser.add_argument("--rl-seeds", metavar="SEED", default=None,
                        help="--rl-seeds S [S ...]: run the RL phase and its evaluation once per seed, from the one "
                             "SFT checkpoint (default: --seed)")
    parser.add_argument("--smoke", action="store_true", help="a few demonstrations, SFT steps and one RL update")
    parser.add_argument("--restart", action="store_true", help="discard the phases a previous run finished")
    parser.add_argument("--record", default=None, help="also copy record.json/.png into this folder, dated")
    parser.add_argument("--sft-from", default=None, metavar="DIR",
                        help="start the RL phases from the SFT checkpoint another --out folder made (its "
                             "demonstrations, checkpoint and evaluation), so RL variants compare on one warm start")
    parser.add_argument("overrides", nargs="*", help="key=value (every phase), sft:key=value, rl:key=value")
    argv, rl_seeds = _take_rl_seeds(list(sys.argv[1:] if argv is None else argv), parser)
    args = parser.parse_intermixed_args(argv)
    args.rl_seeds = rl_seeds
    return args


def _take_rl_seeds(argv: List[str], parser):
    """``--rl-seeds`` and the integers after it (key=value overrides may follow them)."""
    if "--rl-seeds" not in argv:
        return argv, None
    at = argv.index("--rl-seeds")
    end = at + 1
    while end < len(argv) and re.fullmatch(r"-?\d+", argv[end]):
        end += 1
    if end == at + 1:
        parser.error("--rl-seeds needs one or more integer seeds, e.g. --rl-seeds 0 1 2")
    return argv[:at] + argv[end:], [int(v) for v in argv[at + 1:end]]


class Pipeline:
    def __init__(self, args):
        if args.family not in FAMILIES:
            raise PipelineError(f"unknown family {args.family!r}: use one of {sorted(FAMILIES)}")
        self.args, self.family = args, FAMILIES[args.family]
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
                raise PipelineError(f"{name} must be >= 1, not {value}")
        self.common, self.sft_only, self.rl_only = split_overrides(args.overrides)
        self.rl_seeds = list(dict.fromkeys(args.rl_seeds if args.rl_seeds is not None else [args.seed]))
        self.phases = [*SFT_PHASES, *(f"{phase}_seed{seed}" for seed in self.rl_seeds for phase in RL_PHASES)]
        self.out = os.path.abspath(args.out or os.path.join(REPO_ROOT, "logs", f"miniature_{args.family}"))
        for recipe in (self.family.sft_recipe, self.family.rl_recipe):
            if not os.path.isfile(os.path.join(REPO_ROOT, "configs", f"{recipe}.yaml")):
                raise PipelineError(f"the recipe configs/{recipe}.yaml is missing from this checkout")
        if args.restart and os.path.isdir(self.out):
            shutil.rmtree(self.out)
        os.makedirs(self.out, exist_ok=True)
        self.state = self._load_state()
        self.continue_from: Dict[int, Dict] = {}  # RL seed -> the earlier run it continues (continuation())
        if args.sft_from:
            self._take_sft_phases(os.path.abspath(args.sft_from))

    # ---- the phases -------------------------------------------------------------------------

    def run(self) -> None:
        updates = self.sizes.rl_updates or "the recipe's"
        print(f"[miniature] {self.args.family}: {self.sizes.demos} demonstrations, {self.sizes.sft_steps} SFT steps, "
              f"{updates} PPO updates per RL seed {self.rl_seeds}, {self.sizes.eval_episodes} evaluation episodes "
              f"before and after RL; in {self.out}", flush=True)
        started = time.time()
        # a phase whose settings changed runs again, and so does every phase that stands on it
        reran = set()
        for phase in self.phases:
            earlier = self.state["phases"].get(phase)
            settings = self._phase_settings(phase)
            stale = bool(reran & set(depends_on(phase)))
            if earlier is not None and not stale and earlier.get("settings") == settings:
                print(f"[miniature] {phase}: done in an earlier run ({earlier['seconds']:.0f} s), kept", flush=True)
                continue
            if earlier is not None and not stale:
                print(f"[miniature] {phase}: its settings changed since the earlier run: running it and the phases "
                      "that stand on it again", flush=True)
            reran.add(phase)
            self.state["phases"].pop(phase, None)
            base, _, seed = phase.partition("_seed")
            if base == "rl" and not stale and (earlier_run := continuation(earlier, settings)):
                self.continue_from[int(seed)] = earlier_run
                print(f"[miniature] {phase}: continuing the earlier run's {earlier_run['updates']} updates from "
                      f"{earlier_run['checkpoint']} to {settings['updates']}", flush=True)
            else:
                print(f"[miniature] {phase}: starting", flush=True)
            phase_start = time.time()
            result = getattr(self, f"_{base}")(int(seed)) if seed else getattr(self, f"_{phase}")()
            # a continued run's time is the whole run's
            earlier_seconds = result.get("continued_from", {}).get("seconds", 0.0)
            result["seconds"] = round(time.time() - phase_start + earlier_seconds, 1)
            result["settings"] = settings
            self.state["phases"][phase] = result
            self._save_state()
            print(f"[miniature] {phase}: done in {result['seconds']:.0f} s", flush=True)
        records = [build_record(self.state, self.args.family, self.family, self.sizes, seed)
                   for seed in self.rl_seeds]
        record = summary_record(records)
        write_record(record, records, self.out)
        if self.args.record:
            stem = copy_record(self.out, self.args.record, record, records)
            print(f"[miniature] records copied to {stem}[-seed<S>].json / .png", flush=True)
        print(summary_line(record) + f"; record: {os.path.join(self.out, 'record.json')} / .png "
              f"({time.time() - started:.0f} s in this command)", flush=True)

    def _collect(self) -> Dict:
        demos = os.path.join(self.out, "demos")
        shutil.rmtree(demos, ignore_errors=True)  # an unfinished collection is made anew, not appended to
        command = ["collect", self.family.sft_recipe,
                   "--source", "scripted", "--episodes", str(self.sizes.demos), "--out", demos,
                   "--num-workers", "2" if self.sizes.demos > 1 else "1", "--seed", str(self.args.seed),
                   f"runner.logger.log_path={os.path.join(self.out, 'collect_log')}",
                   *self.common, "env.num_action_chunks=1"]  # recorded one action a frame, whatever the chunk
        self._call("collect", command)
        with open(os.path.join(demos, "meta", "info.json")) as f:
            info = json.load(f)
        return {"dataset": demos, "episodes": info["total_episodes"], "frames": info["total_frames"]}

    def _sft(self) -> Dict:
        log = os.path.join(self.out, "sft")
        overrides = [f"dataset.root={os.path.join(self.out, 'demos')}", f"runner.max_steps={self.sizes.sft_steps}",
                     f"runner.seed={self.args.seed}", *self._smoke_overrides(SMOKE_SFT), *self.common, *self.sft_only]
        self._train("sft", self.family.sft_recipe, log, overrides)
        return {"log": log, "checkpoint": last_checkpoint(log)}

    def _eval_sft(self) -> Dict:
        return self._evaluate("eval_sft", self.state["phases"]["sft"]["checkpoint"],
                              self._rl_model_values(self.family.sampling_keys),
                              self._rl_model_values(self.family.rule_keys))

    def _rl_model_values(self, keys: Sequence[str]) -> List[str]:
        """``model.<key>=<value>`` of the RL recipe for ``keys`` (its YAML, then rl: overrides)."""
        from omegaconf import OmegaConf

        def recipe_model(name: str) -> Dict:  # the recipe's model section over those of the recipes it extends
            raw = OmegaConf.to_container(OmegaConf.load(os.path.join(REPO_ROOT, "configs", f"{name}.yaml")))
            model: Dict = {}
            for parent in raw.get("defaults", []):
                if isinstance(parent, str) and os.path.isfile(os.path.join(REPO_ROOT, "configs", f"{parent}.yaml")):
                    model.update(recipe_model(parent))
            model.update(raw.get("model") or {})
            return model

        model = recipe_model(self.family.rl_recipe)
        values = {f"model.{key}": f"model.{key}={model[key]}" for key in keys if key in model}
        for item in (*self.common, *self.rl_only):
            key = item.split("=", 1)[0]
            if key in {f"model.{k}" for k in keys}:
                values[key] = item
        return sorted(values.values())  # a key moving from an override into the recipe changes nothing

    def _rl(self, seed: int) -> Dict:
        log = os.path.join(self.out, f"rl_seed{seed}")
        # dataset.root: the SFT run's demonstrations, for algorithm.demo_loss_coef (unread without it)
        overrides = [f"model.init_from={self.state['phases']['sft']['checkpoint']}", f"runner.seed={seed}",
                     f"dataset.root={self.state['phases']['collect']['dataset']}", *self._smoke_overrides(SMOKE_RL),
                     *self.common, *self.rl_only]
        if self.sizes.rl_updates:
            overrides.insert(1, f"runner.max_steps={self.sizes.rl_updates}")
        earlier = self.continue_from.get(seed)
        if earlier:  # its metrics.jsonl and checkpoints stay: this run appends to them
            overrides.append(f"runner.resume_dir={earlier['checkpoint']}")
        self._train(f"rl_seed{seed}", self.family.rl_recipe, log, overrides, keep_log=bool(earlier))
        result = {"log": log, "checkpoint": last_checkpoint(log), "rl_seed": seed}
        if earlier:
            result["continued_from"] = earlier
        return result

    def _eval_rl(self, seed: int) -> Dict:
        return self._evaluate(f"eval_rl_seed{seed}", self.state["phases"][f"rl_seed{seed}"]["checkpoint"])

    # ---- helpers ----------------------------------------------------------------------------

    def _smoke_overrides(self, phase: Sequence[str]) -> List[str]:
        return [*SMOKE_RUN, *phase] if self.args.smoke else []

    def _train(self, phase: str, recipe: str, log: str, overrides: Sequence[str], keep_log: bool = False) -> None:
        if not keep_log:
            shutil.rmtree(log, ignore_errors=True)  # metrics.jsonl appends: a half-run's records would mix in
        self._call(phase, ["train", recipe, f"runner.logger.log_path={log}", *overrides])

    def _evaluate(self, phase: str, checkpoint: str, sampling: Sequence[str] = (), rule: Sequence[str] = ()) -> Dict:
        """The checkpoint on the shared episode seeds, with the deterministic decision rule (the
        phase's result) and with the sampled policy (under ``sampled``; ``sampling``: overrides
        that make it the RL recipe's; ``rule``: those that make both rules the RL recipe's)."""
        results, rule_overrides = {}, list(rule)
        for rule in DECISION_RULES:
            name = phase if rule == "deterministic" else f"{phase}_sampled"
            report = os.path.join(self.out, f"{name}.json")
            episodes = self.sizes.eval_episodes
            num_envs = max(d for d in range(1, 9) if episodes % d == 0)
            command = ["eval", checkpoint, "--episodes",
                       str(episodes), "--num-envs", str(num_envs), "--seed", str(EVAL_SEED), "--device", "cpu",
                       "--json", report, f"runner.logger.log_path={os.path.join(self.out, name + '_log')}",
                       *rule_overrides, *(["--sampled", *sampling] if rule == "sampled" else [])]
            self._call(name, command)
            with open(report) as f:
                result = json.load(f)
            results[rule] = {key: result[key] for key in ("checkpoint", "episodes", "success_rate", "success_rate_ci95",
                                                          "episode_length", "episode_return", "seed",
                                                          "episode_successes")}
        return {**results["deterministic"], "sampled": results["sampled"]}

    def _call(self, phase: str, command: List[str]) -> None:
        """Run the command ``command`` (``[name, arguments...]``) in this process, its output shown
        (the lines worth it) and kept in ``<out>/<phase>.log``."""
        from embodied_async.pipeline import last_error, run_phase

        log_file = os.path.join(self.out, f"{phase}.log")
        code = run_phase(command, log_file)
        if code == 130 or code == 143:  # the phase saved and stopped: so does the pipeline
            raise KeyboardInterrupt
        if code == 2:
            raise PipelineError(f"{phase}: {last_error(log_file)} (the whole output: {log_file})")
        if code != 0:
            raise PhaseFailed(f"{phase} failed (exit {code}): {last_error(log_file)}; the whole output: {log_file}. "
                              "Run the same command again to retry from this phase")

    def _phase_settings(self, phase: str) -> Dict:
        """What a phase's result depends on besides the phases before it."""
        sizes = self.sizes
        base, _, seed = phase.partition("_seed")
        if seed:  # an RL seed's phases depend on SFT's, not on the other seeds'
            return {"rl": {"updates": sizes.rl_updates, "overrides": self.rl_only, "seed": int(seed),
                           "recipe": self.family.rl_recipe},
                    "eval_rl": {"episodes": sizes.eval_episodes, "rules": list(DECISION_RULES)}}[base]
        return {
            "collect": {"family": self.args.family, "demos": sizes.demos, "seed": self.args.seed,
                        "smoke": self.args.smoke, "overrides": self.common},
            "sft": {"steps": sizes.sft_steps, "overrides": self.sft_only},
            "eval_sft": {"episodes": sizes.eval_episodes, "rules": list(DECISION_RULES),
                         "sampling": self._rl_model_values(self.family.sampling_keys),
                         **({"rule": rule} if (rule := self._rl_model_values(self.family.rule_keys)) else {})},
        }[phase]

    def _take_sft_phases(self, source: str) -> None:
        """``--sft-from``: the SFT phases (and their results) of the pipeline in ``source``, which
        must have finished them with this command's settings; RL runs here that stood on other
        SFT phases run again. Its evaluation of the SFT checkpoint is taken where it decided as
        this command's RL recipe does, and runs again here where not (``Family.rule_keys``)."""
        if source == self.out:
            raise PipelineError(f"--sft-from {source} is this run's own --out: name another pipeline's folder")
        if not os.path.isfile(os.path.join(source, STATE_FILE)):
            raise PipelineError(f"--sft-from {source}: it has no {STATE_FILE}: name a folder the miniature ran in")
        theirs = self._load_state(source)["phases"]
        for phase in SFT_PHASES:
            if phase not in theirs:
                raise PipelineError(f"--sft-from {source}: its {phase} phase has not finished: run the miniature "
                                    "there first")
        theirs = {phase: theirs[phase] for phase in SFT_PHASES}
        if theirs["eval_sft"].get("settings") != self._phase_settings("eval_sft"):
            del theirs["eval_sft"]
            print(f"[miniature] --sft-from {source}: its SFT evaluation decided otherwise than this RL recipe "
                  "does: it runs again here", flush=True)
        for phase in theirs:
            if theirs[phase].get("settings") != self._phase_settings(phase):
                raise PipelineError(f"--sft-from {source}: its {phase} phase ran with {theirs[phase].get('settings')}, "
                                    f"this command asks for {self._phase_settings(phase)}: pass the same family, "
                                    "--seed, --demos, --sft-steps, --eval-episodes and overrides")
        ours = self.state["phases"]
        if any(ours.get(phase) != theirs[phase] for phase in ("collect", "sft")):
            self.state["phases"] = dict(theirs)  # RL runs here stood on other SFT phases: they run again
        else:
            self.state["phases"] = {**ours, **theirs}
        self._save_state()

    def _load_state(self, folder: Optional[str] = None) -> Dict:
        path = os.path.join(folder or self.out, STATE_FILE)
        if not os.path.isfile(path):
            return {"phases": {}}
        try:
            with open(path) as f:
                state = json.load(f)
            if not isinstance(state.get("phases"), dict):
                raise ValueError("no 'phases' object")
        except ValueError as err:
            raise PipelineError(f"{path} is damaged ({err}): use another --out, or --restart to start over") from None
        return state

    def _save_state(self) -> None:
        path = os.path.join(self.out, STATE_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(self.state, f, indent=1)
        os.replace(path + ".tmp", path)


def depends_on(phase: str) -> List[str]:
    """The phases whose results ``phase`` uses: SFT the demonstrations, every RL run SFT's
    checkpoint, each evaluation the checkpoint it scores."""
    base, _, seed = phase.partition("_seed")
    return {"collect": [], "sft": ["collect"], "eval_sft": ["sft"], "rl": ["sft"],
            "eval_rl": [f"rl_seed{seed}"]}[base]


def continuation(earlier: Optional[Dict], settings: Dict) -> Optional[Dict]:
    """The earlier finished RL run (its checkpoint, updates and seconds) that a run asking for more
    updates, with all else the same, continues from its last checkpoint (``runner.resume_dir``);
    None: start afresh."""
    if not earlier or not earlier.get("checkpoint") or not os.path.isdir(earlier["checkpoint"]):
        return None
    theirs, ours = dict(earlier.get("settings") or {}), dict(settings)
    theirs.pop("updates", None)
    wanted = ours.pop("updates", None)
    # the updates it made, from its checkpoint's name: a run of the recipe's own count (updates 0) too
    from embodied_async.run_folder import STEP_FOLDER

    made = STEP_FOLDER.fullmatch(os.path.basename(earlier["checkpoint"].rstrip(os.sep)))
    if made is None or not isinstance(wanted, int) or wanted <= int(made.group(1)) or theirs != ours:
        return None
    return {"checkpoint": earlier["checkpoint"], "updates": int(made.group(1)), "seconds": earlier["seconds"]}


def split_overrides(overrides: Sequence[str]):
    common, sft_only, rl_only = [], [], []
    for item in overrides:
        phase, sep, rest = item.partition(":")
        if sep and phase in ("sft", "rl") and "=" in rest:
            (sft_only if phase == "sft" else rl_only).append(rest)
        elif "=" in item:
            common.append(item)
        else:
            raise PipelineError(f"override {item!r}: write key=value (every phase), sft:key=value or rl:key=value")
    return common, sft_only, rl_only


def last_checkpoint(log: str) -> str:
    from embodied_async.run_folder import checkpoints_root, latest_checkpoint

    path = latest_checkpoint(checkpoints_root(log))
    if path is None:
        raise PhaseFailed(f"the run in {log} left no checkpoint")
    return path


# ---- the record ---------------------------------------------------------------------------------

if __name__ == "__main__":
    sys.exit(main())
