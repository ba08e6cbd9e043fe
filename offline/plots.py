"""PNG figures of the offline reports: curves against time and epoch, and a roofline."""

import os

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402


def save_figure(fig, path) -> None:
    """Writes the figure to `path` as PNG through a temporary name (never half a file), closes it."""
    fig.savefig(f"{path}.tmp.png", dpi=100)
    plt.close(fig)
    os.replace(f"{path}.tmp.png", path)


def plot_curves_time_and_epoch(history, metric_name: str, target: float, title: str, path) -> None:
    """Metric and loss against epoch and against time since run_start; throughput per epoch."""
    evaluated = [h for h in history if "metric" in h]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, x_key, x_label in (
        (axes[0], "epoch", "epoch"),
        (axes[1], "time_s", "seconds since run_start"),
    ):
        ax.plot(
            [h[x_key] for h in evaluated], [h["metric"] for h in evaluated], "o-", label=metric_name
        )
        ax.plot(
            [h[x_key] for h in history],
            [h["loss"] for h in history],
            "s--",
            alpha=0.7,
            label="train loss",
        )
        ax.axhline(target, color="red", linestyle=":", label=f"target {target}")
        ax.set_xlabel(x_label)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[2].bar(
        [h["epoch"] for h in history], [h["samples_per_s"] for h in history], color="tab:green"
    )
    axes[2].set_xlabel("epoch")
    axes[2].set_ylabel("training samples/s (all ranks)")
    axes[2].grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)


def plot_roofline(machine: dict, points: list, title: str, path) -> None:
    """Roofline of the measured machine limits with runs placed on it.

    Args:
      machine: {'peak_flop_per_s': {precision: value}, 'memory_bytes_per_s': value}.
      points: [(label, FLOP per byte, achieved FLOP/s)].
    """
    import numpy as np

    bandwidth = machine["memory_bytes_per_s"]
    intensities = np.logspace(-2, 4, 200)
    fig, ax = plt.subplots(figsize=(7, 5))
    for precision, peak in machine["peak_flop_per_s"].items():
        ax.plot(
            intensities,
            np.minimum(peak, bandwidth * intensities),
            label=f"{precision} peak {peak / 1e9:.0f} GFLOP/s",
        )
    ax.plot(
        intensities,
        bandwidth * intensities,
        ":",
        color="gray",
        label=f"memory {bandwidth / 1e9:.1f} GB/s",
    )
    for label, intensity, achieved in points:
        ax.plot(
            [intensity],
            [achieved],
            "o",
            markersize=9,
            label=f"{label}: {achieved / 1e9:.1f} GFLOP/s",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    top = max(machine["peak_flop_per_s"].values())
    ax.set_ylim(bottom=min([p[2] for p in points] + [bandwidth * 0.01]) / 3, top=top * 3)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of memory traffic)")
    ax.set_ylabel("FLOP/s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, path)
