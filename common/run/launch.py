"""Entry point shared by every benchmark's train.py.

  python <bench>/train.py [CONFIG] [--flag value ...] [--set key.sub=value ...]

Without CONFIG (a reference-style job script: flags only), the closed config
whose global batch the job gives is used, and the `[init]` line says which.

Works the same under `horovodrun -np N`, `mpirun -np N` and `srun`. A bad input
ends the run with one line naming the culprit and a non-zero exit on the rank
that found it; the process leaves at once (no Horovod shutdown handshake), so
the launcher tears the other ranks down instead of leaving them waiting in a
collective.
"""

import argparse
import os
import sys
import traceback
from pathlib import Path

from common import runtime as runtime_lib
from common.config_loading import dump_config, load_config, peek, replace, yaml_text
from common.errors import ConfigError, ExitCode, InputError
from common.parallel import cycle_time
from common.parallel.distribution import Distribution, launcher_env
from common.reporting.console import Console
from common.reporting.events import Events
from common.reporting.mlperf_logger import MLPerfLogger
from common.run import report as run_report
from common.run import termination
from common.run.result import write_summary
from common.run.trainer import Trainer


def build_parser(task) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{task.name}/train.py", description=f"Train {task.name} (MLPerf HPC)."
    )
    parser.add_argument(
        "config",
        nargs="?",
        default=None,
        help="YAML config file (see configs/); default: the closed config of the job's global batch",
    )
    for flag in task.flags:
        if flag.is_switch:
            parser.add_argument(
                *flag.names,
                dest=flag.key,
                action="store_const",
                const=True,
                default=None,
                help=flag.help,
            )
        else:
            parser.add_argument(
                *flag.names, dest=flag.key, default=None, metavar="VALUE", help=flag.help
            )
    parser.add_argument(
        "--tensorboard",
        dest="runtime.tensorboard",
        action="store_const",
        const=True,
        default=None,
        help="write TensorBoard event files to <run dir>/tensorboard (rank 0)",
    )
    parser.add_argument(
        "--benchmark",
        dest="train.benchmark_steps",
        default=None,
        metavar="STEPS",
        help="benchmark mode: time STEPS training steps through the real loop (staging, input "
        "pipeline, Horovod) after train.benchmark_warmup_steps, print samples/s; no MLPerf log",
    )
    parser.add_argument(
        "--tiny",
        dest="runtime.tiny",
        action="store_const",
        const=True,
        default=None,
        help="shrink the config into a smoke run of a few small steps (runtime.tiny)",
    )
    parser.add_argument(
        "--set",
        dest="_set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set model.dropout=0.2 (repeatable)",
    )
    return parser


