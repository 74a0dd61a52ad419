#!/usr/bin/env bash
# Before (77c7de3: `git worktree add --detach /work/before 77c7de3`) and after (this checkout), alternating, one
# benchmark at a time, alone on the machine. Usage: bash run_before_after.sh BEFORE_SRC AFTER_SRC OUT_DIR
before=$1; after=$2; out=$3; mkdir -p "$out"
py=${PYTHON:-.venv/bin/python}
side() { [ "$1" = before ] && echo "$before" || echo "$after"; }
for r in 1 2 3 4; do
  for w in before after; do
    PYTHONPATH=$(side $w) $py benchmarks/bench_torch.py --sizes 1e6 --tensors 100 \
      --optimizers adamw-fused,adamw-foreach,sgd-momentum --clip off --rounds 15 --steps 10 > "$out/torch_${w}_$r.md" 2>&1
  done
done
for r in 1 2; do
  for w in before after; do
    PYTHONPATH=$(side $w) $py benchmarks/bench_jax.py --sizes 1e6 1e7 --rounds 7 --donate yes > "$out/jax_${w}_$r.md" 2>&1
  done
done
for r in 1 2; do
  for w in before after; do
    PYTHONPATH=$(side $w) $py benchmarks/bench_keras.py --rounds 5 --steps 50 > "$out/keras_${w}_$r.md" 2>&1
  done
done
