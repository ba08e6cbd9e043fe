"""TensorBoard event files of a run: training scalars, the validation metric, the config.

  tensorboard --logdir RUN_DIR/tensorboard

Every scalar is written at the run's global optimizer step (resumes included),
so training and validation curves share one x axis, as Model Garden's
trainer (Orbit) writes its evaluation summaries:

  train/loss, train/learning_rate, train/samples_per_s   every TrainLog (train.log_every_steps)
  train/epoch_loss, train/epoch_samples_per_s             each epoch's end
  eval/<RunInfo.target_name> (eval/eval_error, ...)       each evaluation

An epoch's scalars go at the global step that ended it (EpochTrain's), an
evaluation's at the step it evaluated (eval_stop's): the step the trainer
counts, read from the events (common.reporting.events).

At init_stop, three text summaries at step 0: `config` (the resolved YAML as
a markdown code block), `hyperparameters` and `run` (RunInfo's facts) as
markdown tables.
"""

import dataclasses

import tensorflow as tf

from common.reporting.events import Listener, RunInfo

# RunInfo fields shown in the `run` table (hyperparameters have their own).
_RUN_FIELDS = (
    "benchmark",
    "seed",
    "num_nodes",
    "ranks",
    "accelerators_per_node",
    "global_batch_size",
    "train_samples",
    "eval_samples",
    "steps_per_epoch",
    "n_epochs",
    "target_name",
    "target",
    "resumed_from",
)


def markdown_table(rows) -> str:
    """A two-column markdown table (name, value) of (key, value) pairs; '|' in a value is escaped."""
    lines = ["| name | value |", "|---|---|"]
    for key, value in rows:
        lines.append(f"| {key} | {str(value).replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


class TensorBoardListener(Listener):
    """Writes a run's TensorBoard events into `log_dir` (rank 0 only: the caller decides).

    Args:
      log_dir: the folder of the event files (made if missing).
      config_text: the run's resolved config (YAML text), shown as the `config` text summary.
    """

    def __init__(self, log_dir, config_text: str):
        self.log_dir = str(log_dir)
        self._writer = None
        self.config_text = config_text
        self.info: RunInfo | None = None
        self.closed = False

    @property
    def writer(self):
        # Made at the first event, not here: the listener exists before the trainer sets
        # TensorFlow's threads (common.runtime.configure), which must come before any TF op.
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        return self._writer

    def _scalars(self, step: int, values: dict) -> None:
        with self.writer.as_default():
            for tag, value in values.items():
                tf.summary.scalar(tag, float(value), step=step)

    def on_init_stop(self, info):
        self.info = info
        facts = dataclasses.asdict(info)
        with self.writer.as_default():
            tf.summary.text("config", f"```yaml\n{self.config_text.rstrip()}\n```", step=0)
            tf.summary.text("hyperparameters", markdown_table(info.hyperparameters.items()), step=0)
            tf.summary.text(
                "run",
                markdown_table((k, facts[k]) for k in _RUN_FIELDS if facts[k] is not None),
                step=0,
            )
        self.writer.flush()

    def on_train_log(self, log):
        self._scalars(
            log.global_step,
            {
                "train/loss": log.loss,
                "train/learning_rate": log.lr,
                "train/samples_per_s": log.samples_per_s,
            },
        )

    def on_epoch_stop(self, epoch, train):
        self._scalars(
            train.global_step,
            {"train/epoch_loss": train.loss, "train/epoch_samples_per_s": train.samples_per_s},
        )

    def on_eval_stop(self, epoch, global_step, value, loss):
        name = self.info.target_name if self.info is not None else "metric"
        self._scalars(
            global_step, {f"eval/{name}": value} | ({} if loss is None else {"eval/loss": loss})
        )
        self.writer.flush()  # the curve people watch: on disk at once, not at the next 2-minute flush

    def on_run_stop(self, status, epoch, checkpoint, failure):
        if self._writer is not None:
            self._writer.flush()

    def close(self):
        if not self.closed:
            self.closed = True
            if self._writer is not None:
                self._writer.close()
