"""Import a CosmoFlow model trained by the MLCommons reference (a Keras .h5 file).

  python -m cosmoflow.import_reference checkpoint-040.h5 runs/imported [--config CONFIG.yaml]
  python -m cosmoflow.predict runs/imported sample.tfrecord          # then: predict with it
  python cosmoflow/train.py CONFIG.yaml --checkpoint runs/imported    # or fine-tune it from epoch 0

The reference model (mlcommons/hpc cosmoflow/models/cosmoflow.py) is a Keras
Sequential of n_conv_layers x (Conv3D, LeakyReLU, MaxPool3D), Flatten,
2 x (Dense, LeakyReLU, Dropout), Dense(4, tanh) and a x1.2 Lambda: the network of
cosmoflow/model.py, layer for layer, in the same tensor layouts. Its train.py
saves full models (ModelCheckpoint: weights under the `model_weights` group);
`save_weights` files hold the same groups at the root. Both are read with h5py
alone, without the reference code: the layer order is the `layer_names`
attribute and each layer's tensors are its `weight_names`. The reference's
Conv3D layers, in order, become conv1..convN; its Dense layers fc1, fc2, head.

The model's sizes come from --config (default: a closed-division config, which
all hold the reference's sizes) and every tensor's shape is checked against
them. A missing, extra or mis-shaped tensor is an error naming it (exit 2).
OUT gets the weights (common.model_folder.save_model_weights), config.yaml and
import.json (source file, tensor count, layer mapping).
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import h5py
import numpy as np

from common.cli import tool_main
from common.config import dump_config
from common.errors import InputError, write_text_atomic
from common.model_folder import CONFIG_NAME, save_model_weights
from cosmoflow import model as model_lib
from cosmoflow.predict import load_model_config

CONFIGS = Path(__file__).resolve().parent / "configs"
CONV, DENSE = "Conv3D", "Dense"
# A kernel's rank tells the layer type: (k, k, k, in, out) or (in, out).
_KIND_BY_KERNEL_RANK = {5: CONV, 2: DENSE}


@dataclasses.dataclass(frozen=True)
class ReferenceLayer:
    """A layer of the file that holds tensors."""

    name: str  # as in the file: conv3d_1, dense
    kind: str  # CONV or DENSE
    tensors: dict  # "kernel" / "bias" -> (path in the file, array)


def default_config() -> Path:
    """A closed-division config: they differ in hyperparameters only, the model is the reference's."""
    found = sorted(CONFIGS.glob("cosmoflow_closed*.yaml"))
    if not found:
        raise InputError(f"no cosmoflow_closed*.yaml in {CONFIGS}: pass --config")
    return found[0]


def read_reference_layers(path) -> tuple[str, list[ReferenceLayer]]:
    """The file's format ('full model' or 'weights') and its layers that hold tensors, in order."""
    try:
        f = h5py.File(path, "r")
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable HDF5 file ({e})") from None
    with f:
        full = "model_weights" in f
        root = f["model_weights"] if full else f
        if "layer_names" not in root.attrs:
            raise InputError(
                f"{path}: not a Keras weights file (no 'layer_names' attribute in "
                f"{root.name}; expected a model.save or save_weights .h5)"
            )
        layers = []
        for name in _strings(root.attrs["layer_names"]):
            if name not in root:
                raise InputError(f"{path}: layer '{name}' is in layer_names but has no group")
            group = root[name]
            weight_names = _strings(group.attrs.get("weight_names", []))
            if weight_names:
                layers.append(_read_layer(path, name, group, weight_names))
    return ("full model" if full else "weights"), layers


def _read_layer(path, name, group, weight_names) -> ReferenceLayer:
    tensors = {}
    for weight in weight_names:
        where = f"{group.name}/{weight}"
        if weight not in group:
            raise InputError(f"{path}: tensor '{where}' is listed in weight_names but missing")
        role = weight.rsplit("/", 1)[-1].split(":")[0]
        if role not in ("kernel", "bias") or role in tensors:
            raise InputError(
                f"{path}: layer '{name}': unexpected tensor '{where}' (the reference model "
                f"has Conv3D and Dense layers with one kernel and one bias each)"
            )
        tensors[role] = (where, np.asarray(group[weight]))
    for role in ("kernel", "bias"):
        if role not in tensors:
            raise InputError(f"{path}: layer '{name}' has no {role} tensor")
    kernel_where, kernel = tensors["kernel"]
    kind = _KIND_BY_KERNEL_RANK.get(kernel.ndim)
    if kind is None:
        raise InputError(
            f"{path}: layer '{name}': tensor '{kernel_where}' of shape {kernel.shape} is "
            f"neither a Conv3D nor a Dense kernel"
        )
    return ReferenceLayer(name, kind, tensors)


