"""Imports the weights of the MLPerf reference DeepCAM (PyTorch) into our Keras model.

  python -m deepcam.import_reference CKPT OUT [--config YAML]

CKPT is a state dict of the reference's DeepLabv3_plus: a PyTorch file
(torch.save of model.state_dict(), or the reference's training checkpoint
{'step', 'epoch', 'model', 'optimizer'}; needs torch), or an .npz of name ->
array with the same names (no torch needed). A 'module.' prefix (DDP) is
dropped. OUT becomes a model-only checkpoint folder (OUT/ckpt), with
OUT/config.yaml (the config the model was built from; data.channels set to
the checkpoint's input count) and OUT/import.json. deepcam.predict and
training's --checkpoint read it.

Every layer of our model holding weights is named after the reference module
holding them (deepcam/model.py), so the mapping is generated from the model:
every tensor must be there with the expected shape, and nothing else.
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import tf_keras

from common.cli import tool_main
from common.config import dump_config
from common.errors import InputError, write_text_atomic
from common.model_folder import CONFIG_NAME, save_model_weights
from deepcam.config import N_CLASSES
from deepcam.model import TrainableAffine, build_model
from deepcam.predict import load_model_config

CONFIGS = Path(__file__).resolve().parent / "configs"
INPUT_CONV = "xception_features.conv1.weight"  # [32, in_channels, 3, 3]: gives the input count
DDP_PREFIX = "module."

# Axis orders from PyTorch's layout to Keras'. A convolution's [out, in, kh, kw]
# and a transposed convolution's [in, out, kh, kw] both move by the same
# permutation, to Keras' [kh, kw, in, out] and [kh, kw, out, in].
CONV_AXES = (2, 3, 1, 0)
DEPTHWISE_AXES = (2, 3, 0, 1)  # [channels, 1, kh, kw] -> [kh, kw, channels, 1]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one reference tensor becomes one Keras variable."""

    axes: tuple[int, ...] = ()  # permutation from PyTorch's order to Keras'; () keeps it
    trailing_ones: int = 0  # PyTorch's extra size-1 dims (TrainableAffine's (C, 1, 1))

    def reference_shape(self, keras_shape) -> tuple[int, ...]:
        shape = tuple(int(s) for s in keras_shape)
        if self.axes:
            shape = tuple(shape[i] for i in np.argsort(self.axes))
        return shape + (1,) * self.trailing_ones

    def to_keras(self, array: np.ndarray) -> np.ndarray:
        if self.trailing_ones:
            array = array.reshape(array.shape[: -self.trailing_ones])
        return np.transpose(array, self.axes) if self.axes else array


KEEP = Layout()
CONV = Layout(CONV_AXES)
DEPTHWISE = Layout(DEPTHWISE_AXES)
AFFINE = Layout(trailing_ones=2)


def _layer_tensors(layer):
    """[(reference tensor suffix, Keras variable, Layout)] of one layer; [] if it holds none."""
    kl = tf_keras.layers
    # Subclasses first: both are Conv2D subclasses in Keras.
    if isinstance(layer, kl.Conv2DTranspose):
        return [("weight", layer.kernel, CONV)]
    if isinstance(layer, kl.DepthwiseConv2D):
        return [("weight", layer.depthwise_kernel, DEPTHWISE)]
    if isinstance(layer, kl.Conv2D):
        return [("weight", layer.kernel, CONV)] + (
            [("bias", layer.bias, KEEP)] if layer.use_bias else []
        )
    if isinstance(layer, kl.BatchNormalization):
        return [
            ("weight", layer.gamma, KEEP),
            ("bias", layer.beta, KEEP),
            ("running_mean", layer.moving_mean, KEEP),
            ("running_var", layer.moving_variance, KEEP),
        ]
    if isinstance(layer, TrainableAffine):
        return [("weights", layer.scale, AFFINE), ("bias", layer.shift, AFFINE)]
    if layer.weights:
        raise TypeError(f"no reference layout for layer {layer.name} ({type(layer).__name__})")
    return []


def tensor_map(model) -> dict:
    """{reference tensor name: (Keras variable, Layout)} for every variable of `model`."""
    mapping = {}
    for layer in model.layers:
        for suffix, variable, layout in _layer_tensors(layer):
            mapping[f"{layer.name}.{suffix}"] = (variable, layout)
    return mapping


def _ignored(model) -> set:
    """Reference buffers with no Keras counterpart: BatchNorm2d's step counter."""
    return {
        f"{layer.name}.num_batches_tracked"
        for layer in model.layers
        if isinstance(layer, tf_keras.layers.BatchNormalization)
    }


def _named(kind: str, names, source) -> InputError:
    names = sorted(names)
    more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
    return InputError(f"{source}: {kind} tensor {names[0]}{more}")


