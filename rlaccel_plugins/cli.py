"""The ``rlaccel`` command line. Sub-commands come from the ``rlaccel_add_commands`` hook."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlaccel_plugins.errors import ConfigError, missing_dependency


def build_parser() -> argparse.ArgumentParser:
    from rlaccel_plugins.plugins import get_plugin_manager

    parser = argparse.ArgumentParser(
        prog="rlaccel", description="Make existing SB3 and Tianshou agents train faster.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    get_plugin_manager().hook.rlaccel_add_commands(subparsers=subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlaccel`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        try:
            return int(args.func(args) or 0)
        except ModuleNotFoundError as exc:  # an optional package: say which extra installs it
            error = missing_dependency(exc)
            if error is None:
                raise
            raise error from None
    except ConfigError as exc:  # a user mistake: one line; anything else is a bug and keeps its traceback
        print(f"rlaccel {args.command}: error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------- core commands
def add_core_commands(subparsers: argparse._SubParsersAction) -> None:
    presets = subparsers.add_parser("presets", help="list presets, or show one resolved as YAML",
                                    description="List the registered presets; `show NAME` prints one as YAML.")
    presets_sub = presets.add_subparsers(dest="presets_command", metavar="ACTION")
    show = presets_sub.add_parser("show", help="print a preset's resolved configuration as YAML",
                                  description="Print the resolved configuration of preset NAME as YAML.")
    show.add_argument("name", help="preset name, e.g. atari")
    show.set_defaults(func=cmd_presets_show)
    presets.set_defaults(func=cmd_presets_list)

    plugins = subparsers.add_parser("plugins", help="list loaded plugins, their versions and hooks",
                                    description="List loaded plugins (name, version, hooks) and adapters.")
    plugins.set_defaults(func=cmd_plugins)

    env = subparsers.add_parser("env", help="versions, hardware and the resolved 'auto' values",
                                description="Show library versions, cores, GPU and what 'auto' resolves to.")
    env.set_defaults(func=cmd_env)

    train = subparsers.add_parser("train", help="train an agent from a preset (or stock, for comparison)",
                                  description="Train an SB3 or Tianshou agent with rlaccel (or --stock without it); "
                                              "logs to TensorBoard, evaluates periodically, saves the model.")
    _add_run_arguments(train)
    train.add_argument("--framework", choices=["sb3", "tianshou"], default="sb3",
                       help="the framework that trains the agent (default sb3)")
    train.add_argument("--algo", default="dqn", help="dqn, qrdqn, sac, td3, ddpg, ppo, a2c (SB3); dqn (Tianshou)")
    train.add_argument("--env", default="CartPole-v1", help="gymnasium / envpool task id")
    train.add_argument("--preset", default=None,
                       help="rlaccel preset (see `rlaccel presets`; not with --stock). Default: RLACCEL_PRESET or the "
                            "config file's, else the one measured for the task (classic_control for DQN on classic "
                            "control tasks), else --drop-in")
    train.add_argument("--stock", action="store_true", help="the framework's own settings, no rlaccel")
    train.add_argument("--drop-in", dest="dropin", action="store_true",
                       help="the framework's own settings plus only the README's drop-in (tiered buffer and "
                            "AccelerateCallback / SparseDenseWrapper with the preset), no hyper-parameter changed")
    train.add_argument("--logdir", default=None, help="where logs, model and config go (default runs/FRAMEWORK-ALGO-ENV-TIME)")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="config override, e.g. --set batch_size=128 --set sampling_ratio=[0.5,0.5]")
    train.add_argument("--hp", dest="hyperparams", action="append", default=[], metavar="KEY=VALUE",
                       help="the framework's own hyper-parameter, applied last, e.g. --hp learning_starts=0 (SB3)")
    train.add_argument("--async", dest="async_mode", action="store_true",
                       help="collect in an actor thread while the learner trains (SB3 off-policy; measure first: "
                            "on 2 CPU cores it is slower)")
    train.add_argument("--ray", action="store_true",
                       help="collect on Ray actors (this machine or a cluster) feeding this learner (off-policy)")
    train.add_argument("--ray-address", default=None,
                       help="auto (the cluster `ray start` runs here) or HOST:PORT of a head node; default: a "
                            "local Ray for this run")
    train.add_argument("--actors", type=int, default=None, help="Ray actors collecting (default 2)")
    train.add_argument("--envs-per-actor", type=int, default=None,
                       help="envs each actor steps (default: the preset's parallel_envs)")
    train.add_argument("--chunk-steps", type=int, default=None, help="vector steps per chunk sent (default 16)")
    train.add_argument("--ray-ordered", action="store_true", default=None,
                       help="take the actors' chunks in turn: a seeded run is reproducible (waits for slow actors)")
    train.add_argument("--resume", metavar="DIR", default=None,
                       help="continue the run in DIR (its --logdir) from its newest valid checkpoint, with its "
                            "own settings")
    train.add_argument("--wandb", action="store_true", help="also log to Weights & Biases (WANDB_MODE=offline works)")
    train.set_defaults(func=cmd_train)

    demo = subparsers.add_parser("demo", help="stock SB3 DQN vs the drop-in on CartPole: speed and learning, with a plot",
                                 description="Stock SB3 DQN (RL Zoo's settings) against the drop-in on CartPole-v1: "
                                             "the speed ratio on fixed work (interleaved segments, with a CI) and "
                                             "the learning curves of several seeds per variant (IQM with CI bands, "
                                             "P(drop-in > stock)), then one sentence on what to expect.")
    demo.add_argument("--seeds", type=int, default=5, help="learning runs per variant (default 5)")
    demo.add_argument("--first-seed", type=int, default=0, help="the first run's seed; the others follow it")
    demo.add_argument("--steps", type=int, default=30_000, help="env steps per learning run (default 30,000)")
    demo.add_argument("--workers", type=int, default=None, help="parallel learning runs (default: the usable cores)")
    demo.add_argument("--segments", type=int, default=6, help="timed segments per variant in the speed measure")
    demo.add_argument("--segment-steps", type=int, default=1_500, help="env steps per speed segment")
    demo.add_argument("--out", default="demo-results", help="directory for results.md, results.json and the plot")
    demo.set_defaults(func=cmd_demo)

    bench = subparsers.add_parser("bench", help="stock vs rlaccel benchmark suites (results.json, table, plots)",
                                  description="Run a benchmark suite: stock and rlaccel variants of each task in the "
                                              "same run, interleaved per seed; time-to-threshold (evaluation "
                                              "excluded), env steps, throughput, memory. Suites: quick, dropin (quick "
                                              "plus the SB3 DQN drop-in with the off preset and with fused_optimizer), precision, "
                                              "classic, mujoco (InvertedPendulum SAC; needs the mujoco module), "
                                              "atari (a GPU job), atari-fps.")
    from rlaccel_plugins.bench.study import STUDIES  # light: no framework import
    from rlaccel_plugins.bench.suites import SUITES

    bench.add_argument("--suite", default="quick", help=" | ".join([*SUITES, *STUDIES, "speed"]) + (
        ". learning / learning-quick: the learning study (fixed budgets, many seeds in parallel workers, rliable "
        "statistics; resumable); speed: its fixed-work speed measure (variants interleaved in segments)"))
    bench.add_argument("--seeds", type=int, default=None,
                       help="seeds per variant (default 5; 10 for the learning study)")
    bench.add_argument("--workers", type=int, default=None,
                       help="learning study: parallel worker processes, one torch thread each (default: the usable cores)")
    bench.add_argument("--resume", action="store_true",
                       help="learning study: go on with the runs.jsonl in --out, skipping the runs already there")
    bench.add_argument("--tasks", default=None,
                       help="learning study / speed: a comma-separated subset of its tasks, e.g. cartpole-dqn")
    bench.add_argument("--variant", dest="variants", action="append", default=None,
                       help="learning study: run only this variant (repeat for several), e.g. --variant stock "
                            "--variant 'drop-in, uniform (off)'")
    bench.add_argument("--ray", default=None, metavar="ADDRESS",
                       help="learning study: run each run as a Ray task on the cluster at ADDRESS (auto: the one "
                            "`ray start` runs here; HOST:PORT; local: start one here) instead of --workers processes")
    bench.add_argument("--study", default="learning-quick", help="speed: whose tasks to measure (learning, learning-quick)")
    bench.add_argument("--segments", type=int, default=8, help="speed: timed segments per variant")
    bench.add_argument("--segment-steps", type=int, default=2_000, help="speed: env steps per segment")
    bench.add_argument("--first-seed", type=int, default=0, help="the first seed of every variant; the others follow it")
    bench.add_argument("--frameworks", default="sb3,tianshou", help="comma-separated subset of sb3,tianshou")
    bench.add_argument("--ablate", action="store_true",
                       help="add one variant per technique (settings only, tiers only, sparse/dense only, "
                            "parallel only) to attribute the gain")
    bench.add_argument("--steps", type=int, default=None, help="override every task's env-step cap / budget")
    bench.add_argument("--preset", default=None, help="preset for the rlaccel variants (default: the suite's)")
    bench.add_argument("--out", default="bench-results", help="directory for results.json, results.md, *.png")
    bench.set_defaults(func=cmd_bench)

    export = subparsers.add_parser("export", help="export a saved policy to ONNX, checked with onnxruntime",
                                   description="Export a saved policy's deterministic action to ONNX and check it "
                                               "against onnxruntime on sampled observations. MODEL: an SB3 .zip, or "
                                               "the algorithm.pt (or run directory) of `rlaccel train --framework "
                                               "tianshou`.")
    export.add_argument("model", metavar="MODEL", help="a saved model: an SB3 .zip, or a Tianshou algorithm.pt or run directory")
    export.add_argument("--onnx", required=True, help="output .onnx file")
    export.add_argument("--framework", choices=["auto", "sb3", "tianshou"], default="auto",
                        help="auto: .zip is SB3, anything else Tianshou")
    export.add_argument("--check", type=int, default=1000, help="observations compared with onnxruntime")
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rlaccel_plugins.plugins import get_plugin_manager

    framework = args.framework
    if framework == "auto":
        path = Path(args.model)
        if not path.exists():
            raise ConfigError(f"MODEL must be an existing file or run directory, got MODEL={args.model!r}.")
        framework = "sb3" if path.suffix == ".zip" else "tianshou"
    report = get_plugin_manager().adapters.get(framework).load("export")(args.model, args.onnx, check=args.check)
    print(json.dumps(report, indent=2))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from rlaccel_plugins.bench.study import STUDIES
    from rlaccel_plugins.bench.suites import SUITES
    from rlaccel_plugins.errors import did_you_mean

    known = [*SUITES, *STUDIES, "speed"]
    if args.suite not in known:
        raise ConfigError(f"--suite must be one of {known}, got --suite={args.suite!r}.{did_you_mean(args.suite, known)}")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    if args.suite in STUDIES:
        from rlaccel_plugins.bench.study import run_study
        from rlaccel_plugins.bench.study_report import write_report

        run_study(args.suite, seeds=args.seeds or 10, workers=args.workers, out=args.out, resume=args.resume,
                  first_seed=args.first_seed, only=tasks, steps=args.steps,
                  variants=args.variants, ray=args.ray)
        write_report(args.out)
        return 0
    if args.suite == "speed":
        from rlaccel_plugins.bench.speed import run_speed

        run_speed(args.study, args.out, segments=args.segments, segment_steps=args.segment_steps, only=tasks)
        return 0
    from rlaccel_plugins.bench.runner import run_bench

    frameworks = tuple(f.strip() for f in args.frameworks.split(",") if f.strip())
    run_bench(args.suite, seeds=args.seeds or 5, frameworks=frameworks, out=args.out, ablate=args.ablate,
              first_seed=args.first_seed, steps=args.steps, preset=args.preset)
    return 0


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=100_000, help="env steps to train (default 100,000)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (default 0): the same seed, the same run")
    parser.add_argument("--eval-freq", type=int, default=2_000, help="env steps between evaluations (default 2,000)")
    parser.add_argument("--no-progress", action="store_true", help="no live progress line")


def _parse_overrides(items: list[str], flag: str = "--set") -> dict:
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} must be KEY=VALUE, got {flag}={item!r}. Example: {flag} batch_size=128.")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _ray_settings(args: argparse.Namespace) -> dict | None:
    from rlaccel_plugins.errors import ConfigError
    from rlaccel_plugins.parallel.ray_actors import ray_settings

    given = [f"--{n.replace('_', '-')}" for n in ("ray_address", "actors", "envs_per_actor", "chunk_steps", "ray_ordered")
             if getattr(args, n) is not None]
    if not args.ray:
        if given:
            raise ConfigError(f"{', '.join(given)} only apply with --ray, got them without it. Fix: add --ray.")
        return None
    if args.async_mode:
        raise ConfigError("--async and --ray are two ways of collecting, got both. Fix: keep one.")
    return ray_settings(args.ray_address, args.actors if args.actors is not None else 2,
                        args.chunk_steps if args.chunk_steps is not None else 16, ordered=bool(args.ray_ordered))


def default_logdir(framework: str, algo: str, env_id: str, when: str | None = None) -> str:
    """Where a run without ``--logdir`` writes: ``runs/<framework>-<algo>-<env>-<time>``.

    Examples:
        >>> default_logdir("sb3", "dqn", "CartPole-v1", when="20261206-120000")
        'runs/sb3-dqn-CartPole-v1-20261206-120000'
    """
    import time

    return f"runs/{framework}-{algo}-{env_id}-{when or time.strftime('%Y%m%d-%H%M%S')}"


def _preset_and_mode(args: argparse.Namespace) -> tuple[str | None, bool]:
    """The preset ``train`` loads and whether it trains ``--drop-in``. Where the user chose no preset (neither
    ``--preset`` nor ``RLACCEL_PRESET`` / a config file): the preset the learning study measured for the task's
    family and the algorithm, else the drop-in on the framework's own recipe, which it says."""
    from rlaccel_plugins.loader import ambient_preset
    from rlaccel_plugins.plugins import get_plugin_manager
    from rlaccel_plugins.presets import measured_preset
    from rlaccel_plugins.tasks import task_info

    if args.preset or args.stock or ambient_preset() is not None:
        return args.preset, args.dropin
    get_plugin_manager().adapters.check_algo(args.framework, args.algo)  # a typo refused before gymnasium loads
    family = task_info(args.env).family
    preset = measured_preset(family, args.algo)
    if preset is None and not args.dropin:
        print(f"rlaccel: no preset was measured for {args.algo} on {family} tasks such as {args.env}: training the "
              f"{args.framework} recipe plus the drop-in (--preset NAME applies a preset's settings)", flush=True)
    return preset, args.dropin or preset is None


