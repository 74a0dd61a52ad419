#!/usr/bin/env bash
# The checks and measurements that need a CUDA GPU, in one run (about 10 minutes on one H100): the CUDA tests (no
# host sync with statistics and auto; the sample equals the numpy core on the GPU), the kernels per step, then the
# torch, JAX and Keras (jax, torch backends) benchmarks on the device, and the JAX step variants of
# gpu_probe_stats.py (checked bit for bit against the library's step first). Needs torch with CUDA, jax with CUDA, optax;
# jmp and keras for their rows.
#   bash benchmarks/gpu_run.sh [OUT_DIR]            everything
#   ONLY="cuda_tests bench_stats" bash benchmarks/gpu_run.sh    the named parts only
set -u
out=${1:-${OUT:-/tmp/gpu_run}}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
run() {  # run NAME SECONDS COMMAND...: its output to the terminal and to $out/NAME.txt (skipped if ONLY leaves it out)
    local name=$1 limit=$2; shift 2
    case " ${ONLY:-$name} " in *" $name "*) ;; *) return 0 ;; esac
    echo "== $name: $*"
    timeout "$limit" "$@" 2>&1 | grep -v "^WARNING: All log\|^I0000\|^W0000\|oneDNN" | tee "$out/$name.txt"
}
nvidia-smi -L
python3 -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__, jax.devices())"
run cuda_tests 120 python3 -m pytest -q -p no:cacheprovider tests/torch/test_cuda.py tests/torch/test_stats_torch.py
run kernel_count 90 python3 benchmarks/kernel_count.py --device cuda --tensors 100 1000
run compile_auto 120 python3 benchmarks/compile_auto_rule.py --device cuda  # the sampled auto step compiled
run bench_torch 90 python3 benchmarks/bench_torch.py --device cuda --sizes 1e6,1e7,5e7 --tensors 100 \
    --optimizers adamw-fused,adamw-foreach --clip off --rounds 7 --steps 10 --facade
run bench_stats 240 python3 benchmarks/bench_stats.py --bindings torch jax keras-jax keras-torch --device cuda
run bench_stats_100_tensors 200 python3 benchmarks/bench_stats.py --bindings torch keras-torch --device cuda --layers 50 \
    --rounds 9
run probe_jax 150 python3 benchmarks/gpu_probe_stats.py --part jax --check  # the JAX variants for +2% at N=16
run bench_jax 90 python3 benchmarks/bench_jax.py --sizes 1e6 1e7 --rounds 7 --donate yes
for backend in jax torch; do
    KERAS_BACKEND=$backend run "bench_keras_$backend" 60 python3 benchmarks/bench_keras.py --backend current --rounds 7
done
