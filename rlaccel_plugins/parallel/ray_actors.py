"""Scale-out on Ray: rollout actors across machines feeding one learner.

Each of ``num_actors`` Ray actors runs a *worker* built by the framework adapter on that actor
(a vectorised env plus a copy of the policy) and returns chunks of ``chunk_steps`` vector steps.
The learner owns the replay buffer and the updates; :class:`RayActorPool` keeps the actors busy:

* **Back-pressure**: at most ``max_in_flight`` chunk requests per actor; a new one is sent only when
  the learner has taken a chunk of that actor, so a slow learner never piles up memory.
* **Weights** go through Ray's object store once per :meth:`RayActorPool.broadcast` (one ``ray.put``,
  every actor reads the same object); a chunk carries the policy version it acted with, so the
  learner can report the policy lag in updates.
* **Order**: by default the learner takes whichever chunks are ready, so which weights a chunk was
  collected with and the order chunks are stored in depend on timing. ``ordered=True`` takes one chunk
  at a time from the actors in turn (actor 0, 1, ..., 0, ...): every request, weight broadcast and store
  then happens at the same point of the learner's program in every run, so a seeded run is reproducible
  (without faults), at the price of waiting for a slow actor while another has a chunk ready.
* **Faults**: actors are created with ``max_restarts=-1``. Every chunk an actor process (an
  *incarnation*) makes is received exactly once or counted in ``lost_chunks``: a gap in an
  incarnation's sequence numbers is counted when its next chunk arrives (exact), and when a restarted
  actor's first chunk shows its old incarnation died, the requests that were in flight to the old one
  are counted (at most that many chunks were made and never delivered). A request can fail while the
  actor lives on (Ray's ``ActorUnavailableError``: unreachable for a while), so a restart is counted
  only when a new incarnation delivers. After its requests fail, an actor is asked again with a
  growing pause (the restart takes a moment), and given up after ``max_consecutive_failures`` rounds.
  Every chunk the learner received was delivered whole, and none twice.

The worker interface an adapter implements (built on the actor by ``make_worker(index)``)::

    worker.load_weights(weights)                 # the learner's newest policy weights
    worker.collect(params) -> (payload, steps)   # one chunk; params e.g. {"epsilon": 0.05}

Example (not run as a doctest: it starts Ray actors)::

    pool = RayActorPool(make_worker, num_actors=2); pool.start(weights, {"epsilon": 1.0})
    for chunk in pool.receive(): store(chunk.payload) ...; pool.broadcast(new_weights, version)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlaccel_plugins.errors import ConfigError, invalid
from rlaccel_plugins.parallel.learner import Learner

log = logging.getLogger("rlaccel")

INSTALL_HINT = "Fix: pip install 'rlaccel-plugins[ray]' (or pip install ray)."


def require_ray():
    """``import ray``, or a clear error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed. {INSTALL_HINT}") from None
    return ray


def connect(address: str | None = None, **init_kwargs: Any):
    """Join the Ray cluster at ``address`` (``auto``: the one ``ray start`` runs on this machine;
    ``HOST:PORT``: a head node; None: a local single-node Ray started for this run)."""
    import signal

    ray = require_ray()
    if not ray.is_initialized():
        # ray.init installs its own fatal-signal handlers in this process; a SIGTERM must still reach
        # rlaccel's handler (checkpoint, then stop), so the Python-level handlers are put back
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     ignore_reinit_error=True, **init_kwargs)
        except ConnectionError as exc:
            raise ConfigError(f"could not reach a Ray cluster at ray_address={address!r}: {exc}. Fix: start one "
                              "with `ray start --head` (then --ray-address auto), or give the head node's "
                              "HOST:PORT.") from None
        finally:
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
    return ray


def weightless_copy(module: Any) -> Any:
    """A copy of a torch module with its tensors on the ``meta`` device (no data): what the actors are
    built from, kept small so Ray passes it inline. The actor calls ``module.to_empty(device="cpu")``;
    the weights arrive by :meth:`RayActorPool.broadcast` before its first chunk."""
    import copy

    optimizer = getattr(module, "optimizer", None)  # SB3 policies carry their optimizer: not for acting
    if optimizer is not None:
        module.optimizer = None
    try:
        return copy.deepcopy(module).to("meta")
    finally:
        if optimizer is not None:
            module.optimizer = optimizer


