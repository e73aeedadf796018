"""A pipeline of commands: its phases declared in YAML (``configs/pipelines/<name>.yaml``, its
``phases``), each running commands of the one command line in this process (``cli.run_here``,
which hands back what the command made) and keeping its result in ``<out>/pipeline.json``.

A repeated command keeps the phases that finished with the same settings and runs again those whose
settings changed, with every phase that stands on one that ran again. What a phase's commands and
settings are is the pipeline's definition (``miniature.py``: a ``Definition``); this module knows
none of them. The pipeline runs as a driver in a process group of its own
(``signals.run_driver_in_own_group``), so Ray's daemons are out of reach of a terminal's Ctrl-C,
which the phase in flight answers as a run does (it saves and stops), and so does the pipeline.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from embodied_async.cli.errors import CommandError

PIPELINES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "pipelines")
STATE_FILE = "pipeline.json"
PHASE_KEYS = ("name", "command", "stands_on", "per_seed")


class PhaseFailed(Exception):
    """A phase's command failed (the error table's row: exit 1); its log names why."""


@dataclass(frozen=True)
class Phase:
    name: str  # as the state file and the logs name it: rl_seed0
    kind: str  # as the YAML declares it: rl
    command: str  # the command of the command line it runs
    stands_on: Tuple[str, ...] = ()  # the phases whose results it uses
    seed: Optional[int] = None  # a per-seed phase's seed


def pipeline_file(name: str) -> Dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(os.path.join(PIPELINES, f"{name}.yaml")))


def declared_phases(declaration: Sequence[Dict], seeds: Sequence[int], where: str) -> List[Phase]:
    """The phases in the order they run: those declared once, then each seed's per-seed phases
    (``<name>_seed<S>``; one standing on a per-seed phase stands on that seed's). ``where``: the
    declaration's file, for its errors."""
    from embodied_async.cli import COMMANDS

    once, per_seed, declared = [], [], {}
    for entry in declaration:
        unknown = sorted(set(entry) - set(PHASE_KEYS))
        name, command = entry.get("name"), entry.get("command")
        if unknown or not name or name in declared:
            raise CommandError(f"{where}: phase {entry}: give each a new name and only the keys {list(PHASE_KEYS)}")
        if command not in COMMANDS or COMMANDS[command].here is None:
            runnable = [key for key, value in COMMANDS.items() if value.here]
            raise CommandError(f"{where}: phase {name!r} runs {command!r}: a phase runs one of {runnable}")
        for parent in entry.get("stands_on", []):
            if parent not in declared or (declared[parent] and not entry.get("per_seed")):
                raise CommandError(f"{where}: phase {name!r} stands on {parent!r}: name a phase declared before "
                                   "it (a phase run once cannot stand on a per-seed one)")
        if once and per_seed and not entry.get("per_seed"):
            raise CommandError(f"{where}: phase {name!r}: declare the phases run once before the per-seed ones")
        declared[name] = bool(entry.get("per_seed"))
        (per_seed if declared[name] else once).append(entry)

    def phase(entry: Dict, seed: Optional[int]) -> Phase:
        suffix = "" if seed is None else f"_seed{seed}"
        stands_on = tuple(parent + (suffix if declared[parent] else "") for parent in entry.get("stands_on", []))
        return Phase(entry["name"] + suffix, entry["name"], entry["command"], stands_on, seed)

    return [phase(entry, None) for entry in once] + [phase(entry, seed) for seed in seeds for entry in per_seed]


class Definition(Protocol):
    """What a pipeline is made of besides its declared phases."""

    def settings(self, phase: Phase) -> Dict:
        """What the phase's result depends on besides the phases it stands on."""

    def continuation(self, phase: Phase, earlier: Optional[Dict], settings: Dict) -> Optional[Tuple[Dict, str]]:
        """The earlier result (with its ``seconds``) a phase whose settings changed goes on from,
        and the line saying so; None: it starts afresh."""

    def run_phase(self, phase: Phase, pipeline: "Pipeline", continued: Optional[Dict]) -> Dict:
        """Run the phase's commands (``pipeline.command``); its result."""


class Pipeline:
    """The phases of ``definition`` in ``out``, their results in its ``pipeline.json``."""

    def __init__(self, name: str, out: str, phases: Sequence[Phase], definition: Definition) -> None:
        self.name, self.out, self.phases, self.definition = name, out, list(phases), definition
        os.makedirs(out, exist_ok=True)
        self.state = load_state(out)

    def say(self, line: str) -> None:
        print(f"[{self.name}] {line}", flush=True)

    def run(self) -> Dict[str, Dict]:
        """Every phase not finished with its settings, in order; the results of all."""
        reran = set()
        for phase in self.phases:
            earlier = self.state["phases"].get(phase.name)
            settings = self.definition.settings(phase)
            stale = bool(reran & set(phase.stands_on))
            if earlier is not None and not stale and earlier.get("settings") == settings:
                self.say(f"{phase.name}: done in an earlier run ({earlier['seconds']:.0f} s), kept")
                continue
            if earlier is not None and not stale:
                self.say(f"{phase.name}: its settings changed since the earlier run: running it and the phases that "
                         "stand on it again")
            reran.add(phase.name)
            self.state["phases"].pop(phase.name, None)
            continuing = None if stale else self.definition.continuation(phase, earlier, settings)
            self.say(f"{phase.name}: {continuing[1] if continuing else 'starting'}")
            started = time.time()
            result = self.definition.run_phase(phase, self, continuing[0] if continuing else None)
            if continuing:  # a continued phase's time is the whole of it
                result["continued_from"] = continuing[0]
            result["seconds"] = round(time.time() - started + (continuing[0]["seconds"] if continuing else 0.0), 1)
            result["settings"] = settings
            self.state["phases"][phase.name] = result
            save_state(self.out, self.state)
            self.say(f"{phase.name}: done in {result['seconds']:.0f} s")
        return self.state["phases"]

    def command(self, phase: Phase, label: str, arguments: Sequence[str]) -> Dict:
        """Run the phase's command with ``arguments`` here, its output in ``<out>/<label>.log``;
        what it made. A command stopped by Ctrl-C or SIGTERM (it saved) stops the pipeline."""
        from embodied_async.phase_output import last_error, run_phase

        log_file = os.path.join(self.out, f"{label}.log")
        outcome = run_phase([phase.command, *arguments], log_file)
        if outcome.code in (130, 143):
            raise KeyboardInterrupt
        if outcome.code == 2:
            raise CommandError(f"{label}: {last_error(log_file)} (the whole output: {log_file})")
        if outcome.code != 0:
            raise PhaseFailed(f"{label} (exit {outcome.code}): {last_error(log_file)}; the whole output: {log_file}. "
                              "Run the same command again to retry from this phase")
        return dict(outcome.result or {})

    def take_phases(self, source: str, names: Sequence[str], flag: str) -> None:
        """The phases ``names`` as another pipeline's folder ``source`` finished them (``flag``: the
        option naming it, for its errors). One whose settings differ from this command's runs again
        here when no other taken phase stands on it, and is refused otherwise; this folder's phases
        that stood on other results of those phases run again."""
        if os.path.abspath(source) == os.path.abspath(self.out):
            raise CommandError(f"{flag} {source} is this run's own --out: name another pipeline's folder")
        if not os.path.isfile(os.path.join(source, STATE_FILE)):
            raise CommandError(f"{flag} {source}: it has no {STATE_FILE}: name a folder the {self.name} ran in")
        finished, phases = load_state(source)["phases"], {phase.name: phase for phase in self.phases}
        theirs = {}
        for name in names:
            if name not in finished:
                raise CommandError(f"{flag} {source}: its {name} phase has not finished: run the {self.name} there "
                                   "first")
            theirs[name] = finished[name]
        for name in reversed(names):
            settings = self.definition.settings(phases[name])
            if theirs[name].get("settings") == settings:
                continue
            if any(name in phases[other].stands_on for other in theirs):
                raise CommandError(f"{flag} {source}: its {name} phase ran with {theirs[name].get('settings')}, "
                                   f"this command asks for {settings}: pass the same settings as there")
            del theirs[name]
            self.say(f"{flag} {source}: its {name} phase ran with other settings: it runs again here")
        ours = self.state["phases"]
        changed = {name for name in theirs if ours.get(name) != theirs[name]}
        for phase in self.phases:  # what stood on another result of a taken phase runs again
            if phase.name not in theirs and changed & set(phase.stands_on):
                ours.pop(phase.name, None)
                changed.add(phase.name)
        ours.update(theirs)
        save_state(self.out, self.state)


def load_state(folder: str) -> Dict:
    path = os.path.join(folder, STATE_FILE)
    if not os.path.isfile(path):
        return {"phases": {}}
    try:
        with open(path) as f:
            state = json.load(f)
        if not isinstance(state.get("phases"), dict):
            raise ValueError("no 'phases' object")
    except ValueError as err:
        raise CommandError(f"{path} is damaged ({err}): use another --out, or --restart to start over") from None
    return state


def save_state(folder: str, state: Dict) -> None:
    path = os.path.join(folder, STATE_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(state, f, indent=1)
    os.replace(path + ".tmp", path)
