"""Synthetic DeepCAM data with learnable labels, in the public on-disk layout.

Each sample has 16 smooth random fields (sums of long-wavelength plane waves
plus a little noise), each channel with its own offset and scale as physical
fields have, so normalization by stats.h5 matters. Two kinds of events are
imprinted where the labels say they are:
  class 1, tropical cyclones: compact discs, a pressure dip in channel 0 and a
           wind bump in channel 1;
  class 2, atmospheric rivers: long thin wavy bands, moisture in channels 3
           and 4.
Imprints have sharp logistic edges at the labelled boundary, so the
segmentation is learnable; the other channels are distractors. Class
frequencies default to the real data's (background 98.6%, cyclone 0.05%,
river 1.3% of pixels); at small sizes a cyclone of 0.05% would be a few
pixels, so the CPU configs raise it (see --cyclone-fraction), and bands are
kept at least 4 pixels wide.

  python -m deepcam.synthetic --output-dir data/deepcam --height 128 --width 192 --n-train 512 --n-valid 64

stats.h5 is computed from the training files afterwards (deepcam.stats).
"""

import argparse
import os
import sys
from pathlib import Path

import h5py
import numpy as np

from common.inputs.synthetic_files import already_written, write_files
from deepcam.config import N_CHANNELS
from deepcam.layout import DATA_KEY, LABEL_KEY, STATS_FILE
from deepcam.stats import compute_stats

FORMAT_VERSION = 1
REAL_FRACTIONS = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)
EVENTS_PER_SAMPLE = 1.5  # mean number of cyclones, and of rivers, per sample
CYCLONE_CHANNELS = {0: -3.0, 1: 3.0}
RIVER_CHANNELS = {3: 3.0, 4: 2.0}


def _channel_units(seed: int = 1234):
    """Fixed per-channel offset and scale (the fields' physical units)."""
    rng = np.random.default_rng(seed)
    return rng.uniform(-50, 300, N_CHANNELS).astype(np.float32), 10 ** rng.uniform(
        -1, 2, N_CHANNELS
    )


def _smooth_field(rng, height, width, n_waves=6):
    """Sum of plane waves with wavelengths of a quarter of the image or more (std ~0.7)."""
    y = np.arange(height, dtype=np.float32)[:, None]
    x = np.arange(width, dtype=np.float32)[None, :]
    field = np.zeros((height, width), np.float32)
    for _ in range(n_waves):
        k = rng.uniform(0.5, 4.0) * 2 * np.pi / max(height, width)
        angle, phase = rng.uniform(0, 2 * np.pi, 2)
        ky, kx = k * np.sin(angle), k * np.cos(angle)
        # sin(a + b) = sin a cos b + cos a sin b keeps it to outer products.
        field += (
            np.sin(kx * x + phase) * np.cos(ky * y) + np.cos(kx * x + phase) * np.sin(ky * y)
        ) / np.sqrt(n_waves)
    return field


def _edge(z, softness):
    """Logistic step: 1 well inside (z > 0), 0.5 on the boundary, 0 outside."""
    return 1.0 / (1.0 + np.exp(-np.clip(z / softness, -30, 30)))


def event_sizes(height, width, cyclone_fraction, river_fraction):
    """Cyclone radius, river half-width and length that give the mean pixel fractions."""
    pixels = height * width
    radius = max(2.0, np.sqrt(cyclone_fraction * pixels / (np.pi * EVENTS_PER_SAMPLE)))
    half_width = max(2.0, 0.01 * height)
    length = river_fraction * pixels / EVENTS_PER_SAMPLE / (2 * half_width)
    return radius, half_width, length


