"""Worker groups: one worker per placed device id, as a Ray actor (own process) or in-process.

Both forms expose the same calls, so the runner wires one graph that runs on a Ray cluster or,
for tests and debugging, entirely inside one process (each worker on its own threads).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from embodied_async.private_files import private_ray_token, ray_temp_dir
from embodied_async.signals import Preempted, preempted_during_ray_init, restore_after_ray_init


class WorkerFailed(RuntimeError):
    """A long-lived worker loop ended with an error (or ended when it should not have).
    ``worker``: ``(component, rank)`` of the worker it names, where it names one."""

    def __init__(self, message: str, worker: Optional[Tuple[str, int]] = None):
        super().__init__(message)
        self.worker = worker


def worker_named(label: str) -> Optional[Tuple[str, int]]:
    """``(component, rank)`` of a call's label (``env[1].run``)."""
    found = re.match(r"(\w+)\[(\d+)\]", label)
    return (found.group(1), int(found.group(2))) if found else None


class WorkerDied(WorkerFailed):
    """A worker's process ended under it (SIGKILL, the kernel's OOM killer, a segfault, a lost
    node), or a simulator process it owns did (an error carrying ``process_ended``): a fault of
    the machine, which a run may heal (``runner.restarts_per_hour``), not an error of the code."""


class WorkerHung(WorkerFailed):
    """A worker busy in one section, or silent, for longer than ``runner.hang_timeout_s``."""


class Pending:
    """A call in flight: a Ray ObjectRef or a concurrent Future behind one interface."""

    def __init__(self, handle: Any, label: str):
        self.handle, self.label = handle, label

    def done(self) -> bool:
        if isinstance(self.handle, concurrent.futures.Future):
            return self.handle.done()
        import ray

        ready, _ = ray.wait([self.handle], timeout=0)
        return bool(ready)

    def result(self, timeout: Optional[float] = None) -> Any:
        if isinstance(self.handle, concurrent.futures.Future):
            return self.handle.result(timeout)
        import ray

        return ray.get(self.handle, timeout=timeout)


def init_ray(num_nodes: int) -> None:
    """Start Ray here, or attach to a running cluster (RAY_ADDRESS set, or several nodes).

    A Ray instance started here asks every client for its token (``RAY_AUTH_MODE=token``, Ray's
    default for local instances from 2.59 on; a warning says when it is off; its token file readable
    by this user alone: ``private_files.private_ray_token``) and keeps its session
    (sockets, logs, runtime envs, which Ray makes world-writable) in a folder only this user may
    enter (``private_files.ray_temp_dir``). A cluster we attach to is as safe as it was started:
    without token authentication anyone who reaches its ports runs code as its user (docs/clusters.md,
    "Who can reach a run").
    """
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or ("auto" if num_nodes > 1 else None)
    kwargs: Dict[str, Any] = dict(include_dashboard=False, log_to_driver=True, configure_logging=False)
    if address is None:
        private_ray_token()
        kwargs["_temp_dir"] = ray_temp_dir()
        kwargs["num_cpus"] = max(os.cpu_count() or 1, 4)
        # Ray keeps an event record of every call in its GCS daemon, up to 100k by default: over a
        # long run that grew it by ~250 MB (benchmarks/soak.py). Our actors opt out of the records
        # (enable_task_events=False); the bound covers whatever else records them.
        kwargs["_system_config"] = {"task_events_max_num_task_in_gcs": 1000}
    try:
        ray.init(address=address, **kwargs)
    except SystemExit as err:  # Ray's own SIGTERM handler, before ours are back: the stop it is
        if preempted_during_ray_init(err):
            raise Preempted(signal.SIGTERM) from None
        raise
    auth = os.environ.get("RAY_AUTH_MODE", "").lower()  # Ray sets it when it turns token auth on itself
    if auth != "token":
        where = "the Ray instance this run started" if address is None else f"the Ray cluster at {address}"
        print(f"[runner] warning: RAY_AUTH_MODE is {auth or 'unset'}: {where} does not ask its clients for a token, so "
              "any process that reaches its ports can run code as this user. Start Ray with RAY_AUTH_MODE=token "
              "(docs/clusters.md, 'Who can reach a run')", file=sys.stderr, flush=True)
    restore_after_ray_init()