def _strings(values) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def our_layers(model) -> dict:
    """Our layers that take the reference's tensors, by kind, in order."""
    convs = sorted(
        (
            layer.name
            for layer in model.layers
            if layer.name.startswith("conv") and layer.name[4:].isdigit()
        ),
        key=lambda n: int(n[4:]),
    )
    return {CONV: convs, DENSE: ["fc1", "fc2", "head"]}


def import_weights(model, layers: list[ReferenceLayer], source) -> dict:
    """Assigns the reference layers' tensors to `model`; returns {our layer: their layer}.

    Raises:
      InputError: a layer too many or too few, a tensor whose shape differs.
    """
    pairs = []
    for kind, ours in our_layers(model).items():
        theirs = [layer for layer in layers if layer.kind == kind]
        if len(theirs) > len(ours):
            raise InputError(
                f"{source}: extra {kind} layer '{theirs[len(ours)].name}': the config's "
                f"model has {len(ours)} ({', '.join(ours)})"
            )
        if len(theirs) < len(ours):
            raise InputError(
                f"{source}: no {kind} layer for {ours[len(theirs)]}: the file has "
                f"{len(theirs)} ({', '.join(t.name for t in theirs) or 'none'}), the config's "
                f"model {len(ours)}"
            )
        pairs += zip(ours, theirs)
    # Every shape first: a file that does not fit changes nothing.
    assignments = []
    for our_name, ref in pairs:
        layer = model.get_layer(our_name)
        for role, variable in (("kernel", layer.kernel), ("bias", layer.bias)):
            where, array = ref.tensors[role]
            if tuple(array.shape) != tuple(variable.shape):
                raise InputError(
                    f"{source}: tensor '{where}' has shape {tuple(array.shape)}, but {our_name} "
                    f"{role} of the config's model is {tuple(variable.shape)} (check --config: "
                    f"data.sample_shape, model.conv_size, n_conv_layers, kernel_size, fc1/fc2_size)"
                )
            assignments.append((variable, array))
    for variable, array in assignments:
        variable.assign(array.astype(variable.dtype.as_numpy_dtype))
    return {our_name: ref.name for our_name, ref in pairs}


def import_reference(weights, out, config_path=None) -> dict:
    """Reads WEIGHTS (.h5), writes the model-only folder OUT; returns what import.json holds."""
    config_path = Path(config_path) if config_path else default_config()
    cfg = load_model_config(config_path)
    file_format, layers = read_reference_layers(weights)
    model = model_lib.from_config(cfg)
    mapping = import_weights(model, layers, weights)
    out = save_model_weights(model, out)
    # The data directory is the run's business, not the model's.
    dump_config(
        dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, data_dir=None)),
        out / CONFIG_NAME,
    )
    record = {
        "source": str(Path(weights).resolve()),
        "format": file_format,
        "config": str(config_path),
        "tensors": 2 * len(mapping),
        "layers": mapping,
    }
    write_text_atomic(out / "import.json", json.dumps(record, indent=2))
    return record


@tool_main()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cosmoflow.import_reference",
        description="Import a CosmoFlow model trained by the MLCommons reference.",
    )
    parser.add_argument(
        "weights", help="the reference's .h5 (ModelCheckpoint full model, or save_weights)"
    )
    parser.add_argument(
        "out", help="folder to write (model-only checkpoint, config.yaml, import.json)"
    )
    parser.add_argument(
        "--config", help="YAML config with the model's sizes (default: a closed-division config)"
    )
    args = parser.parse_args(argv)
    record = import_reference(args.weights, args.out, args.config)
    print(
        f"[import] {record['tensors']} tensors from {args.weights} ({record['format']}, "
        f"sizes of {record['config']}) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