def make_sample(rng, height, width, cyclone_fraction, river_fraction):
    """One sample: (fields float32 [H, W, 16], labels uint8 [H, W])."""
    offset, scale = _channel_units()
    fields = np.stack([_smooth_field(rng, height, width) for _ in range(N_CHANNELS)], axis=-1)
    fields += 0.05 * rng.standard_normal(fields.shape, dtype=np.float32)
    labels = np.zeros((height, width), np.uint8)
    radius, half_width, length = event_sizes(height, width, cyclone_fraction, river_fraction)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)

    for _ in range(rng.poisson(EVENTS_PER_SAMPLE)):  # rivers first: cyclones win overlaps
        x0, y0 = rng.uniform(0, width), rng.uniform(0, height)
        theta = rng.uniform(-0.6, 0.6) + (np.pi if rng.random() < 0.5 else 0.0)
        along = (xx - x0) * np.cos(theta) + (yy - y0) * np.sin(theta)
        across = -(xx - x0) * np.sin(theta) + (yy - y0) * np.cos(theta)
        wiggle = rng.uniform(0, 2 * half_width) * np.sin(
            2 * np.pi * along / max(length, 1) + rng.uniform(0, 6.3)
        )
        shape = (
            _edge(half_width - np.abs(across - wiggle), 0.3)
            * _edge(along, 0.3)
            * _edge(length - along, 0.3)
        )
        for c, amp in RIVER_CHANNELS.items():
            fields[..., c] += amp * shape
        labels[shape > 0.5] = 2
    for _ in range(rng.poisson(EVENTS_PER_SAMPLE)):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        r = radius * rng.uniform(0.8, 1.2)
        shape = _edge(r - np.hypot(xx - cx, yy - cy), 0.3)
        for c, amp in CYCLONE_CHANNELS.items():
            fields[..., c] += amp * shape
        labels[shape > 0.5] = 1
    return (fields * scale + offset).astype(np.float32), labels


def write_sample(path, fields, labels, label_dtype="float32") -> int:
    """Writes one sample file in the public layout (temporary name, then rename)."""
    tmp = f"{path}.tmp"
    with h5py.File(tmp, "w") as f:
        f.create_dataset(DATA_KEY, data=fields)
        f.create_dataset(LABEL_KEY, data=labels.astype(label_dtype))
    os.replace(tmp, path)
    return os.path.getsize(path)


def _write_one(job) -> int:
    path, height, width, seed, cyclone_fraction, river_fraction, label_dtype = job
    fields, labels = make_sample(
        np.random.default_rng(seed), height, width, cyclone_fraction, river_fraction
    )
    return write_sample(path, fields, labels, label_dtype)


def generate(
    output_dir,
    height: int,
    width: int,
    n_train: int,
    n_valid: int,
    seed: int = 0,
    cyclone_fraction: float = REAL_FRACTIONS[1],
    river_fraction: float = REAL_FRACTIONS[2],
    label_dtype: str = "float32",
    workers: int = 0,
    progress=None,
) -> None:
    """Writes DATA/train/*.h5, DATA/validation/*.h5 and DATA/stats.h5 (idempotent).

    `progress`: None prints on stdout (a line redrawn on a terminal), a function of one
    line gets the lines instead.
    """
    spec = dict(
        height=height,
        width=width,
        n_train=n_train,
        n_valid=n_valid,
        seed=seed,
        cyclone_fraction=cyclone_fraction,
        river_fraction=river_fraction,
        label_dtype=label_dtype,
        version=FORMAT_VERSION,
    )
    stats = Path(output_dir) / STATS_FILE
    if already_written(output_dir, spec) and stats.exists():
        (progress or print)(f"[synthetic] {output_dir} already holds this data set; nothing to do")
        return
    rng = np.random.default_rng(seed)
    jobs = []
    for split, count in (("train", n_train), ("validation", n_valid)):
        split_dir = Path(output_dir) / split
        split_dir.mkdir(parents=True, exist_ok=True)
        seeds = rng.integers(0, 2**63 - 1, size=count)
        jobs += [
            (
                str(split_dir / f"data-synthetic-{split}-{i:07d}.h5"),
                height,
                width,
                int(seeds[i]),
                cyclone_fraction,
                river_fraction,
                label_dtype,
            )
            for i in range(count)
        ]
    if not already_written(output_dir, spec):
        stats.unlink(missing_ok=True)  # stale once the files change
    write_files(output_dir, spec, jobs, _write_one, workers, progress, chunksize=4)
    if not stats.exists():
        compute_stats(output_dir, workers, progress)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--width", type=int, default=1152)
    parser.add_argument("--n-train", type=int, default=256)
    parser.add_argument("--n-valid", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cyclone-fraction",
        type=float,
        default=REAL_FRACTIONS[1],
        help="mean fraction of cyclone pixels (real data: 0.00046)",
    )
    parser.add_argument(
        "--river-fraction",
        type=float,
        default=REAL_FRACTIONS[2],
        help="mean fraction of river pixels (real data: 0.0133)",
    )
    parser.add_argument("--label-dtype", default="float32", choices=["float32", "int32", "uint8"])
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args(argv)
    generate(
        args.output_dir,
        args.height,
        args.width,
        args.n_train,
        args.n_valid,
        args.seed,
        args.cyclone_fraction,
        args.river_fraction,
        args.label_dtype,
        args.workers,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
