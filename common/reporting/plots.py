"""PNG plot of a run, drawn on rank 0 at the end of training (matplotlib, no display needed).

The figures of the offline reports are in offline/plots.py.
"""

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_training_curve(history, metric_name: str, target: float, title: str, path) -> None:
    """Validation metric and train loss per epoch (target as a line), and samples/s per epoch."""
    epochs = [h["epoch"] for h in history]
    evaluated = [h for h in history if "metric" in h]
    fig, (ax_metric, ax_speed) = plt.subplots(1, 2, figsize=(11, 4))
    ax_metric.plot(
        [h["epoch"] for h in evaluated], [h["metric"] for h in evaluated], "o-", label=metric_name
    )
    ax_metric.plot(epochs, [h["loss"] for h in history], "s--", alpha=0.7, label="train loss")
    ax_metric.axhline(target, color="red", linestyle=":", label=f"target {target}")
    ax_metric.set_xlabel("epoch")
    ax_metric.set_yscale("log")
    ax_metric.legend()
    ax_metric.grid(alpha=0.3)
    ax_speed.bar(epochs, [h["samples_per_s"] for h in history], color="tab:green")
    ax_speed.set_xlabel("epoch")
    ax_speed.set_ylabel("training samples/s (all ranks)")
    ax_speed.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)


def save_figure(fig, path) -> None:
    """Writes the figure to path as PNG (through a temporary file, so a reader never sees half of it) and closes it."""
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, Path(path))
