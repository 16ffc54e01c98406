"""`SparseDenseCallback` (sparse/dense updates, guard, precision, importance weights, metrics) and
`AccelerateCallback` (all of that plus fused updates) for SB3 models."""

from __future__ import annotations

import torch
from stable_baselines3.common.callbacks import BaseCallback

from rlaccel_plugins.cadence import EnvStepCadence
from rlaccel_plugins.config import AUTO, AccelConfig
from rlaccel_plugins.fused.memory_format import ChannelsLast
from rlaccel_plugins.loader import load_config
from rlaccel_plugins.metrics import FpsMeter, collect_metrics
from rlaccel_plugins.threads import ThreadPolicy
from rlaccel_plugins.updates import SparseDenseUpdater
from rlaccel_plugins.updates.guard import GradientGuard
from rlaccel_plugins.updates.precision import resolve_dtype, update_autocast
from rlaccel_sb3.networks import critic_networks, frame_input_networks, trained_networks
from rlaccel_sb3.overrides import (
    override_method,
    override_policy_forward,
    override_train,
    remove_override,
    remove_policy_forward,
    remove_train_override,
)
from rlaccel_sb3.weights import ImportanceWeightHook


class SparseDenseCallback(BaseCallback):
    """Sparse/dense updates, importance weights and rlaccel metrics for any SB3 algorithm.

    At training start it attaches a :class:`~rlaccel_plugins.SparseDenseUpdater` to every
    network/optimizer pair (DQN ``q_net``; QR-DQN ``quantile_net``; SAC/TD3/DDPG ``actor`` and
    ``critic``; PPO/A2C ``policy``), and, when the replay buffer returns importance weights, scales
    the TD loss per sample. Metrics are recorded every ``monitoring.log_interval`` env steps and at
    the end of each ``learn()``. At training end (idempotent: RL Zoo calls it twice) it restores every
    ``requires_grad`` flag and keeps the schedule's phase for the next ``learn()``. It logs
    ``rlaccel/*`` values through SB3's logger (so TensorBoard, CSV and wandb work as usual).

    Args:
        preset: preset whose ``training`` block gives the schedule (default: the loaded config).
        sparse_update_interval: overrides the preset's.
        dense_layers: overrides the preset's.
        sparse: ``False`` keeps every update full (metrics and weights only).
        config: a ready :class:`AccelConfig` instead of ``preset`` + overrides.

    Examples:
        >>> from stable_baselines3 import PPO
        >>> from rlaccel_sb3 import SparseDenseCallback
        >>> model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1)
        >>> cb = SparseDenseCallback(sparse_update_interval=10, dense_layers=[-1])
        >>> _ = model.learn(128, callback=cb)
        >>> cb.stats["full_updates"] + cb.stats["dense_updates"]
        4
    """

    def __init__(self, preset: str | None = None, sparse_update_interval: int | None = None,
                 dense_layers: list[int | str] | None = None, *, sparse: bool = True,
                 config: AccelConfig | None = None, verbose: int = 0) -> None:
        super().__init__(verbose)
        overrides = {k: v for k, v in dict(sparse_update_interval=sparse_update_interval,
                                           dense_layers=dense_layers).items() if v is not None}
        self.config = load_config(config, preset=preset, **overrides)
        self.sparse = sparse
        self.updater: SparseDenseUpdater | None = None
        self.weights: ImportanceWeightHook | None = None
        self._saved_state: dict | None = None
        self._saved_guard: dict | None = None
        self._fps: FpsMeter | None = None
        self._final_stats: dict[str, float] = {}
        self.guard: GradientGuard | None = None
        self.networks: list[str] = []  # names of the networks under the schedule in the last learn()
        self._log_cadence = EnvStepCadence(0)
        self._recorded: bool | None = None  # None outside learn()
        self.threads: ThreadPolicy | None = None  # torch's thread count during learn() (training.num_threads)

    def _on_training_start(self) -> None:
        self.teardown()  # a previous learn() that never reached its end
        batch = getattr(self.model, "batch_size", None) or 8
        networks = trained_networks(self.model, batch=min(int(batch), 256))
        self.guard = GradientGuard.from_config(self.config, str(self.model.device))
        if self.guard is not None and self._saved_guard is not None:  # the loss scale and counters go on
            self.guard.load_state_dict(self._saved_guard)
        self._install_train()
        for net in networks if self.guard is not None else ():
            self.guard.attach(net.optimizer)
        if self.sparse:
            self.updater = SparseDenseUpdater.from_config(self.config, whole_network="info")
            if self._saved_state is not None:
                self.updater.load_state_dict(self._saved_state)
            self.networks = []
            for net in networks:
                att = self.updater.attach(net.module, net.optimizer, example_input=net.example_input, name=net.name)
                self.networks.append(net.name)
                if self.verbose:
                    print(f"rlaccel: {net.name}: layers {att.layer_map.describe()}; "
                          f"{len(att.dense)} dense / {len(att.frozen)} sparse-only parameter tensors")
        buffer = getattr(self.model, "replay_buffer", None)
        if buffer is not None and getattr(getattr(buffer, "engine", None), "config", None) is not None \
                and buffer.engine.config.importance_beta is not None and not self.fused:  # fused: in the loss
            self.weights = ImportanceWeightHook(buffer, critic_networks(self.model))
        self._install_collection()  # after the schedule traced the networks through their own forward
        threads = self.config.training.num_threads
        self.threads = ThreadPolicy(fixed=None if threads == AUTO else int(threads))
        self.threads.start()
        self._fps = FpsMeter(self.num_timesteps)
        self._log_cadence = EnvStepCadence(self.config.monitoring.log_interval)
        self._log_cadence.start(self.num_timesteps)
        self._recorded = False

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if self.threads is not None:
            self.threads.update()
        # gathered when logged: every monitoring.log_interval env steps (and at the first rollout)
        if self._log_cadence.due(self.num_timesteps) or not self._recorded:
            self._record_metrics()

    def _record_metrics(self) -> None:
        self._recorded = True
        for key, value in self._metrics().items():
            self.logger.record(key, value)

    def _metrics(self) -> dict[str, float]:
        buffer = getattr(self.model, "replay_buffer", None)
        engine = getattr(buffer, "engine", None)
        fps = self._fps.read(self.num_timesteps) if self._fps else None
        return collect_metrics(updater=self.updater, replay=engine, fps=fps, guard=self.guard)

    @property
    def stats(self) -> dict[str, float]:
        """The updater's counters (kept after training ends) and the gradient guard's."""
        stats = self.updater.stats if self.updater is not None and self.updater.attachments else self._final_stats
        return {**stats, **(self.guard.stats if self.guard is not None else {})}

    def _on_training_end(self) -> None:
        if self._recorded is not None:  # the final counts of this learn() (RL Zoo calls this twice)
            self._record_metrics()
            self._recorded = None
        self.teardown()

    def _fused_train(self):
        """The fused ``train()`` to run instead of SB3's (None here: see :class:`AccelerateCallback`)."""
        return

    def _install_train(self) -> None:
        """The update path of this ``learn()``: SB3's own ``train()`` or the fused one, under
        ``precision.dtype`` (the update path only, not collection); never saved into ``model.zip``."""
        model = self.model
        if "train" in model.__dict__ and not getattr(model.__dict__["train"], "_rlaccel_train", False):
            return  # the user's own override stays as it is
        fused = self._fused_train()
        autocast = resolve_dtype(self.config.precision.dtype, str(model.device)) != "fp32"
        if fused is None and not autocast:
            return
        train = fused if fused is not None else type(model).train.__get__(model)
        if autocast:
            inner = train

            def train(*args, **kwargs):
                with update_autocast(self.config.precision.dtype, str(model.device), self.guard):
                    return inner(*args, **kwargs)

        train._rlaccel_train = True
        train._rlaccel_fused = fused is not None
        train.release = getattr(fused, "release", None)  # a fused train's CUDA graphs
        train.graphs = getattr(fused, "graphs", None)
        override_train(model, train)

    def _lean_collection(self) -> dict:
        """The lean methods to run instead of SB3's during collection, by name: off-policy the model's
        ``_sample_action`` (and ``collect_rollouts``, ``_store_transition``, ``_on_step``), on-policy the
        policy's ``forward`` (empty here: see :class:`AccelerateCallback`)."""
        return {}

    def _collection_owner(self) -> object:
        """Whose methods lean collection replaces: the model's (off-policy ``collect_rollouts`` and what it
        calls) or the policy's (on-policy ``collect_rollouts`` calls ``policy(obs)``)."""
        from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

        return self.model if isinstance(self.model, OffPolicyAlgorithm) else self.model.policy

    def _install_collection(self) -> None:
        owner = self._collection_owner()
        lean = self._lean_collection()
        if any(name in owner.__dict__ for name in lean):
            return  # the user's own override stays as it is, and SB3's loop around it
        for name, method in lean.items():
            method._rlaccel_collection = True
            if name == "forward":
                override_policy_forward(owner, method)
            else:
                override_method(owner, name, method)

    def _installed_collection(self) -> dict:
        """The lean methods installed now, by name."""
        if getattr(self, "model", None) is None:
            return {}
        owner = self._collection_owner()
        return {name: method for name, method in owner.__dict__.items()
                if getattr(method, "_rlaccel_collection", False)}

    @property
    def lean_collection(self) -> bool:
        """Whether the model's collection runs lean in this ``learn()``."""
        return bool(self._installed_collection())

    @property
    def fused(self) -> bool:
        """Whether the model's updates run fused in this ``learn()``."""
        model = getattr(self, "model", None)
        return model is not None and getattr(model.__dict__.get("train"), "_rlaccel_fused", False)

    def state_dict(self) -> dict:
        """The schedule's state (phase and counters) and the gradient guard's (counters, fp16 loss
        scale), to resume them in a new process."""
        updater = self.updater.state_dict() if self.updater is not None and self.updater.attachments \
            else self._saved_state
        return {"updater": updater, "guard": self.guard.state_dict() if self.guard is not None else self._saved_guard}

    def load_state_dict(self, state: dict | None) -> None:
        """Resume the schedule and the guard at the next ``learn()``."""
        if state is not None and not {"updater", "guard"} & state.keys():
            state = {"updater": state}  # a checkpoint of an older rlaccel: the schedule's state only
        self._saved_state = state.get("updater") if state else None
        self._saved_guard = state.get("guard") if state else None

    def teardown(self) -> None:
        """Detach everything and restore every flag; safe to call any number of times."""
        if getattr(self, "threads", None) is not None:
            self.threads.stop()
        if self.updater is not None and self.updater.attachments:
            self._saved_state = self.updater.state_dict()
            self._final_stats = self.updater.stats
            self.updater.detach()
        if self.weights is not None:
            self.weights.remove()
            self.weights = None
        if self.guard is not None:
            self._saved_guard = self.guard.state_dict()
            self.guard.detach()
        model = getattr(self, "model", None)  # unset until the callback is first initialised
        if model is not None and getattr(model.__dict__.get("train"), "_rlaccel_train", False):
            remove_train_override(model)  # back to the class's own train()
        for name in self._installed_collection():
            if name == "forward":
                remove_policy_forward(self._collection_owner())
            else:
                remove_override(model, name)


