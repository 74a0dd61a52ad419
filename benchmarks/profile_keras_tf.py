"""Where a TensorFlow ``fit`` step spends its time: TF's profiler, per op type, Keras 3's class against lossscale's.

The model and data of ``bench_keras.py``. Each optimizer trains in its own
process (one profiler session each): two warm-up epochs, then one profiled
epoch of ``--steps`` steps. The table sums the executor's op events (TF's
profiler records the ops above its own cost threshold) by op type, in
microseconds per step, with the largest differences first. One run on a
shared machine moves shared ops (MatMul) by several percent; read the rows
that only one class has.

Usage::

    PYTHONPATH=src python benchmarks/profile_keras_tf.py --top 15
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile


def profile(which: str, steps: int) -> dict[str, float]:
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras
    import numpy as np
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    import lossscale.keras as lsk

    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64 * steps, 256)).astype(np.float32)
    y = rng.standard_normal((64 * steps, 1)).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((256,))] + [keras.layers.Dense(256, activation="relu") for _ in range(2)]
        + [keras.layers.Dense(1, dtype="float32")]
    )
    inner = keras.optimizers.Adam(1e-4)
    model.compile(optimizer=inner if which == "keras" else lsk.LossScaleOptimizer(inner), loss="mse")
    model.fit(x, y, batch_size=64, epochs=2, verbose=0, shuffle=False)
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
        tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        with open(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0], "rb") as f:
            space.ParseFromString(f.read())
    per_op: collections.Counter[str] = collections.Counter()
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            if line.name.startswith(("tf_Compute", "tf_numa")):  # the executor's threads
                for event in line.events:
                    name = names.get(event.metadata_id, "?")  # "scope/op_name:OpType", or an executor event
                    per_op[name.rsplit(":", 1)[-1]] += event.duration_ps / 1e6 / steps
    return dict(per_op)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--which", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.which:
        print(json.dumps(profile(args.which, args.steps)))
        return
    runs = {}
    for which in ("keras", "lossscale"):
        command = [sys.executable, __file__, "--which", which, "--steps", str(args.steps)]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        runs[which] = collections.Counter(json.loads(out.stdout.strip().splitlines()[-1]))
    keras_ops, ours = runs["keras"], runs["lossscale"]
    print(f"TF executor time per fit step (us), {args.steps} profiled steps; total Keras "
          f"{sum(keras_ops.values()):.0f}, lossscale {sum(ours.values()):.0f}\n")
    print("| op | Keras 3 LossScaleOptimizer | lossscale.keras | difference |")
    print("|---|---|---|---|")
    for op in sorted(set(keras_ops) | set(ours), key=lambda o: -abs(ours[o] - keras_ops[o]))[: args.top]:
        print(f"| {op} | {keras_ops[op]:.1f} | {ours[op]:.1f} | {ours[op] - keras_ops[op]:+.1f} |")


if __name__ == "__main__":
    main()
