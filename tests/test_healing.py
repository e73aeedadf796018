"""Healing without processes: the fault budget, the restart from the last checkpoint, what is never
healed, and how a hung worker is found (its heartbeat: the section it has been busy in)."""

import concurrent.futures
import threading
import time
from types import SimpleNamespace

import pytest

from embodied_async.runner import faults as faults_module
from embodied_async.runner import healing
from embodied_async.runner.faults import Faults, FaultsPastBudget
from embodied_async.runner.loop import BusyLimit, check_hangs
from embodied_async.scheduler.worker_group import Pending, WorkerDied, WorkerFailed, WorkerHung
from embodied_async.workers.base import BusyTimer


def test_the_heartbeat_is_the_longest_open_section_not_a_wait():
    timer = BusyTimer()
    assert timer.busy() is None
    with timer.section("env"):
        time.sleep(0.05)
        with timer.section("wait"):  # waiting for a peer inside it: the peer's hang, not this worker's
            assert timer.busy() is None
        name, seconds = timer.busy()  # busy in 'env' again, since it opened
        assert name == "env" and seconds >= 0.05
    assert timer.busy() is None
    with timer.section("wait"):
        assert timer.busy() is None  # a worker waiting on a peer is not the hung one
    seen = []
    with timer.section("env"):  # another thread's section counts too (the worker's loop runs in one)
        worker = threading.Thread(target=lambda: seen.append(timer.busy()))
        worker.start(), worker.join()
    assert seen[0][0] == "env"
    assert {"env", "wait"} <= set(timer.pop())  # the sections still count their time


