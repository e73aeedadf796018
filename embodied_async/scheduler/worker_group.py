"""Worker groups: one worker per placed device id, as a Ray actor (own process) or in-process.

Both forms expose the same calls, so the runner wires one graph that runs on a Ray cluster or,
for tests and debugging, entirely inside one process (each worker on its own threads).
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence


class WorkerFailed(RuntimeError):
    """A long-lived worker loop ended with an error (or ended when it should not have)."""


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
    """Start Ray here, or attach to a running cluster (RAY_ADDRESS set, or several nodes)."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or ("auto" if num_nodes > 1 else None)
    kwargs: Dict[str, Any] = dict(include_dashboard=False, log_to_driver=True, configure_logging=False)
    if address is None:
        kwargs["num_cpus"] = max(os.cpu_count() or 1, 4)
        # Ray keeps an event record of every call in its GCS daemon, up to 100k by default: over a
        # long run that grew it by ~250 MB (scripts/soak.py). Our actors opt out of the records
        # (enable_task_events=False); the bound covers whatever else records them.
        kwargs["_system_config"] = {"task_events_max_num_task_in_gcs": 1000}
    ray.init(address=address, **kwargs)
    # Ray swaps the driver's SIGINT handler for its own, which swallows Ctrl-C while we wait on
    # workers; restore Python's so Ctrl-C raises KeyboardInterrupt and the runner can save.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def gpu_slots() -> List[tuple]:
    """Every GPU of the Ray cluster as ``(node_id, local_gpu_index)``, counted node by node.

    Placement ids count across nodes in this order (the head node first), so ``actor: 0-15`` on
    two 8-GPU nodes means all GPUs of both.
    """
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("GPU", 0) > 0]
    nodes.sort(key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"]))
    return [(n["NodeID"], i) for n in nodes for i in range(int(n["Resources"]["GPU"]))]


def _gpu_actor_options(device_id: int, slots: List[tuple]) -> Dict[str, Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if device_id >= len(slots):
        raise ValueError(f"cluster.component_placement names GPU {device_id}, but the Ray cluster has "
                         f"{len(slots)} GPUs; start more nodes or change the placement")
    node_id, _ = slots[device_id]
    # we pin CUDA_VISIBLE_DEVICES ourselves from the placement id, so Ray must not touch it
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
            "runtime_env": {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}}


class WorkerGroup:
    """One instance of ``cls`` per device id the topology gives component ``name``;
    ``kwargs_for(rank)`` gives each one's arguments (``device_id`` is added)."""

    def __init__(self, name: str, cls: type, topology, backend: str, kwargs_for: Callable[[int], Dict[str, Any]]):
        self.name, self.backend = name, backend
        self.device_ids = topology.ids(name)
        device_kind = topology.device_kind
        self.workers: List[Any] = []
        self._pools: List[concurrent.futures.ThreadPoolExecutor] = []
        slots = gpu_slots() if backend == "ray" and device_kind == "gpu" else []
        for rank, device_id in enumerate(self.device_ids):
            # on GPUs the worker sees its node-local index; on CPUs the id is just a process slot
            local_id = slots[device_id][1] if slots and device_id < len(slots) else device_id
            kwargs = dict(kwargs_for(rank), device_id=local_id)
            if backend == "ray":
                import ray

                remote_cls = ray.remote(num_cpus=0, max_concurrency=8, enable_task_events=False)(cls)
                options = _gpu_actor_options(device_id, slots) if device_kind == "gpu" else {}
                self.workers.append(remote_cls.options(**options).remote(**kwargs))
            else:
                self._pools.append(concurrent.futures.ThreadPoolExecutor(max_workers=4,
                                                                         thread_name_prefix=f"{name}{rank}"))
                self.workers.append(cls(**kwargs))

    def __len__(self) -> int:
        return len(self.workers)

    def call_rank(self, rank: int, method: str, *args, **kwargs) -> Pending:
        worker, label = self.workers[rank], f"{self.name}[{rank}].{method}"
        if self.backend == "ray":
            return Pending(getattr(worker, method).remote(*args, **kwargs), label)
        return Pending(self._pools[rank].submit(getattr(worker, method), *args, **kwargs), label)

    def call(self, method: str, *args, **kwargs) -> List[Pending]:
        return [self.call_rank(rank, method, *args, **kwargs) for rank in range(len(self.workers))]

    def shutdown(self, timeout: float = 5.0) -> None:
        if self.backend == "ray":
            import ray

            for worker in self.workers:
                try:
                    ray.kill(worker)
                except Exception:  # already gone
                    pass
        else:
            for pool in self._pools:
                pool.shutdown(wait=False, cancel_futures=True)


def _result_naming_worker(pending: Pending) -> Any:
    """The call's result; a worker that died during the call is named in the error."""
    try:
        return pending.result()
    except Exception as err:
        if type(err).__name__ in ("RayActorError", "ActorDiedError", "ActorUnavailableError"):
            raise WorkerFailed(f"{pending.label} failed: the {pending.label.split('.')[0]} process died "
                               f"({str(err).splitlines()[0]})") from err
        raise


def wait_all(pending: List[Pending], watch: Sequence[Pending] = (), timeout: Optional[float] = None,
             poll: float = 0.05) -> List[Any]:
    """Results of ``pending``; raises ``WorkerFailed`` as soon as a watched loop ends first.

    Watched calls are the long-lived worker loops: if one ends (with an error, or at all) while
    we wait, the run can never finish, so we surface that worker's error instead of hanging.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        for loop in watch:
            if loop.done():
                try:
                    loop.result()
                except Exception as err:  # the worker's own error, re-raised with its name
                    raise WorkerFailed(f"{loop.label} failed: {err}") from err
                raise WorkerFailed(f"{loop.label} stopped unexpectedly")
        if all(p.done() for p in pending):
            return [_result_naming_worker(p) for p in pending]
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {[p.label for p in pending if not p.done()]}")
        time.sleep(poll)
