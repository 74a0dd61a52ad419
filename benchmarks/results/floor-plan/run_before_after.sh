#!/usr/bin/env bash
# Before (77c7de3, a `git worktree add --detach /work/before 77c7de3`) and after (this checkout), alternating,
# one benchmark at a time, alone on the machine. Usage: bash run_before_after.sh BEFORE_SRC AFTER_SRC OUT_DIR
before=$1; after=$2; out=$3; mkdir -p "$out"
py=${PYTHON:-.venv/bin/python}
for round in 1 2; do
  for which in before after; do
    src=$([ $which = before ] && echo "$before" || echo "$after")
    echo "== torch $which $round $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    PYTHONPATH=$src $py benchmarks/bench_torch.py --sizes 1e6 --tensors 100 --optimizers adamw-fused,sgd-momentum \
      --rounds 7 --steps 10 > "$out/torch_${which}_$round.md" 2>&1
    echo "== jax $which $round $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    PYTHONPATH=$src $py benchmarks/bench_jax.py --sizes 1e6 --rounds 7 --donate yes > "$out/jax_${which}_$round.md" 2>&1
    echo "== keras $which $round $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    PYTHONPATH=$src $py benchmarks/bench_keras.py --rounds 5 --steps 100 > "$out/keras_${which}_$round.md" 2>&1
  done
done
echo "== done $(date +%T)"