def test_the_budget_counts_faults_within_an_hour(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(faults_module.time, "monotonic", lambda: clock[0])
    faults = Faults(per_hour=2)
    faults.admit(WorkerDied("a"))
    faults.admit(WorkerDied("b"))
    with pytest.raises(FaultsPastBudget, match=r"3 faults within an hour, past runner.restarts_per_hour=2"):
        faults.admit(WorkerHung("c"))
    clock[0] = 3600.0 + 1  # the first two are more than an hour old: a fourth may be healed
    faults.admit(WorkerDied("d"))
    assert faults.named() == "(1) a; (2) b; (3) c; (4) d"


class FakeRunner:
    """A run whose attempts end as ``outcomes`` say (an exception, or a result); it was at step 5
    and its last checkpoint is the one ``checkpoint_at`` gives."""

    outcomes: list = []
    attempts: list = []

    def __init__(self, cfg, topology=None, restart=None, faults=None):
        self.cfg, self.restart, self.faults = cfg, restart, faults
        self.mode = SimpleNamespace(trains=True)
        self.checkpoint_root = "root"
        self.state = {"step": 5}
        self.lines = []
        FakeRunner.attempts.append(self)

    def log(self, line):
        self.lines.append(line)

    def run(self):
        outcome = FakeRunner.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def _cfg(per_hour=3, resume_dir=None):
    from embodied_async.config.schema import RunnerConfig, TrainConfig

    return TrainConfig(runner=RunnerConfig(restarts_per_hour=per_hour, resume_dir=resume_dir))


@pytest.fixture
def fake_runs(monkeypatch):
    FakeRunner.attempts = []
    monkeypatch.setattr(healing, "Runner", FakeRunner)
    monkeypatch.setattr(healing.run_folder, "latest_checkpoint", lambda root: "ckpt/global_step_4")
    monkeypatch.setattr(healing.run_folder, "read_runner_state", lambda path: {"step": 4 if path else 0})
    return FakeRunner


def test_a_dead_or_hung_worker_restarts_the_run_from_its_last_checkpoint(fake_runs):
    fake_runs.outcomes = [WorkerDied("env[0].run failed: the env process died"),
                          WorkerHung("rollout[0] hung: busy in its 'rollout' section for 70 s"), {"step": 8}]
    assert healing.run_healing(_cfg()) == {"step": 8}
    first, second, third = fake_runs.attempts
    assert first.cfg.runner.resume_dir is None and first.restart is None
    assert second.cfg.runner.resume_dir == third.cfg.runner.resume_dir == "ckpt/global_step_4"
    record = third.restart
    assert record["step"] == 4 and record["heal/restarts"] == 2 and record["heal/lost_steps"] == 1
    assert first.faults is second.faults and len(first.faults.seen) == 2  # one budget over the attempts
    assert record["heal/hung"] == 1 and "rollout[0] hung" in record["heal/fault"]
    assert "restarting every worker from its last checkpoint ckpt/global_step_4" in first.lines[0]


def test_faults_an_attempt_healed_in_place_count_in_the_budget(fake_runs, monkeypatch):
    """An env worker replaced in place counts in the run's budget (the runner admits it): a later
    fault that restarts the run may then be past it, and the error names both."""
    class ReplacedOnce(FakeRunner):
        def run(self):
            self.faults.admit(WorkerDied("env[1].run failed: the env process died"))
            return super().run()

    monkeypatch.setattr(healing, "Runner", ReplacedOnce)
    fake_runs.outcomes = [WorkerDied("actor[0].train_step failed: the actor process died")]
    with pytest.raises(FaultsPastBudget, match=r"\(1\) env\[1\].*; \(2\) actor\[0\]"):
        healing.run_healing(_cfg(per_hour=1))
    monkeypatch.setattr(healing, "Runner", FakeRunner)
    fake_runs.outcomes = [{"step": 8}]
    assert healing.run_healing(_cfg(per_hour=0)) == {"step": 8}
    assert fake_runs.attempts[-1].faults is None  # healing off: not even in place


def test_past_the_budget_the_run_stops_naming_every_fault(fake_runs):
    fake_runs.outcomes = [WorkerDied("env[0] died"), WorkerDied("env[1] died")]
    with pytest.raises(FaultsPastBudget, match=r"2 faults within an hour, past runner.restarts_per_hour=1: stopping\. "
                                         r"The faults: \(1\) env\[0\] died; \(2\) env\[1\] died"):
        healing.run_healing(_cfg(per_hour=1))


def test_a_workers_own_error_and_a_budget_of_zero_are_never_healed(fake_runs):
    fake_runs.outcomes = [WorkerFailed("env[0].run failed: ValueError: a bug")]
    with pytest.raises(WorkerFailed, match="a bug") as raised:
        healing.run_healing(_cfg())
    assert type(raised.value) is WorkerFailed and len(fake_runs.attempts) == 1
    fake_runs.outcomes = [WorkerDied("env[0] died")]
    with pytest.raises(WorkerDied, match=r"^env\[0\] died$"):
        healing.run_healing(_cfg(per_hour=0))
    # a bug after a healed fault names the fault too
    fake_runs.outcomes = [WorkerDied("env[0] died"), WorkerFailed("rollout[0].run failed: a bug")]
    with pytest.raises(WorkerFailed, match=r"a bug; faults healed before it: \(1\) env\[0\] died"):
        healing.run_healing(_cfg())


class Beating:
    """A worker whose heartbeat is ``busy`` (or that never answers: ``None`` as a future never done)."""

    def heartbeat(self):
        return None


def _group(name, beats):
    def call(method):
        assert method == "heartbeat"
        pending = []
        for rank, beat in enumerate(beats):
            future = concurrent.futures.Future()
            if beat != "silent":
                future.set_result(beat)
            pending.append(Pending(future, f"{name}[{rank}].heartbeat"))
        return pending

    return SimpleNamespace(name=name, cls=Beating, call=call)


def test_a_worker_busy_past_the_timeout_or_silent_is_hung_and_a_waiting_one_is_not():
    graph = SimpleNamespace(looping=lambda: [_group("env", [None, ("env", 2.0)]), _group("rollout", [None])], groups={})
    check_hangs(graph, timeout=5)  # busy for less than the timeout, or waiting: nothing hung
    graph = SimpleNamespace(looping=lambda: [_group("env", [None, ("env", 7.5)])], groups={})
    with pytest.raises(WorkerHung, match=r"env\[1\] hung: busy in its 'env' section for 8 s, more than "
                                         r"runner.hang_timeout_s=5"):
        check_hangs(graph, timeout=5)
    graph = SimpleNamespace(looping=lambda: [_group("rollout", ["silent"])], groups={})
    started = time.monotonic()
    with pytest.raises(WorkerHung, match=r"rollout\[0\].heartbeat hung: it did not answer for 1 s"):
        check_hangs(graph, timeout=1)
    assert time.monotonic() - started < 3


def test_the_actor_is_hung_when_silent_or_updating_past_its_bound_and_never_while_it_waits():
    def graph(beats):
        return SimpleNamespace(looping=lambda: [_group("env", [None])], groups={"actor": None},
                               actor=_group("actor", beats))

    bound = BusyLimit(120.0, "runner.update_hang_factor=10 x its longest update so far (12.0 s)")
    check_hangs(graph([None, ("update", 119.0)]), timeout=5, update_limit=bound)  # waiting, or inside its bound
    check_hangs(graph([("update", 5000.0)]), timeout=5)  # the first update: no bound yet
    with pytest.raises(WorkerHung, match=r"actor\[1\] hung: busy in its 'update' section for 121 s, more than "
                                         r"runner.update_hang_factor=10 x its longest update so far \(12.0 s\)"):
        check_hangs(graph([None, ("update", 121.0)]), timeout=5, update_limit=bound)
    with pytest.raises(WorkerHung, match=r"actor\[0\].heartbeat hung: it did not answer for 1 s"):
        check_hangs(graph(["silent"]), timeout=1)


def test_the_update_bound_follows_the_longest_update_and_is_never_below_the_hang_timeout():
    from embodied_async.runner.loop import Runner

    def limit(longest, factor=10.0, timeout=60.0):
        runner = SimpleNamespace(cfg=SimpleNamespace(runner=SimpleNamespace(update_hang_factor=factor,
                                                                            hang_timeout_s=timeout)),
                                 longest_update_s=longest)
        return Runner._update_limit(runner)

    assert limit(0.0) is None  # no update finished yet
    assert limit(12.0).seconds == 120.0 and "longest update so far (12.0 s)" in limit(12.0).setting
    assert limit(0.5).seconds == 60.0  # fast updates: the hang timeout
    assert limit(12.0, factor=0) is None  # never


def test_only_env_and_rollout_workers_of_a_healing_run_are_replaced_in_place(monkeypatch):
    """What replacement.replace_in_place leaves to a restart from the checkpoint (False, nothing
    counted): the actor, a rollout worker while several actor ranks hold parts of its trajectories,
    a worker whose node does not answer, a run in one process, a run that does not heal."""
    from embodied_async.runner import replacement

    answering = {"node-a"}
    monkeypatch.setattr(replacement, "responsive", lambda nodes: answering & set(nodes))

    def runner(backend="ray", actor_ranks=1, faults=True, num_nodes=1):
        cfg = SimpleNamespace(cluster=SimpleNamespace(backend=backend, num_nodes=num_nodes),
                              runner=SimpleNamespace(restarts_per_hour=3))
        nodes = SimpleNamespace(nodes=["node-a", "node-b"])
        graph = SimpleNamespace(env=object(), rollout=object(), groups={"env": nodes, "rollout": nodes})
        return SimpleNamespace(cfg=cfg, graph=graph, faults=Faults(3) if faults else None, log=lambda line: None,
                               topology=SimpleNamespace(actor_world_size=actor_ranks))

    for made, fault in [(runner(), WorkerDied("actor[0] died", ("actor", 0))),
                        (runner(actor_ranks=2), WorkerDied("rollout[0] died", ("rollout", 0))),
                        (runner(num_nodes=2), WorkerDied("env[1] died", ("env", 1))),  # on node-b, lost
                        (runner(backend="local"), WorkerHung("env[0] hung", ("env", 0))),
                        (runner(faults=False), WorkerDied("env[0] died", ("env", 0))),
                        (runner(), WorkerDied("a fault naming no worker"))]:
        assert replacement.replace_in_place(made, fault) is False
        assert made.faults is None or made.faults.seen == []
    past = runner()
    past.faults = Faults(0)
    with pytest.raises(FaultsPastBudget):  # counted first: past the budget nothing is replaced
        replacement.replace_in_place(past, WorkerDied("env[1] died", ("env", 1)))


def test_a_hand_over_returns_what_the_loop_dropped_once_the_loop_took_it_in():
    from embodied_async.workers.base import HandOver

    hand_over, answers = HandOver(), []
    asking = threading.Thread(target=lambda: answers.append(hand_over.ask(3, 2, 5.0, "env worker 3's replacement")))
    asking.start()
    deadline = time.monotonic() + 5
    while not hand_over and time.monotonic() < deadline:
        time.sleep(0.01)
    for key, generation, dropped in hand_over.take():  # the loop, between its steps
        assert (key, generation) == (3, 2) and asking.is_alive()  # answered only once taken in
        dropped.update(decisions=4.0)
    asking.join(timeout=5)
    assert answers == [{"decisions": 4.0}] and not hand_over
    with pytest.raises(TimeoutError, match="env worker 1's replacement: its loop did not take it in within 0 s"):
        HandOver().ask(1, 1, 0.05, "env worker 1's replacement")
