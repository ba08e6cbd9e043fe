"""Segments one DeepCAM sample with a trained or imported model.

  python -m deepcam.predict CHECKPOINT SAMPLE.h5 --out DIR [--stats STATS.h5] [--config YAML]

CHECKPOINT is a folder written by training (RUN/checkpoints/step-NNNNNNNNNN) or
by deepcam.import_reference; its config.yaml (in the folder or its run
directory, or --config) gives the input fields and the model's sizes. The
sample is read and normalized as training reads it (deepcam.data), with
stats.h5 from --stats, else the config's data directory, else the folder
above the sample's (DATA/validation/x.h5 -> DATA/stats.h5). The model is
built at the sample's size and run in inference mode, in float32.

Writes DIR/logits.npy (float32 [H, W, 3]), DIR/mask.npy (uint8 [H, W], the
argmax: 0 background, 1 cyclone, 2 river) and DIR/prediction.png (the first
input field, the labels and the prediction side by side), and prints the
IoU against the sample's labels (the validation metric).
"""

import argparse
import sys
from pathlib import Path

import h5py
import numpy as np
import tensorflow as tf

from common import config as config_lib
from common.cli import tool_main
from common.errors import InputError
from common.model_folder import find_run_config, restore_model_weights
from deepcam import data, sample_files, task
from deepcam.config import N_CLASSES, DeepCAMConfig
from deepcam.layout import DATA_KEY, STATS_FILE
from deepcam.model import build_model

CLASS_NAMES = ("background", "cyclone", "river")
CLASS_COLORS = ("whitesmoke", "red", "blue")


def load_model_config(path, overrides=None) -> DeepCAMConfig:
    """A DeepCAM config to build a model from (data.data_dir may be unset)."""
    return config_lib.load_model_config(DeepCAMConfig, path, overrides)


def stats_folder(stats, cfg: DeepCAMConfig, sample) -> Path:
    """The folder whose stats.h5 normalizes the sample (deepcam.data reads it by that name)."""
    if stats is not None:
        stats = Path(stats)
        if stats.is_dir():
            return stats
        if stats.name != STATS_FILE:
            raise InputError(f"--stats {stats}: expected a file named {STATS_FILE} (or its folder)")
        return stats.parent
    if cfg.data.data_dir and (Path(cfg.data.data_dir) / STATS_FILE).is_file():
        return Path(cfg.data.data_dir)
    return Path(sample).resolve().parent.parent


def sample_size(path) -> tuple[int, int]:
    """(height, width) of a sample file."""
    try:
        with h5py.File(path, "r") as f:
            shape = f[DATA_KEY].shape
    except KeyError:
        raise InputError(f"{path}: missing dataset {DATA_KEY}") from None
    except OSError as e:
        raise InputError(
            f"{path}: unreadable HDF5 sample ({' '.join(str(e).split())[:200]})"
        ) from None
    if len(shape) != 3:
        raise InputError(
            f"{path}: {DATA_KEY} has shape {shape}, expected (height, width, channels)"
        )
    return int(shape[0]), int(shape[1])


def predict(checkpoint, sample, out_dir, stats=None, config=None, print_fn=print) -> dict:
    """Runs the model of CHECKPOINT on SAMPLE; writes logits, mask and picture; returns paths and IoU."""
    config = Path(config) if config else find_run_config(checkpoint)
    if config is None:
        raise InputError(f"{checkpoint}: no config.yaml in it or its run directory; pass --config")
    cfg = load_model_config(config)
    channels = cfg.data.channels
    shift, scale = data.load_normalization(stats_folder(stats, cfg, sample), channels)
    height, width = sample_size(sample)
    stride = cfg.model.output_stride
    if height % stride or width % stride:
        raise InputError(
            f"{sample}: size {height}x{width} is not a multiple of the output stride {stride}"
        )
    x, labels = sample_files.read_sample(sample, channels, shift, scale, height, width)

    net = build_model(
        height,
        width,
        len(channels),
        N_CLASSES,
        width_multiplier=cfg.model.width,
        middle_blocks=cfg.model.middle_blocks,
    )
    restore_model_weights(net, checkpoint)
    logits = net(tf.constant(x[None]), training=False)[0].numpy().astype(np.float32)
    mask = np.argmax(logits, axis=-1).astype(np.uint8)
    iou = float(task.per_sample_iou(tf.constant(labels[None]), tf.constant(logits[None]))[0])

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "logits": out_dir / "logits.npy",
        "mask": out_dir / "mask.npy",
        "image": out_dir / "prediction.png",
    }
    np.save(paths["logits"], logits)
    np.save(paths["mask"], mask)
    plot_prediction(
        paths["image"],
        x[..., 0],
        labels,
        mask,
        field_index=channels[0],
        title=f"{Path(sample).name}: IoU {iou:.3f}",
    )
    print_fn(
        f"[predict] {sample}: IoU {iou:.4f}; logits {paths['logits']}, mask {paths['mask']}, "
        f"picture {paths['image']}"
    )
    return {**paths, "iou": iou}


def plot_prediction(path, field, labels, mask, field_index=0, title="") -> None:
    """Input field, labels and prediction side by side, as a PNG."""
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure  # no pyplot: no display, no global figure state

    height, width = labels.shape
    fig = Figure(figsize=(15, 15 * height / width / 3 + 0.8), layout="constrained")
    axes = fig.subplots(1, 3)
    classes = ListedColormap(CLASS_COLORS)
    legend = ", ".join(f"{name} {color}" for name, color in zip(CLASS_NAMES[1:], CLASS_COLORS[1:]))
    panels = (
        (field, "viridis", f"field {field_index} (normalized)"),
        (labels, classes, f"labels ({legend})"),
        (mask, classes, "prediction"),
    )
    for ax, (image, cmap, name) in zip(axes, panels):
        is_classes = cmap is classes
        ax.imshow(
            image,
            cmap=cmap,
            vmin=0 if is_classes else None,
            vmax=len(CLASS_COLORS) - 1 if is_classes else None,
            interpolation="nearest",
        )
        ax.set_title(name)
        ax.set_axis_off()
    fig.suptitle(title)
    fig.savefig(path, dpi=100)


@tool_main()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "checkpoint", help="checkpoint folder (training's step-NNNNNNNNNN or an import)"
    )
    parser.add_argument(
        "sample", help="sample file in the public layout (climate/data, climate/labels_0)"
    )
    parser.add_argument(
        "--out", required=True, help="folder for logits.npy, mask.npy, prediction.png"
    )
    parser.add_argument(
        "--stats",
        help=f"{STATS_FILE} (default: the config's data directory's, else the one "
        "in the folder above the sample's)",
    )
    parser.add_argument("--config", help="config.yaml (default: the checkpoint's)")
    args = parser.parse_args(argv)
    predict(args.checkpoint, args.sample, args.out, args.stats, args.config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
