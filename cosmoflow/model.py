"""The CosmoFlow network of the MLPerf HPC reference (v1.0+).

5 x (Conv3D k=3 with 32*2^i filters, LeakyReLU, MaxPool3D 2), Flatten, Dense 128
and 64 with LeakyReLU and dropout, Dense 4 with tanh scaled by 1.2 (targets lie
in [-1, 1]; the 1.2 leaves the tanh room to reach them). On 128^3 x 4 inputs
with the default sizes it has 8,907,556 parameters.

Split across the ranks of a spatial group (`mesh`, common.parallel.spatial_mesh.SpatialMesh),
the model's input is a z-slab of Zs = N / K planes: the convolutions exchange
halos (common.parallel.spatial.SpatialConv3D), pools stay local while the slab holds an
even number of planes, and the slabs are gathered where a pool would straddle
them, or before Flatten; the rest runs on the whole sample. The variables and
their names are those of the unsplit model.

`max_channels` caps the filters of the deeper layers (LBANN's CosmoFlow does so
for 256^3 and 512^3 volumes, which take log2(N) - 2 conv layers): without it the
sixth and seventh layers would hold 1024 and 2048 filters.

`l2` regularizes the kernels of the two hidden Dense layers only, as the
reference (models/cosmoflow.py) and the rules' `opt_weight_decay` define it:
the conv layers and the output layer carry no penalty.
"""

import tf_keras
from tf_keras import layers

OUTPUT_SCALE = 1.2


def build_model(
    input_shape,
    target_size: int = 4,
    conv_size: int = 32,
    kernel_size: int = 3,
    n_conv_layers: int = 5,
    fc1_size: int = 128,
    fc2_size: int = 64,
    dropout: float = 0.5,
    l2: float = 0.0,
    max_channels: int | None = None,
    mesh=None,
    halo_overlap: bool = True,
) -> tf_keras.Model:
    """The model; with a split `mesh`, `input_shape` is the whole sample's and the input a z-slab of it
    (`halo_overlap`: parallel.halo_overlap, how its convolutions wait for their halos)."""
    # Keras' l2(l) adds l * sum(w^2) to the loss, as the reference's regularizers.l2.
    regularizer = tf_keras.regularizers.l2(l2) if l2 > 0 else None
    split = mesh is not None and mesh.is_split
    if split:  # the split's layers, imported by split runs only
        from common.parallel.spatial import GatherSlabs, SpatialConv3D, pool_stays_local
    shape = tuple(input_shape)
    if split:
        shape = (shape[0] // mesh.size,) + shape[1:]
    inputs = layers.Input(shape=shape, name="volume")
    x = inputs
    for i in range(n_conv_layers):
        filters = conv_size * 2**i if max_channels is None else min(conv_size * 2**i, max_channels)
        if split and x.shape[1] < kernel_size // 2:  # a neighbour's slab cannot fill the halo
            x, split = GatherSlabs(mesh, name=f"gather_before_conv{i + 1}")(x), False
        if split:
            x = SpatialConv3D(
                filters, kernel_size, mesh, overlap=halo_overlap, name=f"conv{i + 1}"
            )(x)
        else:
            x = layers.Conv3D(filters, kernel_size, padding="same", name=f"conv{i + 1}")(x)
        x = layers.LeakyReLU(name=f"conv{i + 1}_act")(x)
        if split and not pool_stays_local(x.shape[1]):
            x, split = GatherSlabs(mesh, name=f"gather_before_pool{i + 1}")(x), False
        x = layers.MaxPool3D(2, name=f"pool{i + 1}")(x)
    if split:
        x = GatherSlabs(mesh, name="gather_before_flatten")(x)
    x = layers.Flatten()(x)
    for j, size in enumerate((fc1_size, fc2_size)):
        x = layers.Dense(size, kernel_regularizer=regularizer, name=f"fc{j + 1}")(x)
        x = layers.LeakyReLU(name=f"fc{j + 1}_act")(x)
        x = layers.Dropout(dropout, name=f"fc{j + 1}_dropout")(x)
    # The head stays in float32 under mixed precision: the loss compares it to targets.
    x = layers.Dense(target_size, activation="tanh", dtype="float32", name="head")(x)
    outputs = layers.Rescaling(OUTPUT_SCALE, dtype="float32", name="scale")(x)
    return tf_keras.Model(inputs, outputs, name="cosmoflow")


def from_config(cfg, mesh=None) -> tf_keras.Model:
    m = cfg.model
    return build_model(
        cfg.data.sample_shape,
        4,
        m.conv_size,
        m.kernel_size,
        m.n_conv_layers,
        m.fc1_size,
        m.fc2_size,
        m.dropout,
        cfg.optimizer.weight_decay,
        m.max_channels,
        mesh,
        cfg.parallel.halo_overlap,
    )