def cmd_train(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from rlaccel_plugins.loader import load_config
    from rlaccel_plugins.training import TrainSpec, run_training

    if args.resume:  # the run's own settings, from its spec.json
        logdir = args.resume
        spec = TrainSpec.load(Path(logdir) / "spec.json", logdir=logdir, resume=True, wandb=args.wandb or None,
                              progress=False if args.no_progress else None)
    else:
        if args.stock and args.preset is not None:
            raise ConfigError(f"--preset must not be given with --stock (a stock run uses the framework's own "
                              f"settings, no preset), got --preset={args.preset!r}. Drop one of the two.")
        overrides = _parse_overrides(args.overrides)
        ray = _ray_settings(args)
        if ray is not None and args.envs_per_actor is not None:
            overrides["parallel_envs"] = args.envs_per_actor
        preset, dropin = _preset_and_mode(args)
        config = load_config(preset=preset, **overrides)
        logdir = args.logdir or default_logdir(args.framework, args.algo, args.env)
        spec = TrainSpec(framework=args.framework, algo=args.algo, env_id=args.env, config=config,
                         steps=args.steps, seed=args.seed, logdir=logdir, stock=args.stock, dropin=dropin,
                         eval_freq=args.eval_freq,
                         wandb=args.wandb or config.monitoring.wandb,  # a flag overrides its config key
                         progress=config.monitoring.progress_bar and not args.no_progress,
                         hyperparams=_parse_overrides(args.hyperparams, "--hp"), async_mode=args.async_mode,
                         ray=ray)
    started = time.perf_counter()
    result = run_training(spec)
    took = time.perf_counter() - started
    if result.stopped_by_signal is not None:
        print(f"{spec.variant}: stopped by signal {result.stopped_by_signal} at {result.env_steps:,} env steps; "
              f"checkpoint {result.checkpoint}; continue with: rlaccel train --resume {logdir}")
        return 128 + result.stopped_by_signal
    seconds, steps = result.time_to_threshold(spec.threshold)
    if spec.threshold is None:  # a task without a known solved return (MinAtar's games)
        reached = f"trained {result.env_steps:,} env steps"
    elif seconds is not None:
        reached = f"reached {spec.threshold:g} after {seconds:.1f} s of training / {steps:,} env steps"
    else:
        reached = f"did not reach {spec.threshold:g} within {result.env_steps:,} env steps"
    print(f"{spec.variant}: {reached}; final evaluation {result.final_eval}; the run took {took:.1f} s in all "
          f"(evaluations and start-up included, where the training time leaves them out); saved to {logdir}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from rlaccel_plugins.demo import run_demo

    run_demo(seeds=args.seeds, steps=args.steps, out=args.out, workers=args.workers, segments=args.segments,
             segment_steps=args.segment_steps, first_seed=args.first_seed)
    return 0


def cmd_presets_list(args: argparse.Namespace) -> int:
    from rlaccel_plugins.plugins import get_plugin_manager

    reg = get_plugin_manager().presets
    width = max(len(n) for n in reg.names())
    for name in reg.names():
        print(f"{name:<{width}}  {reg.describe(name)}")
    return 0


def cmd_presets_show(args: argparse.Namespace) -> int:
    import yaml

    from rlaccel_plugins.loader import get_preset

    config = get_preset(args.name)
    values = config.to_dict()
    unread = config.replay_buffer.unread()
    values["replay_buffer"] = {k: v for k, v in values["replay_buffer"].items() if k not in unread}
    print(yaml.safe_dump(values, sort_keys=False, default_flow_style=None), end="")
    if unread:
        print(f"# not shown: {', '.join(unread)} (sampling: {config.replay_buffer.sampling} does not read them)")
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from rlaccel_plugins.plugins import get_plugin_manager

    manager = get_plugin_manager()
    print("plugins:")
    for name, version, hooks in manager.plugin_rows():
        print(f"  {name} {version}: {', '.join(hooks)}")
    for failure in manager.failures:
        print(f"  {failure.name}: NOT LOADED ({failure.reason})")
    print("adapters:")
    for adapter in manager.adapters:
        state = "available" if adapter.available else f"unavailable: {adapter.unavailable_reason}"
        print(f"  {adapter.name} ({adapter.framework}) {state}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from rlaccel_plugins.plugins import get_plugin_manager

    report: dict[str, str] = {}
    for answer in reversed(get_plugin_manager().hook.rlaccel_env_report()):
        report.update(answer)
    width = max(len(k) for k in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
