"""Where the input pipeline's batches arrive once its last stage prefetches them to a device.

  python tests/device_prefetch_probe.py COSMOFLOW_TRAIN_DIR DEEPCAM_TRAIN_DIR

This CPU stands in for a GPU host: before TensorFlow starts, its one CPU is split into two
logical devices, and the stage prefetches to the second, /cpu:1, where the steps do not run
(/cpu:0), as a GPU's batches come from host memory. Per benchmark (CosmoFlow's int16 counts,
DeepCAM's float32 fields and uint8 labels, each from its own make_dataset), it prints one JSON
line: the device and dtype of the batches `next()` returns with the stage and without it (the
negative control), whether their values are the host pipeline's, and the loss of a compiled
TrainStep (which calls `next()` on the iterator itself) on batches that came through the stage.
"""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import numpy as np  # noqa: E402

from common.inputs.pipeline import prefetch_to  # noqa: E402
from common.run.steps import TrainStep  # noqa: E402
from cosmoflow import data as cosmoflow_data  # noqa: E402
from deepcam import data as deepcam_data  # noqa: E402
from tests.helpers import SingleProcess  # noqa: E402

TARGET = "/cpu:1"
N_BATCHES = 3


def _mean_squared(y, pred):
    return tf.reduce_mean(
        tf.square(pred - tf.reshape(tf.cast(y, tf.float32), [tf.shape(pred)[0], -1])[:, :1])
    )


def probe(name: str, host: tf.data.Dataset, preprocess) -> dict:
    staged = prefetch_to(host, TARGET)
    host_batches = [tuple(t.numpy() for t in b) for b in host.take(N_BATCHES)]
    it = iter(staged)
    got = [next(it) for _ in range(N_BATCHES)]
    plain = next(iter(host))
    x_spec = host.element_spec[0]
    model = tf_keras.Sequential(
        [tf_keras.Input(x_spec.shape[1:]), tf_keras.layers.Flatten(), tf_keras.layers.Dense(1)]
    )
    step = TrainStep(
        model, tf_keras.optimizers.SGD(0.01), _mean_squared, SingleProcess(), preprocess=preprocess
    )
    step.trace(host.element_spec)
    result = step(it)  # next() on the staged iterator, inside TrainStep
    return {
        "name": name,
        "devices": sorted({t.device for b in got for t in b}),
        "dtypes": [t.dtype.name for t in got[0]],
        "host_devices": sorted({t.device for t in plain}),
        "host_dtypes": [t.dtype.name for t in plain],
        "same_values": all(
            np.array_equal(a, b.numpy())
            for hb, gb in zip(host_batches, got)
            for a, b in zip(hb, gb)
        ),
        "step_loss": float(result.loss.numpy()),
    }


def main(cosmoflow_dir: str, deepcam_dir: str) -> None:
    cosmo_files = sorted(str(p) for p in Path(cosmoflow_dir).iterdir())
    shape = (8, 8, 8, 4)
    cosmo = cosmoflow_data.make_dataset(
        cosmo_files, shape, 2, "", training=True, seed=0, deterministic=True
    )
    print(
        json.dumps(probe("cosmoflow", cosmo, lambda x, y: (cosmoflow_data.log_transform(x), y))),
        flush=True,
    )
    deepcam_files = sorted(str(p) for p in Path(deepcam_dir).iterdir())
    deepcam = deepcam_data.make_dataset(
        deepcam_files,
        channels=range(16),
        height=16,
        width=24,
        batch_size=2,
        training=True,
        seed=0,
        deterministic=True,
    )
    print(
        json.dumps(
            probe("deepcam", deepcam, lambda x, y: (tf.cast(x, tf.float32), tf.cast(y, tf.float32)))
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
