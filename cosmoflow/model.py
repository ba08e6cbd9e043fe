"""The CosmoFlow network of the MLPerf HPC reference (v1.0+).

5 x (Conv3D k=3 with 32*2^i filters, LeakyReLU, MaxPool3D 2), Flatten, Dense 128
and 64 with LeakyReLU and dropout, Dense 4 with tanh scaled by 1.2 (targets lie
in [-1, 1]; the 1.2 leaves the tanh room to reach them). On 128^3 x 4 inputs
with the default sizes it has 8,907,556 parameters.

`l2` regularizes the kernels of the two hidden Dense layers only, as the
reference (models/cosmoflow.py) and the rules' `opt_weight_decay` define it:
the conv layers and the output layer carry no penalty.
"""

import tensorflow as tf
from tensorflow.keras import layers

OUTPUT_SCALE = 1.2


def build_model(input_shape, target_size: int = 4, conv_size: int = 32, kernel_size: int = 3,
                n_conv_layers: int = 5, fc1_size: int = 128, fc2_size: int = 64, dropout: float = 0.5,
                l2: float = 0.0) -> tf.keras.Model:
    # Keras' l2(l) adds l * sum(w^2) to the loss, as the reference's regularizers.l2.
    regularizer = tf.keras.regularizers.l2(l2) if l2 > 0 else None
    inputs = layers.Input(shape=tuple(input_shape), name="volume")
    x = inputs
    for i in range(n_conv_layers):
        x = layers.Conv3D(conv_size * 2 ** i, kernel_size, padding="same", name=f"conv{i + 1}")(x)
        x = layers.LeakyReLU(name=f"conv{i + 1}_act")(x)
        x = layers.MaxPool3D(2, name=f"pool{i + 1}")(x)
    x = layers.Flatten()(x)
    for j, size in enumerate((fc1_size, fc2_size)):
        x = layers.Dense(size, kernel_regularizer=regularizer, name=f"fc{j + 1}")(x)
        x = layers.LeakyReLU(name=f"fc{j + 1}_act")(x)
        x = layers.Dropout(dropout, name=f"fc{j + 1}_dropout")(x)
    # The head stays in float32 under mixed precision: the loss compares it to targets.
    x = layers.Dense(target_size, activation="tanh", dtype="float32", name="head")(x)
    outputs = layers.Rescaling(OUTPUT_SCALE, dtype="float32", name="scale")(x)
    return tf.keras.Model(inputs, outputs, name="cosmoflow")


def from_config(cfg) -> tf.keras.Model:
    m = cfg.model
    return build_model(cfg.data.sample_shape, 4, m.conv_size, m.kernel_size, m.n_conv_layers,
                       m.fc1_size, m.fc2_size, m.dropout, cfg.optimizer.weight_decay)
