#!/usr/bin/env bash
# Before (ceb1d8b: `git worktree add --detach /work/wt-base ceb1d8b`) and after (this checkout), alternating, one
# benchmark at a time. Usage: bash run_before_after.sh BEFORE_SRC AFTER_SRC OUT_DIR
before=$1; after=$2; out=$3; mkdir -p "$out"
py=${PYTHON:-.venv/bin/python}
side() { [ "$1" = before ] && echo "$before" || echo "$after"; }
for r in 1 2; do
  for w in before after; do
    PYTHONPATH=$(side $w) $py benchmarks/results/auto-table/bench_auto_step.py --rounds 10 > "$out/auto_${w}_$r.md" 2>&1
    PYTHONPATH=$(side $w) $py benchmarks/bench_torch.py --sizes 1e6 --tensors 100 \
      --optimizers adamw-fused,adamw-foreach,sgd-momentum --clip off --rounds 15 --steps 10 > "$out/torch_${w}_$r.md" 2>&1
    PYTHONPATH=$(side $w) $py benchmarks/bench_jax.py --sizes 1e6 1e7 --rounds 7 --donate yes > "$out/jax_${w}_$r.md" 2>&1
    PYTHONPATH=$(side $w) $py benchmarks/bench_keras.py --rounds 5 --steps 50 > "$out/keras_${w}_$r.md" 2>&1
  done
done