def parse_overrides(task, argv) -> tuple[str, dict]:
    args = build_parser(task).parse_args(argv)
    overrides = {}
    for item in args._set:
        if "=" not in item:
            raise ConfigError(f"--set expects KEY=VALUE, got '{item}'")
        key, value = item.split("=", 1)
        overrides[key.strip()] = value
    for flag in task.flags:
        value = getattr(args, flag.key)
        if value is not None:
            overrides.update(flag.parse(value) if flag.parse else {flag.key: value})
    for key in ("runtime.tensorboard", "train.benchmark_steps", "runtime.tiny"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    return args.config, overrides


def load_run_config(task, config_path, overrides: dict, ranks: int) -> tuple[object, str]:
    """The run's validated config, and a note for the [init] line ('' when nothing to say).

    Without a config file, the closed config of the benchmark's registry entry
    whose global batch equals ranks x local batch x accumulation is used (the
    reference is started with flags only). runtime.tiny then shrinks the
    config (Task.tiny_overrides); what the command line sets still wins.
    """
    note = ""
    if config_path is None:
        config_path = closed_config_for(task, overrides, ranks)
        note = f"no config given: using {config_path}, the closed config of this job's global batch"
    cfg = load_config(task.config_class, config_path, overrides)
    if cfg.runtime.tiny:
        cfg = replace(cfg, {**task.tiny_overrides(cfg), **overrides})
        note = (
            note + "; " if note else ""
        ) + "runtime.tiny: the config is shrunk into a smoke run (not a benchmark result)"
    return cfg, note


def closed_config_for(task, overrides: dict, ranks: int) -> str:
    """The closed config whose train.global_batch_size this job gives; ConfigError if none does."""
    from common import benchmarks  # the benchmark table: a run without CONFIG only

    bench = benchmarks.get(task.name)
    local_batch = overrides.get(bench.local_batch_key)
    accumulation = overrides.get("train.gradient_accumulation_frequency")
    # Ranks that split samples add no data parallelism: the global batch counts their groups.
    spatial = int(overrides.get("parallel.spatial_ranks", 1))
    if spatial > 1 and ranks % spatial == 0:
        ranks //= spatial
    path = benchmarks.closed_config_for_ranks(
        task.name,
        ranks,
        int(local_batch) if local_batch else None,
        int(accumulation) if accumulation else None,
    )
    if path is not None:
        return str(path)
    offered = ", ".join(
        f"{p.name} (global batch {gbs})"
        for p, gbs, _, _ in benchmarks.closed_config_batches(task.name)
    )
    raise ConfigError(
        f"no config given and no closed config of {task.name} has this job's global batch "
        f"({ranks} ranks): give a config file, or launch as one of {offered}"
    )


def _fail(rank_prefix: str, message: str, code: int) -> None:
    print(f"error:{rank_prefix} {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


def main(task, argv=None) -> int:
    """Parses flags, trains the Task class `task`, reports; returns the process exit code."""
    rank_prefix = ""
    events = None
    trainer = None

    def terminated():
        _abort(events, trainer)
        print(
            f"error:{rank_prefix} terminated (SIGTERM): log closed as aborted; stopping at the next "
            f"step with a checkpoint if every rank gets there in time",
            file=sys.stderr,
            flush=True,
        )

    # A launcher ends the other ranks with SIGTERM when one dies (horovodrun, mpirun,
    # srun --kill-on-bad-exit): the log is closed as aborted before SIGKILL follows.
    # Until the config is read, SIGTERM ends the process at once.
    termination.on_signals(terminated)
    try:
        config_path, overrides = parse_overrides(task, argv)
        # Horovod reads its cycle time during init: shorter when batch-norm groups chain collectives.
        bn_group = task.requested_batchnorm_group_size(config_path, overrides)
        cycle_time.set_for_batchnorm_groups(bn_group)
        spatial = peek(task.config_class, config_path, overrides, "parallel.spatial_ranks") or 1
        # Horovod's init, with the static process sets of the run's groups of ranks (spatial groups;
        # batch-norm groups, whose requested size counts a split's ranks in) for the job's size as
        # its launcher tells it; then the device pinned by local rank.
        dist = Distribution(group_sizes=(spatial, bn_group))
        rank_prefix = f" [rank {dist.rank}]" if dist.size > 1 else ""
        cfg, note = load_run_config(task, config_path, overrides, dist.size)
        termination.on_signals(terminated, cfg.runtime.sigterm_grace_s)
        # Threads and precision, before the first TensorFlow op: the collective below is one.
        runtime = runtime_lib.configure(cfg.runtime, dist)
        # Collective (checks the nodes of the groups when samples are split): every rank, here.
        mesh = dist.spatial_mesh(cfg.parallel.spatial_ranks)
        bound = task(cfg, mesh if mesh.is_split else None)
        run_dir = Path(cfg.run_dir)
        listeners, console = [], None
        if dist.is_root:
            console = Console()  # rank 0's console: every line a person reads, in order
            if note:
                console.note(note)
            run_dir.mkdir(parents=True, exist_ok=True)
            dump_config(cfg, run_dir / "config.yaml")
            listeners = _listeners(bound, cfg, run_dir, console)
        events = Events(listeners)
        trainer = Trainer(bound, dist, events, run_dir, runtime)
        result = trainer.run()
        events.close()
        if dist.is_root:
            report = run_report.finish(bound, result, run_dir, ExitCode.PREEMPTED)
            console.report(report)
            write_summary(
                result,
                run_dir / "summary.json",
                {
                    "benchmark": task.name,
                    "ranks": dist.size,
                    "nodes": dist.num_nodes,
                    "controller": dist.controller(),
                    "launcher": launcher_env(),
                    "metric_name": bound.metric_name,
                    "target": bound.target,
                    "log_check": report.log_check,
                },
            )
        # Every rank waits for rank 0's report: a rank that exits first with a
        # non-zero status would make the launcher kill rank 0 mid-write.
        dist.barrier()
        if result.failure:  # every rank agreed on it and says it, as on any bad input
            print(
                f"error:{rank_prefix} {' '.join(result.failure.message.split())}",
                file=sys.stderr,
                flush=True,
            )
            return result.failure.exit_code
        if result.status == "preempted":
            termination.stopped()  # in order: the SIGTERM deadline no longer applies
            return ExitCode.PREEMPTED
        return (
            ExitCode.OK
            if result.status in ("success", "evaluated", "benchmarked")
            else ExitCode.NOT_CONVERGED
        )
    except InputError as e:
        _abort(events, trainer)
        _fail(rank_prefix, " ".join(str(e).split()), ExitCode.INPUT_ERROR)
    except KeyboardInterrupt:
        _abort(events, trainer)
        _fail(rank_prefix, "interrupted", ExitCode.INTERRUPTED)
    except Exception:
        traceback.print_exc()
        _abort(events, trainer)
        _fail(rank_prefix, "crashed (traceback above)", ExitCode.CRASH)
    return ExitCode.CRASH


def _abort(events, trainer) -> None:
    """Closes the MLPerf log of a failed run with run_stop status 'aborted'."""
    if events is None:
        return
    try:
        if trainer is not None and trainer.state.started:
            events.on_run_stop("aborted", trainer.state.epoch)
        events.close()
    except Exception:  # the original error matters more than a failure to log it
        pass


def _listeners(task, cfg, run_dir, console) -> list:
    """Rank 0's listeners: the MLPerf log (a benchmark run only), the console, TensorBoard."""
    listeners = [console]
    if not (
        cfg.train.evaluate_only or cfg.train.benchmark_steps
    ):  # no benchmark run: no MLPerf log
        submission = {
            "benchmark": task.name,
            "org": cfg.mlperf.org,
            "division": cfg.mlperf.division,
            "status": cfg.mlperf.status,
            "platform": cfg.mlperf.platform,
        }
        instance = {
            k: getattr(cfg.mlperf, k)
            for k in ("instance_id", "number_of_instances")
            if getattr(cfg.mlperf, k) is not None
        }
        listeners.insert(
            0, MLPerfLogger(run_dir, submission, metric_key=task.metric_name, instance=instance)
        )
    if cfg.runtime.tensorboard:
        from common.reporting.tensorboard import TensorBoardListener  # --tensorboard only

        listeners.append(TensorBoardListener(run_dir / "tensorboard", yaml_text(cfg)))
    return listeners
