"""Predict the 4 cosmological parameters of the samples of one TFRecord file.

  python -m cosmoflow.predict runs/cosmo/checkpoints/step-0000065536 sample.tfrecord [--out DIR]
  python -m cosmoflow.predict runs/imported sample.tfrecord.gz        # a cosmoflow.import_reference folder

CHECKPOINT is a training checkpoint folder or a model-only one; its config (the
model's sizes, the sample shape and the preprocessing) is the run's config.yaml
(common.model_folder.find_run_config) unless --config names one. Samples are read
and preprocessed exactly as in training (cosmoflow/data.py), the model runs in
inference mode (no dropout). Prints each sample's predicted parameters next to
the file's targets and the mean absolute error, and writes the same to
DIR/<file stem>.prediction.json. A bad file or folder: one line naming it, exit 2.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import tf_keras

from common import config as config_lib
from common.cli import tool_main
from common.errors import InputError, write_text_atomic
from common.model_folder import find_run_config, restore_model_weights
from cosmoflow import data, sample_files
from cosmoflow import model as model_lib
from cosmoflow.config import CosmoFlowConfig


def load_model_config(path) -> CosmoFlowConfig:
    """A CosmoFlow config read for the model's sizes and the preprocessing only (data.data_dir may be unset)."""
    return config_lib.load_model_config(CosmoFlowConfig, path)


def load_model(checkpoint, config_path=None) -> tuple[tf_keras.Model, CosmoFlowConfig]:
    """The model of a checkpoint folder, with its weights, and the config it was built from."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise InputError(f"checkpoint folder not found: {checkpoint}")
    config_path = config_path or find_run_config(checkpoint)
    if config_path is None:
        raise InputError(
            f"{checkpoint}: no config.yaml in it or in its run directory; pass --config"
        )
    cfg = load_model_config(config_path)
    model = model_lib.from_config(cfg)
    restore_model_weights(model, checkpoint)
    return model, cfg


def read_samples(path, cfg: CosmoFlowConfig) -> tuple[np.ndarray, np.ndarray]:
    """Every sample of one TFRecord file (gzip or not), preprocessed as in training: (x, targets)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"sample file not found: {path}")
    problem = sample_files.find_bad_file([str(path)], cfg.data.sample_shape)
    if problem:
        raise InputError(problem)
    ds = data.make_dataset(
        [str(path)],
        cfg.data.sample_shape,
        batch_size=1,
        training=False,
        compression=data.detect_compression(str(path)),
        parallelism=1,
        prefetch=1,
    )
    transform = data.TRANSFORMS[cfg.data.transform]
    xs, ys = zip(*((transform(x).numpy()[0], y.numpy()[0]) for x, y in ds))
    return np.stack(xs), np.stack(ys)


def predict(model, x: np.ndarray, batch_size: int = 4) -> np.ndarray:
    """Inference mode: dropout off."""
    return np.concatenate(
        [model(x[i : i + batch_size], training=False).numpy() for i in range(0, len(x), batch_size)]
    )


def file_stem(path) -> str:
    """sample.tfrecord.gz -> sample: the name without the record suffix."""
    name = Path(path).name
    for suffix in sorted(data.SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def run(checkpoint, sample_file, out_dir=".", config_path=None) -> dict:
    """Predicts every sample of `sample_file`; writes and returns the report."""
    model, cfg = load_model(checkpoint, config_path)
    x, targets = read_samples(sample_file, cfg)
    predictions = predict(model, x)
    errors = np.abs(predictions - targets)
    report = {
        "checkpoint": str(Path(checkpoint).resolve()),
        "file": str(Path(sample_file).resolve()),
        "samples": [
            {"prediction": p.tolist(), "target": t.tolist(), "mae": float(e.mean())}
            for p, t, e in zip(predictions, targets, errors)
        ],
        "mae": float(errors.mean()),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report["output"] = str(out_dir / f"{file_stem(sample_file)}.prediction.json")
    write_text_atomic(report["output"], json.dumps(report, indent=2))
    return report


def _print_report(report: dict) -> None:
    def fmt(values):
        return " ".join(f"{v:+.4f}" for v in values)

    for i, s in enumerate(report["samples"]):
        print(
            f"sample {i}: predicted {fmt(s['prediction'])}   target {fmt(s['target'])}   MAE {s['mae']:.4f}"
        )
    print(
        f"MAE over {len(report['samples'])} sample(s): {report['mae']:.4f}; written to {report['output']}"
    )


@tool_main()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cosmoflow.predict",
        description="Predict the cosmological parameters of a TFRecord file's samples.",
    )
    parser.add_argument(
        "checkpoint",
        help="training checkpoint folder (run/checkpoints/step-NNNNNNNNNN) or import folder",
    )
    parser.add_argument("sample", help="TFRecord file in the public CosmoFlow layout (gzip or not)")
    parser.add_argument(
        "--out", default=".", help="folder for <file stem>.prediction.json (default: .)"
    )
    parser.add_argument(
        "--config", help="config of the model (default: the checkpoint's run config.yaml)"
    )
    args = parser.parse_args(argv)
    report = run(args.checkpoint, args.sample, args.out, args.config)
    _print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
