"""Maps trainer events to MLPerf log lines (`mlperf_logging.mllog`).

Only rank 0 writes. The log grows in `<output-dir>/mlperf.log.partial` and is
renamed to `mlperf.log` once the run has stopped, so `mlperf.log` is always a
finished log. A log already there (a resumed run) is kept as mlperf.log.1, .2...
"""

import json
import os
import threading
import time
from pathlib import Path

from mlperf_logging.mllog import constants

from common.reporting.events import CallSite, Listener, RunInfo

RESUMED_KEY = "resumed_from"
LOG_NAME = "mlperf.log"


def encode_line(
    event_type: str, key: str, value, metadata: dict, time_ms: int | None = None
) -> str:
    """One MLPerf log line, as `mlperf_logging.mllog` writes it (':::MLLOG {json}', keys in its order)."""
    record = {
        "namespace": "",
        "time_ms": int(time.time() * 1e3) if time_ms is None else time_ms,
        "event_type": event_type,
        "key": key,
        "value": value,
        "metadata": metadata,
    }
    return ":::MLLOG " + json.dumps(record, default=_json_default)


def _json_default(value):
    if hasattr(value, "item"):  # NumPy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {value!r}")


class MLPerfLogger(Listener):
    """Listener that writes the MLPerf log of one run.

    Each line's metadata names the trainer's call site that the event carries
    (`CallSite`), in mllog's format, without mllog's stack walk (whose depth
    would change with every layer between the trainer and this class).

    Args:
      output_dir: where mlperf.log goes.
      submission: the submission_* keys (benchmark, org, division, status, platform).
      metric_key: the key of the quality metric ('eval_error', 'eval_accuracy').
      instance: for weak scaling, {'instance_id': i, 'number_of_instances': m}.
    """

    def __init__(self, output_dir, submission: dict, metric_key: str, instance: dict | None = None):
        self.metric_key = metric_key
        self._instance = dict(instance or {})  # weak scaling: instance_id, number_of_instances
        self.final = Path(output_dir) / LOG_NAME
        self.partial = Path(output_dir) / (LOG_NAME + ".partial")
        self.partial.unlink(missing_ok=True)
        self._file = open(self.partial, "a", encoding="utf-8")
        self._submission = dict(submission)
        self._closed = False
        # SIGTERM closes the log from another thread (common.run.termination) while
        # the main thread may be writing a line: one at a time, none after close.
        self._lock = threading.RLock()

    def _write(self, event_type, key, value, site: CallSite, metadata: dict):
        line = encode_line(
            event_type, key, value, {"file": site.file, "lineno": site.line, **metadata}
        )
        with self._lock:
            if not self._closed:
                self._file.write(line + "\n")
                self._file.flush()

    def _event(self, key, value, site, **metadata):
        self._write(constants.POINT_IN_TIME, key, value, site, metadata)

    def _start(self, key, site, **metadata):
        self._write(constants.INTERVAL_START, key, None, site, metadata)

    def _end(self, key, site, **metadata):
        self._write(constants.INTERVAL_END, key, None, site, metadata)

    def on_init_start(self, site):
        self._start("init_start", site)
        for key in ("benchmark", "org", "division", "status", "platform"):
            self._event(f"submission_{key}", self._submission[key], site)

    def on_init_stop(self, info: RunInfo, site):
        self._event("seed", info.seed, site)
        self._event("number_of_nodes", info.num_nodes, site)
        self._event("number_of_ranks", info.ranks, site)
        for key, value in self._instance.items():
            self._event(key, value, site)
        self._event("accelerators_per_node", info.accelerators_per_node, site)
        self._event("global_batch_size", info.global_batch_size, site)
        self._event("train_samples", info.train_samples, site)
        self._event("eval_samples", info.eval_samples, site)
        for key, value in info.hyperparameters.items():
            self._event(key, value, site)
        if info.resumed_from:
            # Not an MLPerf key: a resumed run is no benchmark result, and scoring refuses it.
            self._event(RESUMED_KEY, info.resumed_from, site)
        self._end("init_stop", site)

    def on_staging_start(self, site):
        self._start("staging_start", site)

    def on_staging_stop(self, stats, site):
        self._end(
            "staging_stop",
            site,
            files=stats.files,
            bytes=stats.bytes,
            seconds=stats.seconds,
            gb_per_s=stats.gb_per_s,
        )

    def on_caches_cleared(self, cleared, files, site):
        # True only when this rank's input files were evicted from the page cache
        # (common.inputs.page_cache); metadata says how many files that covered.
        self._event(
            "cache_clear", bool(cleared), site, files=files, method="posix_fadvise(DONTNEED)"
        )

    def on_run_start(self, site):
        self._start("run_start", site)

    # step_num: the run's global step, which the references log with epochs and evaluations.
    def on_epoch_start(self, epoch, global_step, site):
        self._start("epoch_start", site, epoch_num=epoch, step_num=global_step)

    def on_epoch_stop(self, epoch, train, site):
        self._end("epoch_stop", site, epoch_num=epoch, step_num=train.global_step)
        # train_loss: the mean of the epoch's step losses over all ranks, where DeepCAM's reference
        # logs its last batch's (driver/trainer.py); learning_rate: the LR of the epoch's first
        # step (the reference's: of its last).
        self._event("train_loss", train.loss, site, epoch_num=epoch, step_num=train.global_step)
        self._event("learning_rate", train.lr, site, epoch_num=epoch, step_num=train.global_step)
        self._event("tracked_stats", {"throughput": train.samples_per_s}, site, step=epoch)

    def on_eval_start(self, epoch, site):
        self._start("eval_start", site, epoch_num=epoch)

    def on_eval_stop(self, epoch, global_step, value, loss, site):
        self._end("eval_stop", site, epoch_num=epoch)
        self._event(self.metric_key, value, site, epoch_num=epoch, step_num=global_step)
        if loss is not None:
            self._event("eval_loss", loss, site, epoch_num=epoch, step_num=global_step)

    def on_run_stop(self, status, epoch, checkpoint, failure, site):
        # A run stopped on request says where it can go on from (aborted-with-checkpoint); one
        # that could not go on says why, at which step and with which loss.
        extra = {"checkpoint": checkpoint} if checkpoint else {}
        if failure:
            named = {k: getattr(failure, k) for k in ("reason", "step_num", "loss", "input_file")}
            extra |= {k: v for k, v in named.items() if v is not None}
        self._end("run_stop", site, status=status, epoch_num=epoch, **extra)

    def close(self):
        """Closes the file and moves it to its final name (idempotent, from any thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close_file()

    def _close_file(self):
        self._file.close()
        if self.final.exists():
            n = 1
            while self.final.with_name(f"{LOG_NAME}.{n}").exists():
                n += 1
            os.replace(self.final, self.final.with_name(f"{LOG_NAME}.{n}"))
        os.replace(self.partial, self.final)