def load_state(model, state: dict, source="state dict") -> int:
    """Assigns a reference state dict to `model`; returns the number of tensors assigned.

    Raises InputError naming a tensor missing from `state`, one the model has no
    place for, or one whose shape is not the expected one (checked before any
    assignment, so a failed import leaves the model as it was).
    """
    mapping = tensor_map(model)
    missing = set(mapping) - set(state)
    if missing:
        raise _named("missing", missing, source)
    extra = set(state) - set(mapping) - _ignored(model)
    if extra:
        raise _named("unexpected", extra, source)
    for name, (variable, layout) in mapping.items():
        expected = layout.reference_shape(variable.shape)
        if tuple(state[name].shape) != expected:
            raise InputError(
                f"{source}: tensor {name} has shape {tuple(state[name].shape)}, expected {expected}"
            )
    for name, (variable, layout) in mapping.items():
        variable.assign(layout.to_keras(np.asarray(state[name], np.float32)))
    return len(mapping)


def read_state_dict(path) -> dict:
    """{name: numpy array} from a .npz, or from a PyTorch file (torch needed)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"reference checkpoint not found: {path}")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as f:
                state = {name: f[name] for name in f.files}
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: unreadable .npz ({_first_line(e)})") from None
    else:
        state = _read_torch(path)
    return {
        name[len(DDP_PREFIX) :] if name.startswith(DDP_PREFIX) else name: value
        for name, value in state.items()
    }


def _read_torch(path: Path) -> dict:
    try:
        import torch
    except ImportError:
        raise InputError(
            f"{path}: reading a PyTorch file needs torch; or convert it where torch is installed: "
            f"python -c \"import torch, numpy; sd = torch.load('{path.name}', map_location='cpu'); "
            f"sd = sd.get('model', sd); numpy.savez('{path.stem}.npz', "
            f'**{{k: v.numpy() for k, v in sd.items()}})"'
        ) from None
    try:
        # weights_only: a checkpoint is data; never run code from a pickle.
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many kinds (pickle, zip, RuntimeError)
        raise InputError(f"{path}: unreadable PyTorch file ({_first_line(e)})") from None
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]  # the reference's training checkpoint
    if not isinstance(obj, dict):
        raise InputError(f"{path}: expected a state dict, found {type(obj).__name__}")
    return {
        name: value.detach().cpu().numpy() for name, value in obj.items() if torch.is_tensor(value)
    }


def default_config() -> Path:
    """A closed-division config: they differ in hyperparameters only, the model is the reference's."""
    found = sorted(CONFIGS.glob("deepcam_closed*.yaml"))
    if not found:
        raise InputError(f"no deepcam_closed*.yaml in {CONFIGS}: pass --config")
    return found[0]


def import_reference(checkpoint, out, config=None, print_fn=print) -> Path:
    """Reads a reference state dict, loads it into our model and writes a checkpoint folder OUT."""
    config = Path(config) if config else default_config()
    state = read_state_dict(checkpoint)
    if INPUT_CONV not in state or np.ndim(state[INPUT_CONV]) != 4:
        raise InputError(
            f"{checkpoint}: missing tensor {INPUT_CONV} (4-D), which gives the input channels"
        )
    in_channels = int(state[INPUT_CONV].shape[1])
    cfg = load_model_config(config)
    if len(cfg.data.channels) != in_channels:
        cfg = load_model_config(config, {"data.channels": list(range(in_channels))})
    net = build_model(
        cfg.data.height,
        cfg.data.width,
        in_channels,
        N_CLASSES,
        width_multiplier=cfg.model.width,
        middle_blocks=cfg.model.middle_blocks,
    )
    count = load_state(net, state, source=checkpoint)
    out = save_model_weights(net, out)
    dump_config(cfg, out / CONFIG_NAME)
    record = {
        "source": str(Path(checkpoint).resolve()),
        "config": str(config),
        "tensors": count,
        "ignored_num_batches_tracked": len(state) - count,
        "input_channels": in_channels,
    }
    write_text_atomic(out / "import.json", json.dumps(record, indent=1) + "\n")
    print_fn(
        f"[import] {count} tensors from {checkpoint} -> {out} ({in_channels} input channels: "
        f"fields {list(cfg.data.channels)})"
    )
    return out


@tool_main()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="reference state dict: .pt/.pth (needs torch) or .npz")
    parser.add_argument("out", help="checkpoint folder to write")
    parser.add_argument(
        "--config",
        help="DeepCAM config with the model's sizes (model.width, "
        "model.middle_blocks; default: a closed-division config, the reference's sizes)",
    )
    args = parser.parse_args(argv)
    import_reference(args.checkpoint, args.out, args.config)
    return 0


def _first_line(e: Exception) -> str:
    return " ".join(str(e).split())[:200]


if __name__ == "__main__":
    sys.exit(main())