def alive_nodes(resource: str) -> List[dict]:
    """The nodes Ray counts as alive that have ``resource``, in the order placement ids count
    them (the head node first)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get(resource, 0) > 0]
    nodes.sort(key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"], n["NodeID"]))
    return nodes


def gpu_slots() -> List[tuple]:
    """Every GPU of the Ray cluster as ``(node_id, local_gpu_index)``, counted node by node.

    Placement ids count across nodes in this order (the head node first), so ``actor: 0-15`` on
    two 8-GPU nodes means all GPUs of both.
    """
    return [(n["NodeID"], i) for n in alive_nodes("GPU") for i in range(int(n["Resources"]["GPU"]))]


def cpu_slots() -> List[tuple]:
    """Every CPU of the Ray cluster as ``(node_id, local index)``, counted node by node like
    ``gpu_slots``: with ``cluster.num_nodes > 1`` CPU placement ids are these slots."""
    return [(n["NodeID"], i) for n in alive_nodes("CPU") for i in range(int(n["Resources"]["CPU"]))]


def worker_slots(device_kind: str, device_ids: Sequence[int], num_nodes: int) -> List[tuple]:
    """``(node_id, local id)`` of each placement id: the Ray node a worker is pinned to and the
    id it sees there (its GPU index; on CPUs a process slot).

    GPU ids and, on several nodes, CPU ids count across the cluster's nodes, head first. On one
    node every CPU worker runs on this (the driver's) node, whatever else the cluster holds, so
    the env and rollout workers can always talk directly (``scheduler.direct_channel``).
    """
    import ray

    if device_kind == "cpu" and num_nodes <= 1:
        here = ray.get_runtime_context().get_node_id()
        return [(here, device_id) for device_id in device_ids]
    slots = gpu_slots() if device_kind == "gpu" else cpu_slots()
    kind = "GPU" if device_kind == "gpu" else "CPU"
    for device_id in device_ids:
        if device_id >= len(slots):
            raise ValueError(f"cluster.component_placement names {kind} {device_id}, but the Ray cluster has "
                             f"{len(slots)} {kind}s; start more nodes or change the placement")
    return [slots[device_id] for device_id in device_ids]


def _actor_options(device_kind: str, node_id: str) -> Dict[str, Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options: Dict[str, Any] = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
    if device_kind == "gpu":  # we pin CUDA_VISIBLE_DEVICES ourselves from the placement id
        options["runtime_env"] = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    return options


class WorkerGroup:
    """One instance of ``cls`` per device id the topology gives component ``name``;
    ``kwargs_for(rank)`` gives each one's arguments (``device_id`` is added). Under Ray each
    worker is pinned to the node of its placement id (``worker_slots``, or the ``slots`` given)."""

    def __init__(self, name: str, cls: type, topology, backend: str, kwargs_for: Callable[[int], Dict[str, Any]],
                 num_nodes: int = 1, slots: Optional[List[tuple]] = None):
        self.name, self.backend, self.cls = name, backend, cls
        self.device_ids = topology.ids(name)
        device_kind = self.device_kind = topology.device_kind
        self.kwargs_for = kwargs_for
        self.workers: List[Any] = []
        self._pools: List[concurrent.futures.ThreadPoolExecutor] = []
        self.nodes: List[Optional[str]] = [None] * len(self.device_ids)
        if backend == "ray":
            import ray

            self.slots = slots if slots is not None else worker_slots(device_kind, self.device_ids, num_nodes)
            self.nodes = [node for node, _ in self.slots]
            self.remote_cls = ray.remote(num_cpus=0, max_concurrency=8, enable_task_events=False)(cls)
            self._process_ids: Dict[int, Any] = {}  # rank -> the pending (node, pid) of its process
            self.workers = [self._start_process(rank) for rank in range(len(self.slots))]
        else:
            for rank, device_id in enumerate(self.device_ids):
                self._pools.append(concurrent.futures.ThreadPoolExecutor(max_workers=4,
                                                                         thread_name_prefix=f"{name}{rank}"))
                self.workers.append(cls(**dict(kwargs_for(rank), device_id=device_id)))

    def _start_process(self, rank: int, **extra_kwargs) -> Any:
        node, local_id = self.slots[rank]
        kwargs = dict(self.kwargs_for(rank), **extra_kwargs, device_id=local_id)
        worker = self.remote_cls.options(**_actor_options(self.device_kind, node)).remote(**kwargs)
        # asked now, answered once it is built: a process that hangs later can still be killed
        self._process_ids[rank] = worker.__ray_call__.remote(_process_id)
        return worker

    def _kill_process(self, rank: int) -> None:
        """Ray's kill asks the process to exit, which a stopped (SIGSTOP, wedged) one never does,
        holding its memory until the run ends: on this node it is also SIGKILLed by its pid."""
        import ray

        try:
            ray.kill(self.workers[rank], no_restart=True)
        except Exception:  # already gone
            pass
        ready, _ = ray.wait([self._process_ids[rank]], timeout=0)
        try:
            node, pid = ray.get(ready[0]) if ready else (None, None)
            if node == ray.get_runtime_context().get_node_id() and _is_ray_worker(pid):
                os.kill(pid, signal.SIGKILL)
        except Exception:  # never built, gone already, or not ours to signal
            pass

    def replace(self, rank: int, **extra_kwargs) -> None:
        """Kill worker ``rank``'s process (dead already, or hung) and start a new one in its place,
        on the same slot, with its arguments and ``extra_kwargs``. Ray only: in one process no
        worker dies on its own."""
        if self.backend != "ray":
            raise RuntimeError(f"{self.name}[{rank}]: only a worker process (cluster.backend=ray) can be replaced")
        self._kill_process(rank)
        self.workers[rank] = self._start_process(rank, **extra_kwargs)

    def __len__(self) -> int:
        return len(self.workers)

    def placed_nodes(self) -> List[Optional[str]]:
        """The Ray node each worker process runs on, as the worker itself reports it (None in
        process): checks that placement pinned it where ``nodes`` says."""
        if self.backend != "ray":
            return [None] * len(self.workers)
        import ray

        def node_of(_instance):
            return ray.get_runtime_context().get_node_id()

        return ray.get([worker.__ray_call__.remote(node_of) for worker in self.workers])

    def call_rank(self, rank: int, method: str, *args, **kwargs) -> Pending:
        worker, label = self.workers[rank], f"{self.name}[{rank}].{method}"
        if self.backend == "ray":
            return Pending(getattr(worker, method).remote(*args, **kwargs), label)
        return Pending(self._pools[rank].submit(getattr(worker, method), *args, **kwargs), label)

    def call(self, method: str, *args, **kwargs) -> List[Pending]:
        return [self.call_rank(rank, method, *args, **kwargs) for rank in range(len(self.workers))]

    def shutdown(self, timeout: float = 5.0) -> None:
        if self.backend == "ray":
            for rank in range(len(self.workers)):
                self._kill_process(rank)
        else:
            for pool in self._pools:
                pool.shutdown(wait=False, cancel_futures=True)


def _process_id(_instance) -> Tuple[str, int]:
    import ray

    return ray.get_runtime_context().get_node_id(), os.getpid()


def _is_ray_worker(pid: int) -> bool:
    """Still a Ray worker process (a pid of a process that ended may have been given to another)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().startswith(b"ray::")


def _result_naming_worker(pending: Pending) -> Any:
    """The call's result; a worker that died during the call is named in the error."""
    try:
        return pending.result()
    except Exception as err:
        if type(err).__name__ in _DIED:
            raise _process_died(pending.label, err) from err
        raise


def wait_all(pending: List[Pending], watch: Sequence[Pending] = (), timeout: Optional[float] = None,
             poll: float = 0.05) -> List[Any]:
    """Results of ``pending``; raises ``WorkerFailed`` as soon as a watched loop ends first.

    Watched calls are the long-lived worker loops: if one ends (with an error, or at all) while
    we wait, the run can never finish, so we surface that worker's error instead of hanging.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if any(loop.done() for loop in watch):
            _raise_for_ended_loop(watch, pending)
        if all(p.done() for p in pending):
            return [_result_naming_worker(p) for p in pending]
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {[p.label for p in pending if not p.done()]}")
        _sleep_until_one_is_done([p for p in pending if not p.done()] + list(watch), poll)


def wait_answers(pending: List[Pending], watch: Sequence[Pending] = (), timeout: float = 0.0) -> List[Any]:
    """``wait_all`` for calls a live worker answers at once (its metrics, its heartbeat): one not
    answered within ``timeout`` seconds (``runner.hang_timeout_s``; 0: wait for ever) is a
    ``WorkerHung`` naming it."""
    if not timeout:
        return wait_all(pending, watch=watch)
    try:
        return wait_all(pending, watch=watch, timeout=timeout)
    except TimeoutError:
        silent = [call.label for call in pending if not call.done()]
        raise WorkerHung(f"{silent[0]} hung: it did not answer for {timeout:.0f} s (runner.hang_timeout_s): a "
                         "stopped or wedged process", worker_named(silent[0])) from None


_DIED = ("RayActorError", "ActorDiedError", "ActorUnavailableError")
CAUSE_GRACE_S = 3.0  # how long a loop that ended waits for the failure that may have caused it


def _raise_for_ended_loop(watch: Sequence[Pending], pending: Sequence[Pending] = ()) -> None:
    """Name the root cause: a worker whose process died ends its peers' loops as well (a direct
    channel sees the closed socket at once, before Ray reports the death), so a loop that ended
    first gives the others a moment, and a death is reported before the loops it ended."""
    grace_end = time.monotonic() + CAUSE_GRACE_S
    calls = [*watch, *pending]  # pending: e.g. the actor's update, whose process may be the one that died
    while time.monotonic() < grace_end and not all(loop.done() for loop in watch):
        _sleep_until_one_is_done([call for call in calls if not call.done()], 0.1)
        if any(_died(call) for call in calls if call.done()):
            break
    died = [call for call in calls if call.done() and _died(call)]
    call = (died or [loop for loop in watch if loop.done()])[0]
    try:
        call.result()
    except Exception as err:  # the worker's own error, re-raised with its name
        if died:
            raise _process_died(call.label, err) from err
        ended = getattr(getattr(err, "cause", err), "process_ended", False)
        raise (WorkerDied if ended else WorkerFailed)(f"{call.label} failed: {_worker_error_text(err)}",
                                                      worker_named(call.label)) from err
    raise WorkerFailed(f"{call.label} stopped unexpectedly", worker_named(call.label))


def _process_died(label: str, err: Exception) -> WorkerDied:
    """The error of call ``label`` whose worker's process ended under it (Ray's ``err``)."""
    return WorkerDied(f"{label} failed: the {label.split('[')[0]} process died ({str(err).splitlines()[0]})",
                      worker_named(label))


def _worker_error_text(err: Exception) -> str:
    """Ray's text of a worker's error is the worker's traceback; an error whose message is the
    whole report (its class sets ``reported_in_full``, e.g. the env worker's non-finite value) is
    read without it, in one line."""
    cause = getattr(err, "cause", err)  # a RayTaskError carries the worker's own exception
    return str(cause) if getattr(cause, "reported_in_full", False) else str(err)


def _died(loop: Pending) -> bool:
    try:
        loop.result(timeout=0)
    except Exception as err:
        return type(err).__name__ in _DIED
    return False


def _sleep_until_one_is_done(calls: List[Pending], poll: float) -> None:
    """Sleep up to ``poll`` seconds, waking as soon as one of ``calls`` finishes (Ray calls;
    in-process calls are looked at again after ``poll``)."""
    refs = [c.handle for c in calls if not isinstance(c.handle, concurrent.futures.Future)]
    if refs and len(refs) == len(calls):
        import ray

        ray.wait(refs, num_returns=1, timeout=poll)
    else:
        time.sleep(poll)
