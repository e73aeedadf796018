"""Failure drills. Healing (runner.restarts_per_hour): an env or rollout worker SIGKILLed, stopped
(SIGSTOP) or busy past runner.hang_timeout_s is replaced in place, the run losing only the
trajectories under way on its links; an actor worker SIGKILLed or stopped restarts the run from its
last checkpoint. Either
way the run finishes its updates, each fault a record in metrics.jsonl, no process left behind; a
fault past the budget stops the run naming every fault. Fail-fast (runner.restarts_per_hour=0):
the run ends within 60 s with a non-zero exit and a message naming the component, its last
checkpoint whole (every file matching its manifest), and resumes from it."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT
from test_interrupt_resume import ENTRY, SMALL_CLI, kill_session, output_when_ended, session_processes, wait_for_line

from embodied_async.algorithms.version_gate import VersionGate
from embodied_async.checkpoint_io import verify_checkpoint
from embodied_async.config.recipes import default_recipe, resolve_recipe

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess

# the component's name in the error ("env[1].run failed: ..."), and the class name in its Ray
# process title ("ray::EnvWorker..."); the first such process found is killed, whichever rank it is
COMPONENTS = {"env": "EnvWorker", "rollout": "RolloutWorker", "actor": "ActorWorker"}


def component_pid(sid: int, class_name: str) -> int:
    for line in session_processes(sid):
        _, pid, args = line.split(None, 2)
        if args.startswith(f"ray::{class_name}"):
            return int(pid)
    raise AssertionError(f"no ray::{class_name} process in session {sid}:\n" + "\n".join(session_processes(sid)))


def sigkill_mid_run(args, marker: str, timeout: float, victim, signum=signal.SIGKILL) -> tuple:
    """``train_async.py args`` in a session of its own; once ``marker`` is printed, SIGKILL (or
    ``signum``) the process ``victim(session id)`` names -> (the process, its whole output, seconds
    it took to end)."""
    proc = subprocess.Popen([sys.executable, ENTRY, *args], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen = wait_for_line(proc, marker, timeout=timeout)
        os.kill(victim(proc.pid), signum)
        killed = time.monotonic()
        try:
            rest, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # what it printed says where it stuck
            kill_session(proc.pid)
            rest, _ = proc.communicate(timeout=30)
            printed = "".join(seen)[-2000:] + rest[-6000:]
            raise AssertionError(f"the run did not end within 120 s of the signal:\n{printed}") from None
        ended_after = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
    return proc, "".join(seen) + rest, ended_after


def assert_no_process_left(sid: int) -> None:
    deadline = time.monotonic() + 20
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not session_processes(sid), session_processes(sid)


@pytest.mark.slow
@pytest.mark.parametrize("component", ["actor"])  # the healing drills below kill each component
def test_sigkill_of_a_component_ends_the_run_and_keeps_the_checkpoint(tmp_path, component):
    log_path = tmp_path / "run"
    proc, output, ended_after = sigkill_mid_run(
        [*SMALL_CLI, "runner.max_steps=1000", "runner.save_interval=1", f"runner.logger.log_path={log_path}",
         "runner.restarts_per_hour=0"], "step 3/", 300, lambda sid: component_pid(sid, COMPONENTS[component]))
    print(f"[drill] {component}: run ended {ended_after:.1f}s after SIGKILL, exit {proc.returncode}")
    assert proc.returncode not in (0, None), output[-3000:]
    assert ended_after < 60, f"took {ended_after:.1f}s to end"
    assert re.search(rf"{component}\[\d+\]\.\w+ failed", output), output[-3000:]  # e.g. "env[1].run failed"
    assert_no_process_left(proc.pid)

    with open(log_path / "checkpoints" / "latest") as f:
        checkpoint = log_path / "checkpoints" / f.read().strip()
    verify_checkpoint(str(checkpoint))  # whole: every file matches its manifest entry
    with open(checkpoint / "runner.json") as f:
        saved = json.load(f)
    assert saved["step"] >= 2
    if component != "actor":
        return
    resumed = subprocess.run([sys.executable, ENTRY, *SMALL_CLI, f"runner.max_steps={saved['step'] + 1}",
                              f"runner.resume_dir={checkpoint}", f"runner.logger.log_path={tmp_path / 'resumed'}"],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    with open(tmp_path / "resumed" / "metrics.jsonl") as f:
        last = [json.loads(line) for line in f][-1]
    assert last["step"] == saved["step"] + 1 and last["train/actor/current_version"] == saved["version"]


def healed_records(log_path) -> tuple:
    """The healed faults' records (replacements and restarts) and the updates' records of a run's
    metrics.jsonl."""
    with open(log_path / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if "heal/fault" in r], [r for r in records if "train/actor/current_version" in r]


def assert_replaced_in_place(log_path, component: str, hung: bool, max_steps: int) -> dict:
    """One worker of ``component`` replaced, nothing restarted: every update logged once, in order;
    what was dropped at most one trajectory of each stream on its links (rollout.num_steps=8
    decisions of 2 sub-envs: SMALL_CLI's 4 sub-envs over the two env workers, one stage each, one
    rollout worker serving both). Its record."""
    heals, trained = healed_records(log_path)
    assert len(heals) == 1 and "heal/restarts" not in heals[0], heals
    heal = heals[0]
    assert re.fullmatch(rf"{component}\[\d\]", heal["heal/replaced"]) and heal["heal/hung"] == float(hung)
    streams = 1 if component == "env" else 2
    assert 0 <= heal["heal/lost_decisions"] <= 8 * streams
    assert heal["heal/lost_samples"] == 2 * heal["heal/lost_decisions"]
    assert [r["step"] for r in trained] == list(range(1, max_steps + 1))
    assert 0 < heal["heal/gap_s"] < 60
    return heal


def killed_at_step_3_of_8(log_path, component: str) -> tuple:
    """A healing run of 8 updates (a checkpoint every 2) whose ``component`` worker is SIGKILLed at
    step 3; it finished them: (the process, its output)."""
    proc, output, _ = sigkill_mid_run(
        [*SMALL_CLI, "runner.max_steps=8", "runner.save_interval=2", f"runner.logger.log_path={log_path}"],
        "step 3/", 300, lambda sid: component_pid(sid, COMPONENTS[component]))
    assert proc.returncode == 0, output[-3000:]
    return proc, output


@pytest.mark.slow
@pytest.mark.parametrize("component", ["env", "rollout"])
def test_a_killed_env_or_rollout_worker_is_replaced_in_place_losing_only_what_was_under_way(tmp_path, component):
    log_path = tmp_path / "run"
    proc, output = killed_at_step_3_of_8(log_path, component)
    assert re.search(rf"healing: {component}\[\d\]\.run failed: the {component} process died.*replacing "
                     rf"{component}\[\d\] by a new process", output), output[-3000:]
    heal = assert_replaced_in_place(log_path, component, hung=False, max_steps=8)
    print(f"[drill] killed {component} worker: replaced in {heal['heal/gap_s']:.1f} s, "
          f"{heal['heal/lost_decisions']:.0f} decisions dropped")
    assert_no_process_left(proc.pid)


@pytest.mark.slow
@pytest.mark.parametrize("component", ["actor"])
def test_a_killed_component_restarts_the_run_which_finishes_its_updates(tmp_path, component):
    log_path = tmp_path / "run"
    proc, output = killed_at_step_3_of_8(log_path, component)
    assert re.search(rf"healing: {component}\[\d+\]\.\w+ failed: the {component} process died", output), output[-3000:]
    assert_restarted_once(log_path, hung=False, max_steps=8)
    assert_no_process_left(proc.pid)


def assert_restarted_once(log_path, hung: bool, max_steps: int) -> dict:
    """One fault, healed by a restart from the last checkpoint before it (the run saved every 2
    steps and was at step 3 at least), then every step from the checkpoint's on, once. Its record."""
    heals, _ = healed_records(log_path)
    assert len(heals) == 1, heals
    heal = heals[0]
    assert heal["heal/restarts"] == 1 and heal["heal/faults"] == 1 and heal["heal/hung"] == float(hung)
    assert heal["heal/gap_s"] > 0
    assert heal["step"] >= 2 and heal["heal/resumed_from"].endswith(f"global_step_{heal['step']}")
    with open(log_path / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    after = records[records.index(heal) + 1:]
    assert [r["step"] for r in after if "train/actor/current_version" in r] == list(range(heal["step"] + 1,
                                                                                           max_steps + 1))
    return heal


@pytest.mark.slow
@pytest.mark.parametrize("component", ["env", "rollout"])
def test_a_stopped_worker_is_found_hung_within_the_timeout_and_replaced(tmp_path, component):
    """SIGSTOP: a process that no longer answers (a wedged simulator or renderer holding its
    interpreter)."""
    log_path = tmp_path / "run"
    proc, output, ended_after = sigkill_mid_run(
        [*SMALL_CLI, "runner.max_steps=6", "runner.save_interval=2", f"runner.logger.log_path={log_path}",
         "runner.hang_timeout_s=10"], "step 3/", 300, lambda sid: component_pid(sid, COMPONENTS[component]),
        signal.SIGSTOP)
    assert proc.returncode == 0, output[-3000:]
    # its heartbeat, or the metrics the runner asks it for after each update, went unanswered
    assert re.search(rf"healing: {component}\[\d+\]\.\w+ hung: it did not answer for 10 s", output), output[-3000:]
    heal = assert_replaced_in_place(log_path, component, hung=True, max_steps=6)
    # found within the timeout and a check's period (5 s); replaced, and the run finished
    print(f"[drill] stopped {component} worker: the run finished {ended_after:.1f} s after SIGSTOP, "
          f"{heal['heal/gap_s']:.1f} s from the fault found to the new process running")
    assert ended_after < 10 + 5 + 30
    assert_no_process_left(proc.pid)


@pytest.mark.slow
def test_a_stopped_actor_is_found_hung_within_the_timeout_and_the_run_restarts_from_its_checkpoint(tmp_path):
    """SIGSTOP of the actor: its heartbeat, answered beside the update, goes silent."""
    log_path = tmp_path / "run"
    proc, output, ended_after = sigkill_mid_run(
        [*SMALL_CLI, "runner.max_steps=6", "runner.save_interval=2", f"runner.logger.log_path={log_path}",
         "runner.hang_timeout_s=10"], "step 3/", 300, lambda sid: component_pid(sid, COMPONENTS["actor"]),
        signal.SIGSTOP)
    assert proc.returncode == 0, output[-3000:]
    assert re.search(r"healing: actor\[0\]\.heartbeat hung: it did not answer for 10 s.*restarting every worker",
                     output), output[-3000:]
    heal = assert_restarted_once(log_path, hung=True, max_steps=6)
    print(f"[drill] stopped actor: the run finished {ended_after:.1f} s after SIGSTOP, "
          f"{heal['heal/gap_s']:.1f} s from the fault found to the workers running again")
    assert_no_process_left(proc.pid)


@pytest.mark.slow
def test_a_worker_that_hangs_again_past_the_budget_stops_the_run_naming_every_fault(tmp_path):
    """An env worker busy in its simulator step for 1000 s, each time the run starts: healed once
    (runner.restarts_per_hour=1), then the run stops as a fault does without healing."""
    log_path = tmp_path / "run"
    run = subprocess.run([sys.executable, ENTRY, *SMALL_CLI, "runner.max_steps=4", "env.slow_workers=[0]",
                          "env.slow_worker_delay_s=1000", "runner.hang_timeout_s=5", "runner.restarts_per_hour=1",
                          f"runner.logger.log_path={log_path}"], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-3000:]
    assert re.search(r"2 faults within an hour, past runner.restarts_per_hour=1: stopping. The faults: "
                     r"\(1\) env\[0\] hung: busy in its 'env' section for \d+ s, more than runner.hang_timeout_s=5; "
                     r"\(2\) env\[0\] hung", output), output[-3000:]
    heals, _ = healed_records(log_path)  # the first replaced in place, its successor as slow
    assert len(heals) == 1 and heals[0]["step"] == 0 and heals[0]["heal/replaced"] == "env[0]"


@pytest.mark.slow
def test_a_slow_link_holds_its_producers_back_and_nothing_piles_up(tmp_path):
    """Injected latency (cluster.inject_channel_latency_s): every item on the trajectories and the
    weights channels reaches its consumer 0.5 s late. The producers wait (backpressure): no queue
    grows past its bound or over the run, the staleness bound holds, and the run finishes its
    updates."""
    latency, steps = 0.5, 10
    log_path = tmp_path / "run"
    args = [*SMALL_CLI, f"runner.max_steps={steps}", *(f"+cluster.inject_channel_latency_s.{channel}={latency}"
                                                         for channel in ("trajectories", "weights"))]
    proc = subprocess.Popen([sys.executable, ENTRY, *args, f"runner.logger.log_path={log_path}"], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output = output_when_ended(proc, timeout=300)
    assert proc.returncode == 0, output[-6000:]
    # a worker held in a late delivery when the run ends goes with it (one once outlived its raylet)
    assert_no_process_left(proc.pid)
    _, trained = healed_records(log_path)
    assert [r["step"] for r in trained] == list(range(1, steps + 1))
    cfg, topology = resolve_recipe(default_recipe(), args)
    trajectory_bound = VersionGate.from_config(cfg.algorithm).max_capacity * len(topology.streams)
    for record in trained:
        threshold = record["train/staleness_threshold"]
        assert record["channel/trajectories_qsize"] <= trajectory_bound
        # the actor publishes a version per update, and updates need trajectories the version gate
        # admits: it cannot run more than the bound ahead of the weights the rollout has taken
        assert record["channel/weights_qsize"] <= threshold + 1
        assert record["channel/env_outputs_qsize"] <= 2 * len(topology.streams)
        assert record["train/actor/staleness"] <= threshold
    later = trained[steps // 2:]
    for name in ("trajectories", "weights", "env_outputs", "actions"):  # flat: no growth over the run
        key = f"channel/{name}_qsize"
        assert max(r[key] for r in later) <= max(r[key] for r in trained[:steps // 2]) + 1, [r[key] for r in trained]
    waited = sum(r["time/rollout_wait"] for r in trained[1:]) / (steps - 1)
    print(f"[drill] trajectories and weights {latency} s late: rollout waited {waited:.2f} s per update; queues "
          f"{[(name, max(r[f'channel/{name}_qsize'] for r in trained)) for name in ('trajectories', 'weights')]}")
    assert waited >= latency / 2  # held back by the slow link, not queueing past it