def ray_settings(address: str | None = None, actors: int = 2, chunk_steps: int = 16,
                 max_in_flight: int = 2, ordered: bool = False) -> dict[str, Any]:
    """Checked settings of a Ray-fed run (``TrainSpec.ray``).

    Examples:
        >>> ray_settings(actors=4)["actors"]
        4
    """
    for name, value in (("actors", actors), ("chunk_steps", chunk_steps), ("max_in_flight", max_in_flight)):
        _check_positive(name, value)
    if address is not None and (not isinstance(address, str) or (address != "auto" and ":" not in address)):
        raise ConfigError(f"ray_address must be 'auto' or HOST:PORT, got ray_address={address!r}. "
                          "Fix: --ray-address auto (after `ray start --head` here) or --ray-address 10.0.0.1:6379")
    if not isinstance(ordered, bool):
        raise invalid("ordered", "be true or false", ordered, "Fix: --ray-ordered (reproducible) or leave it out")
    return {"address": address, "actors": actors, "chunk_steps": chunk_steps, "max_in_flight": max_in_flight,
            "ordered": ordered}


def _check_positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise invalid(name, "be a positive integer", value, f"Fix: e.g. --{name.replace('_', '-')} 2")


def cpu_weights(module: Any) -> dict:
    """A CPU copy of ``module``'s ``state_dict``: what is broadcast to the actors."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


@dataclass
class Chunk:
    """One chunk of experience as the learner receives it."""

    actor: int                 # actor index
    incarnation: str           # host:pid of the actor process that produced it (changes on restart)
    seq: int                   # chunk number within that incarnation
    version: int               # policy version (learner updates) the actor acted with
    steps: int                 # transitions in the chunk (vector steps x envs)
    payload: Any               # the adapter's data
    collect_seconds: float     # time the actor spent producing it
    latency: float = 0.0       # seconds from the actor finishing it to the learner receiving it
    finished_at: float = 0.0
    node: str = ""             # the Ray node the actor runs on


class RolloutActor:
    """The Ray actor around a worker (made a Ray actor class by :class:`RayActorPool`)."""

    def __init__(self, make_worker: Callable[[int], Any], index: int) -> None:
        import ray

        self.index = index
        self.incarnation = f"{socket.gethostname()}:{os.getpid()}"
        self.node = ray.get_runtime_context().get_node_id()
        self.worker = make_worker(index)
        self.version = -1
        self.seq = 0

    def load_weights(self, weights: Any, version: int) -> None:
        self.worker.load_weights(weights)
        self.version = version

    def collect(self, params: dict[str, Any]) -> Chunk:
        start = time.perf_counter()
        payload, steps = self.worker.collect(params)
        chunk = Chunk(self.index, self.incarnation, self.seq, self.version, steps, payload,
                      time.perf_counter() - start, finished_at=time.time(), node=self.node)
        self.seq += 1
        return chunk


@dataclass
class ActorStats:
    chunks: int = 0
    steps: int = 0                  # transitions received (acknowledged)
    collect_seconds: float = 0.0
    lost_chunks: int = 0            # made and never delivered (sequence gaps; in flight when an incarnation died)
    restarts: int = 0               # new incarnations that delivered a chunk
    latency_sum: float = 0.0
    incarnations: set[str] = field(default_factory=set)

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.collect_seconds if self.collect_seconds else 0.0


@dataclass
class RayRun:
    """What a Ray-fed training run did: transitions received (acknowledged) and stored, metrics."""

    received_steps: int = 0       # transitions in every chunk the learner received
    stored_steps: int = 0         # of those, stored (the rest arrived after the budget was spent)
    chunks: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    def received(self, chunk: Chunk) -> None:
        self.chunks += 1
        self.received_steps += chunk.steps

    def measure(self, pool: RayActorPool, learner_version: int, recent: list[Chunk] | None = None,
                every: int = 1) -> bool:
        """Refresh :attr:`metrics` from ``pool`` (every ``every`` chunks, or always when ``recent`` is
        None); whether they were refreshed."""
        if recent is not None and self.chunks % every >= len(recent):
            return False
        lag = self.metrics.get("ray/policy_lag")
        self.metrics = {**pool.metrics(learner_version, recent), "ray/stored_steps": self.stored_steps}
        self.metrics.setdefault("ray/policy_lag", lag if lag is not None else 0.0)
        return True


class RayActorPool:
    """``num_actors`` rollout actors with bounded requests in flight, weight broadcast and restarts.

    Actors are named ``rlaccel-rollout-<pool>-<index>`` (:attr:`actor_names`), so the Ray dashboard,
    ``ray.util.list_named_actors()`` and ``ray.get_actor`` find them.
    """

    def __init__(self, make_worker: Callable[[int], Any], num_actors: int, *, max_in_flight: int = 2,
                 num_cpus: float = 1.0, max_consecutive_failures: int = 10, ordered: bool = False) -> None:
        _check_positive("actors", num_actors)
        _check_positive("max_in_flight", max_in_flight)
        self.ray = require_ray()
        self.make_worker, self.num_actors, self.max_in_flight = make_worker, num_actors, max_in_flight
        self.num_cpus, self.max_consecutive_failures = num_cpus, max_consecutive_failures
        self.ordered, self._turn = ordered, 0  # ordered: the actor whose chunk is taken next
        self.actors: list[Any] = []
        self.stats = [ActorStats() for _ in range(num_actors)]
        self._in_flight: dict[Any, int] = {}  # ObjectRef -> actor index
        self._failures = [0] * num_actors
        self._next_seq: dict[str, int] = {}  # incarnation -> the sequence number of its next chunk
        self._incarnation: list[str | None] = [None] * num_actors  # the one that delivered last
        # requests out when an actor's requests began to fail since its last chunk (0: none failed)
        self._in_flight_at_failure = [0] * num_actors
        self._retry_at: dict[int, float] = {}  # actor -> when to ask it again (monotonic seconds)
        self._weights_ref = None
        self._version = 0
        self.params: dict[str, Any] = {}
        pool = f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self.actor_names = [f"rlaccel-rollout-{pool}-{i}" for i in range(num_actors)]

    # ------------------------------------------------------------------ lifecycle
    def start(self, weights: Any, params: dict[str, Any] | None = None, version: int = 0) -> None:
        """Create the actors, send them ``weights`` and ask each for ``max_in_flight`` chunks."""
        remote = self.ray.remote(num_cpus=self.num_cpus, max_restarts=-1, max_task_retries=0)(RolloutActor)
        self.actors = [remote.options(name=name).remote(self.make_worker, i)
                       for i, name in enumerate(self.actor_names)]
        self.params = dict(params or {})
        self.broadcast(weights, version)
        for i in range(self.num_actors):
            for _ in range(self.max_in_flight):
                self._request(i)

    def stop(self) -> None:
        """Drop the requests in flight and end the actors (their unacknowledged chunks are discarded)."""
        self._in_flight.clear()  # killing an actor fails its pending requests; nobody reads them
        self._retry_at.clear()
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors = []

    # ------------------------------------------------------------------ learner side
    def broadcast(self, weights: Any, version: int) -> None:
        """Make ``weights`` (policy ``version``) the actors' policy for their next chunks."""
        self._weights_ref, self._version = self.ray.put(weights), version
        for actor in self.actors:
            actor.load_weights.remote(self._weights_ref, version)

    def receive(self, timeout: float = 60.0) -> list[Chunk]:
        """The chunks ready now (waits for at least one), each actor's in the order it made them; each
        one taken frees a request slot of its actor, which is refilled at once. Chunks lost with a dead
        actor are counted, not returned. ``ordered``: exactly one chunk, from the actor whose turn it is."""
        deadline = time.monotonic() + timeout
        self._wait_for_requests(deadline)
        if self.ordered:
            return self._receive_in_turn(deadline)
        waiting_on = list(self._in_flight)
        while True:
            ready, _ = self.ray.wait(waiting_on, num_returns=1, timeout=self._wait_time(deadline))
            if not ready:
                if time.monotonic() < deadline:  # an actor's pause ended: ask it again, wait on
                    self._wait_for_requests(deadline)
                    waiting_on = list(self._in_flight)
                    continue
                raise TimeoutError(f"no chunk arrived from {self.num_actors} Ray actors in {timeout:.0f} s")
            ready, waiting_on = self._in_request_order(
                set(self.ray.wait(list(self._in_flight), num_returns=len(self._in_flight), timeout=0)[0]))
            if ready:
                break
        return [chunk for chunk in map(self._take, ready) if chunk is not None]

    def _receive_in_turn(self, deadline: float) -> list[Chunk]:
        while self._in_flight or self._retry_at:
            self._wait_for_requests(deadline)
            oldest = next((ref for ref, index in self._in_flight.items() if index == self._turn), None)
            if oldest is None:
                if self._turn in self._retry_at:  # its turn waits for its pause to end
                    self._wait_for_requests(deadline, until=self._retry_at[self._turn])
                else:  # an actor given up on has no turn
                    self._turn = (self._turn + 1) % self.num_actors
                continue
            if not self.ray.wait([oldest], timeout=max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError(f"no chunk arrived from Ray actor {self._turn} in time")
            chunk = self._take(oldest)
            if chunk is not None:
                self._turn = (self._turn + 1) % self.num_actors
                return [chunk]
        raise self._no_collector()

    def _wait_time(self, deadline: float) -> float:
        """How long to wait for a chunk: until the deadline, or until an actor's pause ends."""
        end = min([deadline, *self._retry_at.values()])
        return max(0.0, end - time.monotonic())

    def _wait_for_requests(self, deadline: float, until: float | None = None) -> None:
        """Ask again the actors whose pause has ended; with nothing in flight, sleep until one does
        (or ``until``); raise when no actor is collecting or will be."""
        while True:
            now = time.monotonic()
            for index in [i for i, at in self._retry_at.items() if at <= now]:
                del self._retry_at[index]
                # calls to one actor run in order: a restarted actor gets the newest weights, then requests
                self.actors[index].load_weights.remote(self._weights_ref, self._version)
                for _ in range(self.max_in_flight):
                    self._request(index)
            if until is not None and now < until:
                time.sleep(max(0.0, min(until, deadline) - now))
                until = None
                continue
            if self._in_flight:
                return
            if not self._retry_at:
                raise self._no_collector()
            if now >= deadline:
                raise TimeoutError("no Ray actor could be asked for a chunk in time")
            time.sleep(max(0.0, min(min(self._retry_at.values()), deadline) - now))

    def _no_collector(self) -> RuntimeError:
        return RuntimeError("no Ray actor is collecting: every actor's requests failed "
                            f"{self.max_consecutive_failures} rounds in a row")

    def _take(self, ref: Any) -> Chunk | None:
        """The chunk of a finished request, counted, its actor asked for another (None: no chunk)."""
        index = self._in_flight.pop(ref)
        try:
            return self._settle(index, self.ray.get(ref))
        except self.ray.exceptions.RayActorError as error:
            return self._settle(index, error=error)

    def _settle(self, index: int, chunk: Chunk | None = None, error: Exception | None = None) -> Chunk | None:
        """Account for one finished request of actor ``index``: its ``chunk``, or the ``error`` it failed with.

        Every chunk an incarnation makes is received once or counted lost. A failed request says only
        that the actor could not answer (Ray reports a dead and a briefly unreachable actor alike); the
        actor's next chunk tells which: from the same incarnation, the gap in its sequence numbers is
        what was lost; from a new one, the old incarnation died with the requests it had in flight. A
        chunk delivered twice is dropped.
        """
        if error is not None:
            self._on_actor_failure(index)
            return None
        assert chunk is not None
        stats = self.stats[index]
        if chunk.incarnation != self._incarnation[index]:
            if self._incarnation[index] is not None:  # a restarted actor's first chunk: the old one died
                stats.restarts += 1
                stats.lost_chunks += self._in_flight_at_failure[index]
            self._incarnation[index] = chunk.incarnation
        self._in_flight_at_failure[index] = 0  # the same one lives on: its gaps are counted exactly
        expected = self._next_seq.get(chunk.incarnation, 0)
        if chunk.seq < expected:  # delivered before: never hand it to the learner twice
            log.warning("rlaccel: dropped a second delivery of chunk %d of Ray actor %d (%s)", chunk.seq, index,
                        chunk.incarnation)
            self._request(index)
            return None
        if chunk.seq > expected:  # made by the actor, never delivered
            stats.lost_chunks += chunk.seq - expected
            log.warning("rlaccel: %d chunk(s) of Ray actor %d (%s) never arrived; counted as lost",
                        chunk.seq - expected, index, chunk.incarnation)
        self._next_seq[chunk.incarnation] = chunk.seq + 1
        self._failures[index] = 0
        chunk.latency = max(0.0, time.time() - chunk.finished_at)
        stats.chunks += 1
        stats.steps += chunk.steps
        stats.collect_seconds += chunk.collect_seconds
        stats.latency_sum += chunk.latency
        stats.incarnations.add(chunk.incarnation)
        self._request(index)
        return chunk

    def _in_request_order(self, done: set) -> tuple[list[Any], list[Any]]:
        """Of the requests in flight, those in ``done`` that no earlier request of the same actor is still
        waiting for (an actor runs its calls in order, but Ray may report a later one done first), and the
        earliest waiting request of each actor that has one."""
        taken, heads, waiting = [], [], set()
        for ref, index in self._in_flight.items():  # insertion order: each actor's requests in order
            if index in waiting:
                continue
            if ref in done:
                taken.append(ref)
            else:
                waiting.add(index)
                heads.append(ref)
        return taken, heads

    def _request(self, index: int) -> None:
        ref = self.actors[index].collect.remote(dict(self.params))
        self._in_flight[ref] = index

    def _on_actor_failure(self, index: int) -> None:
        if not self._in_flight_at_failure[index]:  # its first failure since its last chunk: what was out then
            self._in_flight_at_failure[index] = 1 + sum(i == index for i in self._in_flight.values())
        if any(i == index for i in self._in_flight.values()):
            return  # wait until every request sent to it has failed
        self._failures[index] += 1  # rounds of requests that all failed since the last chunk
        if self._failures[index] > self.max_consecutive_failures:
            log.warning("rlaccel: Ray actor %d failed %d rounds of requests in a row; not asked again", index,
                        self._failures[index])
            return  # given up on: no new requests for this actor
        self._retry_at[index] = time.monotonic() + min(0.05 * 2 ** (self._failures[index] - 1), 2.0)

    # ------------------------------------------------------------------ metrics
    def metrics(self, learner_version: int | None = None, recent: list[Chunk] | None = None) -> dict[str, float]:
        """Per-actor and total env steps/s (actor time), chunk latency, lost chunks, restarts, policy lag."""
        out: dict[str, float] = {}
        for i, s in enumerate(self.stats):
            out[f"ray/actor{i}/env_steps_per_s"] = s.steps_per_s
            out[f"ray/actor{i}/steps"] = s.steps
        chunks = sum(s.chunks for s in self.stats)
        out["ray/env_steps_per_s"] = sum(s.steps_per_s for s in self.stats)
        out["ray/steps"] = sum(s.steps for s in self.stats)
        out["ray/chunk_latency_ms"] = 1000 * sum(s.latency_sum for s in self.stats) / chunks if chunks else 0.0
        out["ray/lost_chunks"] = sum(s.lost_chunks for s in self.stats)
        out["ray/restarts"] = sum(s.restarts for s in self.stats)
        if learner_version is not None and recent:
            out["ray/policy_lag"] = sum(learner_version - c.version for c in recent) / len(recent)
        return out


def feed_learner(pool: RayActorPool, learner: Learner, *, sync_interval: int,
                 on_metrics: Callable[[dict[str, float]], None] | None = None, log_every: int = 10) -> RayRun:
    """The learner's loop over ``pool``, framework-agnostic: start the actors, store every chunk that
    arrives through ``learner`` (a :class:`~rlaccel_plugins.parallel.learner.Learner`), send new weights
    every ``sync_interval`` gradient steps, report metrics (``on_metrics`` every ``log_every`` chunks);
    stop the actors whatever happens.
    """
    run, synced = RayRun(), learner.gradient_steps
    pool.start(learner.weights(), learner.exploration(), synced)
    try:
        while not learner.finished:
            pool.params = learner.exploration()
            chunks = pool.receive()
            for chunk in chunks:
                run.received(chunk)
                run.stored_steps += learner.store_chunk(chunk.payload)
                if learner.gradient_steps - synced >= sync_interval:
                    synced = learner.gradient_steps
                    pool.broadcast(learner.weights(), synced)
            if run.measure(pool, learner.gradient_steps, chunks, every=log_every) and on_metrics is not None:
                on_metrics(run.metrics)
    finally:
        run.measure(pool, learner.gradient_steps)
        pool.stop()  # requests still in flight are dropped: they were never acknowledged
    return run
