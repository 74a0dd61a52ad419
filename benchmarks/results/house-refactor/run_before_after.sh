#!/usr/bin/env bash
# before (81f450e) and after (main), alternating, one benchmark at a time
cd /work/main
out=/tmp/bench_ba; mkdir -p $out
for round in 1 2 3; do
  for which in before after; do
    src=$([ $which = before ] && echo /tmp/old/81/src || echo /work/main/src)
    echo "== torch $which $round $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    PYTHONPATH=$src .venv/bin/python benchmarks/bench_torch.py --sizes 1e6,1e7 --tensors 100 --optimizers adamw-fused,sgd-momentum --rounds 15 --steps 10 > $out/torch_${which}_$round.md 2>&1
    echo "== jax $which $round $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    PYTHONPATH=$src .venv/bin/python benchmarks/bench_jax.py --sizes 1e6 --rounds 15 --donate yes > $out/jax_${which}_$round.md 2>&1
  done
done
for round in 1 2; do
  for which in before after; do
    src=$([ $which = before ] && echo /tmp/old/81/src || echo /work/main/src)
    echo "== keras $which $round $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    PYTHONPATH=$src .venv/bin/python benchmarks/bench_keras.py --rounds 15 --steps 100 > $out/keras_${which}_$round.md 2>&1
  done
done
echo "== done $(date +%T)"
