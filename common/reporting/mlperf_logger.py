"""Maps trainer events to MLPerf log lines (`mlperf_logging.mllog`), on rank 0.

The log grows in `mlperf.log.partial`, renamed `mlperf.log` once the run stops; a log already
there (a resumed run) is kept as mlperf.log.1, .2...
"""

import logging
import os
import re
import threading
from pathlib import Path

from mlperf_logging.mllog import mllog

from common.reporting.events import Listener, RunInfo

RESUMED_KEY = "resumed_from"
LOG_NAME = "mlperf.log"
_REPO = Path(__file__).parents[2]  # common/reporting/mlperf_logger.py -> the repository
# The frame mllog names, above its own: _write, _event/_start/_end, the on_ method, the dispatch
# of `Events`, then the trainer's call of `Events`.
_STACK_OFFSET = 5


class MLPerfLogger(Listener):
    """Writes the MLPerf log of one run; each line names the trainer's call of `Events`.

    Args:
      output_dir: where mlperf.log goes.
      submission: the submission_* keys (benchmark, org, division, status, platform).
      metric_key: the key of the quality metric ('eval_error', 'eval_accuracy').
      instance: for weak scaling, {'instance_id': i, 'number_of_instances': m}.
    """

    def __init__(self, output_dir, submission: dict, metric_key: str, instance: dict | None = None):
        self.metric_key = metric_key
        self._instance = dict(instance or {})
        self.final = Path(output_dir) / LOG_NAME
        self.partial = Path(output_dir) / (LOG_NAME + ".partial")
        self.partial.unlink(missing_ok=True)
        # Not registered with logging: no other handler reaches it.
        self._logger = logging.Logger(LOG_NAME, logging.INFO)
        self._handler = logging.FileHandler(self.partial, encoding="utf-8")  # flushed every line
        self._logger.addHandler(self._handler)
        # root_dir: trimmed from the file names, as a regular expression.
        self._mllog = mllog.MLLogger(
            self._logger,
            default_stack_offset=_STACK_OFFSET,
            root_dir=re.escape(str(_REPO)),
        )
        self._submission = dict(submission)
        self._closed = False
        # SIGTERM closes the log from another thread: one line at a time, none after close.
        self._lock = threading.RLock()

    def _write(self, write, key, value, metadata: dict):
        with self._lock:
            if not self._closed:
                write(key, value, metadata)

    # Called by the on_ methods only (the frames _STACK_OFFSET counts).
    def _event(self, key, value, **metadata):
        self._write(self._mllog.event, key, value, metadata)

    def _start(self, key, **metadata):
        self._write(self._mllog.start, key, None, metadata)

    def _end(self, key, **metadata):
        self._write(self._mllog.end, key, None, metadata)

    def on_init_start(self):
        self._start("init_start")
        for key in ("benchmark", "org", "division", "status", "platform"):
            self._event(f"submission_{key}", self._submission[key])

    def on_init_stop(self, info: RunInfo):
        self._event("seed", info.seed)
        self._event("number_of_nodes", info.num_nodes)
        self._event("number_of_ranks", info.ranks)
        for key, value in self._instance.items():
            self._event(key, value)
        self._event("accelerators_per_node", info.accelerators_per_node)
        self._event("global_batch_size", info.global_batch_size)
        self._event("train_samples", info.train_samples)
        self._event("eval_samples", info.eval_samples)
        for key, value in info.hyperparameters.items():
            self._event(key, value)
        if info.resumed_from:
            # Not an MLPerf key: a resumed run is no benchmark result, and scoring refuses it.
            self._event(RESUMED_KEY, info.resumed_from)
        self._end("init_stop")

    def on_staging_start(self):
        self._start("staging_start")

    def on_staging_stop(self, stats):
        self._end(
            "staging_stop",
            files=stats.files,
            bytes=stats.bytes,
            seconds=stats.seconds,
            gb_per_s=stats.gb_per_s,
        )

    def on_caches_cleared(self, cleared, files):
        self._event("cache_clear", bool(cleared), files=files, method="posix_fadvise(DONTNEED)")

    def on_run_start(self):
        self._start("run_start")

    def on_epoch_start(self, epoch, global_step):
        self._start("epoch_start", epoch_num=epoch, step_num=global_step)

    def on_epoch_stop(self, epoch, train):
        self._end("epoch_stop", epoch_num=epoch, step_num=train.global_step)
        # The mean loss of the epoch's steps over all ranks; the LR of its first step.
        self._event("train_loss", train.loss, epoch_num=epoch, step_num=train.global_step)
        self._event("learning_rate", train.lr, epoch_num=epoch, step_num=train.global_step)
        self._event("tracked_stats", {"throughput": train.samples_per_s}, step=epoch)

    def on_eval_start(self, epoch):
        self._start("eval_start", epoch_num=epoch)

    def on_eval_stop(self, epoch, global_step, value, loss):
        self._end("eval_stop", epoch_num=epoch)
        self._event(self.metric_key, value, epoch_num=epoch, step_num=global_step)
        if loss is not None:
            self._event("eval_loss", loss, epoch_num=epoch, step_num=global_step)

    def on_run_stop(self, status, epoch, checkpoint, failure):
        # Where a run stopped on request can go on from; why one that could not go on stopped.
        extra = {"checkpoint": checkpoint} if checkpoint else {}
        if failure:
            named = {k: getattr(failure, k) for k in ("reason", "step_num", "loss", "input_file")}
            extra |= {k: v for k, v in named.items() if v is not None}
        self._end("run_stop", status=status, epoch_num=epoch, **extra)

    def close(self):
        """Closes the file and moves it to its final name (idempotent, from any thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._logger.removeHandler(self._handler)
            self._handler.close()
            if self.final.exists():
                n = 1
                while self.final.with_name(f"{LOG_NAME}.{n}").exists():
                    n += 1
                os.replace(self.final, self.final.with_name(f"{LOG_NAME}.{n}"))
            os.replace(self.partial, self.final)