class AccelerateCallback(SparseDenseCallback):
    """Everything rlaccel does during ``learn()``: what :class:`SparseDenseCallback` does (sparse/dense
    updates, gradient guard, mixed precision, importance weights, metrics) plus **fused updates** — the
    algorithm's ``train()`` swapped for an equivalence-tested fused one (``rlaccel_sb3.fused``) at
    training start and put back at its end — where ``training.fused_updates`` allows (``auto``: where
    one exists, one log line elsewhere; ``true``: required; ``false``: SB3's own), with the optimizers'
    single-kernel step where ``training.fused_optimizer`` asks for it, each gradient step one compiled call on
    the CPU where ``training.compiled_updates`` asks for it (:mod:`rlaccel_plugins.fused.compiled_step`), and with ``training.channels_last``
    the policy's ``Conv2d`` layers in channels-last memory format for the ``learn()`` (faster CPU
    convolutions, not bit-identical; :mod:`rlaccel_plugins.fused.memory_format`). ``num_threads`` sets
    ``training.num_threads`` (torch threads during ``learn()``, put back after). It is what
    ``accelerate(model)`` returns and what the README's drop-in uses.

    Examples:
        >>> from stable_baselines3 import DQN
        >>> from rlaccel_sb3 import AccelerateCallback
        >>> model = DQN("MlpPolicy", "CartPole-v1", learning_starts=64, train_freq=4, seed=0)
        >>> callback = AccelerateCallback(preset="classic_control")
        >>> _ = model.learn(256, callback=callback)
        >>> "train" in model.__dict__  # put back after learn()
        False
        >>> AccelerateCallback(num_threads=1, compiled_updates=False).config.training.num_threads
        1
    """

    def __init__(self, preset: str | None = None, sparse_update_interval: int | None = None,
                 dense_layers: list[int | str] | None = None, *, fused_updates: bool | str | None = None,
                 fused_collection: bool | str | None = None, fused_optimizer: bool | None = None,
                 compiled_updates: bool | str | None = None, channels_last: bool | None = None,
                 num_threads: int | str | None = None, sparse: bool = True, config: AccelConfig | None = None,
                 verbose: int = 0) -> None:
        super().__init__(preset, sparse_update_interval, dense_layers, sparse=sparse, config=config, verbose=verbose)
        overrides = {k: v for k, v in dict(fused_updates=fused_updates, fused_collection=fused_collection,
                                           fused_optimizer=fused_optimizer, compiled_updates=compiled_updates,
                                           channels_last=channels_last, num_threads=num_threads).items()
                     if v is not None}
        if overrides:
            self.config = load_config(self.config, **overrides)
        self._channels_last: ChannelsLast | None = None
        self.compiled = False  # whether this learn() call's gradient steps may run compiled
        self.update_path: str | None = None  # which update ran in the last learn(): compiled, fused, framework

    def _on_training_start(self) -> None:
        super()._on_training_start()
        if self.config.training.channels_last:  # after the schedule traced the networks in their own format
            policy = self.model.policy
            optimizers = {id(m.optimizer): m.optimizer for m in policy.modules()
                          if isinstance(getattr(m, "optimizer", None), torch.optim.Optimizer)}
            self._channels_last = ChannelsLast([policy], optimizers.values(), frame_inputs=frame_input_networks(policy))
            if self.verbose:
                print(f"rlaccel: channels_last: {self._channels_last.layers} Conv2d layers in channels-last")

    def teardown(self) -> None:
        train = getattr(getattr(self, "model", None), "__dict__", {}).get("train")
        if getattr(train, "_rlaccel_train", False):
            compiled = getattr(getattr(train, "graphs", None), "compiled_step", None) is not None
            self.update_path = "compiled" if compiled else "fused" if train._rlaccel_fused else "framework"
        super().teardown()
        if getattr(self, "_channels_last", None) is not None:
            self._channels_last.remove()
            self._channels_last = None

    def _compiled_setting(self) -> bool:
        """Whether this ``learn()`` call's gradient steps may run compiled: ``training.compiled_updates``, and
        for ``auto`` whether the call plans enough of them to pay the compiled step back
        (:func:`rlaccel_sb3.fused.compiled_pays`)."""
        from rlaccel_sb3.fused import break_even, compiled_pays, planned_gradient_steps

        setting = self.config.training.compiled_updates
        if setting != AUTO:
            return bool(setting)
        total = int(self.locals.get("total_timesteps", 0))
        pays = compiled_pays(self.model, total)
        if self.verbose:
            print(f"rlaccel: compiled_updates auto: {'compiled' if pays else 'eager'} "
                  f"({planned_gradient_steps(self.model, total)} gradient steps planned; break-even "
                  f"{break_even(self.model)})")
        return pays

    def _lean_collection(self) -> dict:
        from rlaccel_plugins.fused.selection import select_fused
        from rlaccel_sb3.flat_actor_critic import lean_policy_forward_for
        from rlaccel_sb3.fused import SUPPORTED
        from rlaccel_sb3.rollouts import lean_off_policy_methods
        from rlaccel_sb3.verified import CODE

        # off-policy, the lean action decides (the rest of the loop follows it where SB3's own runs)
        on_policy = self._collection_owner() is not self.model
        methods = {"forward": lean_policy_forward_for(self.model)} if on_policy else lean_off_policy_methods(self.model)
        lean = methods.get("forward" if on_policy else "_sample_action")
        lean = select_fused(self.config.training.fused_collection, lean, algorithm=type(self.model).__name__,
                            framework="SB3", supported=SUPPORTED, key="fused_collection", what="collection",
                            unverified=CODE.unverified("collection:on_policy" if on_policy else "collection:off_policy")
                            if lean is not None else None)
        return methods if lean is not None else {}

    def _fused_train(self):
        from rlaccel_plugins.fused.selection import select_fused
        from rlaccel_sb3.fused import SUPPORTED, fused_train_for
        from rlaccel_sb3.verified import CODE, train_key

        training = self.config.training
        self.compiled = self._compiled_setting()
        fused = fused_train_for(self.model, guard=self.guard, fused_optimizer=training.fused_optimizer,
                                compiled=self.compiled)
        if fused is not None:
            refuse_uncompilable(self.model, self.config)
        return select_fused(self.config.training.fused_updates, fused,
                            algorithm=type(self.model).__name__, framework="SB3", supported=SUPPORTED,
                            unverified=CODE.unverified(train_key(self.model)) if fused is not None else None)


def refuse_uncompilable(model, config) -> None:
    """A ``ConfigError`` where ``training.compiled_updates`` is ``True`` and ``model``'s gradient steps cannot run
    compiled (:func:`rlaccel_sb3.fused.compiled_unavailable`): ``accelerate()`` calls it at once, the callback
    at ``learn()``."""
    from rlaccel_plugins.errors import ConfigError
    from rlaccel_sb3.fused import compiled_unavailable

    if config.training.compiled_updates is not True:
        return
    reason = compiled_unavailable(model)
    if reason is not None:
        raise ConfigError(f"compiled_updates must be 'auto' or False for this model, got compiled_updates=True: "
                          f"{reason}. Fix: compiled_updates='auto' (in YAML, compiled_updates: auto) compiles where "
                          "it can and runs the eager fused update elsewhere.")
