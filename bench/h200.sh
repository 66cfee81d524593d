#!/bin/bash
# One device call: before (.base, the tree before the change measured) and after, same GPU.
# Usage on the device machine: bash bench/h200.sh [parts...]
#   parts: base base-gpt2 report notorch matmul gpt2 gpt2-eager (PyTorch eager only)
#   tg-gpt2 (GPT-2 without PyTorch) profile
#   mixed mixed-gpt2 (default: base
#   report matmul, in order); notorch: report without the PyTorch twin (the small models'
#   host-bound figures, to compare with base's: PyTorch's CUDA context slows the Vulkan
#   kernels); mixed / mixed-gpt2: report / gpt2 with --precision mixed (tensorgrad's f16
#   activations and loss scaling, the torch twin under torch.autocast float16 + GradScaler:
#   compare with report / gpt2 of the same call);
#   a part ending in -unchecked (report-unchecked, matmul-unchecked, gpt2-unchecked) runs
#   with TENSORGRAD_RUNTIME_CHECKS=0 (kernels without bounds checks), its files named so;
#   one ending in -checked with TENSORGRAD_RUNTIME_CHECKS=1 (wgpu's loop counters as well as
#   the default's bounds checks)
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L
parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(base report matmul)
for part in "${parts[@]}"; do
  unset TENSORGRAD_RUNTIME_CHECKS; TAG=""
  case $part in
    *-unchecked) part=${part%-unchecked}; export TENSORGRAD_RUNTIME_CHECKS=0 TAG=_unchecked ;;
    *-checked) part=${part%-checked}; export TENSORGRAD_RUNTIME_CHECKS=1 TAG=_checked ;;
  esac
  case $part in
    report) timeout 300 python3 bench/report.py --steps 100 --json "$OUT/after$TAG.json" \
              2>&1 | grep -v XDG | tee "$OUT/after$TAG.txt" ;;
    notorch) timeout 150 python3 bench/report.py --steps 100 --no-torch \
              --json "$OUT/after_notorch$TAG.json" 2>&1 | grep -v XDG \
              | tee "$OUT/after_notorch$TAG.txt" ;;
    base) (cd .base && timeout 150 python3 bench/report.py --steps 100 --no-torch \
              --json "$OUT/before.json" 2>&1 | grep -v XDG | tee "$OUT/before.txt") ;;
    base-gpt2) (cd .base && timeout 200 python3 bench/report.py --models gpt2 --no-torch \
              --steps 5 --warmup 2 --replays 1 --json "$OUT/before_gpt2.json" 2>&1 \
              | grep -v XDG | tee "$OUT/before_gpt2.txt") ;;
    gpt2) timeout 300 python3 bench/report.py --models gpt2 --steps 10 --warmup 2 \
              --replays 1 --json "$OUT/gpt2$TAG.json" 2>&1 | grep -v XDG | tee "$OUT/gpt2$TAG.txt" ;;
    gpt2-eager) timeout 240 python3 bench/report.py --models gpt2 --steps 10 --warmup 2 \
              --replays 1 --no-torch-compile --json "$OUT/gpt2_eager$TAG.json" 2>&1 \
              | grep -v XDG | tee "$OUT/gpt2_eager$TAG.txt" ;;
    tg-gpt2) timeout 200 python3 bench/report.py --models gpt2 --no-torch --steps 10 ${REPORT_ARGS:-} \
              --warmup 2 --replays 1 --json "$OUT/tg_gpt2$TAG.json" 2>&1 | grep -v XDG \
              | tee "$OUT/tg_gpt2$TAG.txt" ;;
    profile) timeout 240 python3 bench/report.py --models transformer,gpt,gpt2 --no-torch \
              --steps 10 --warmup 2 --replays 1 --json "$OUT/profile.json" 2>&1 \
              | grep -v XDG | tee "$OUT/profile.txt" ;;
    mixed) timeout 300 python3 bench/report.py --precision mixed --steps 100 \
              --json "$OUT/mixed$TAG.json" 2>&1 | grep -v XDG | tee "$OUT/mixed$TAG.txt" ;;
    mixed-gpt2) timeout 300 python3 bench/report.py --precision mixed --models gpt2 --steps 10 \
              --warmup 2 --replays 1 --json "$OUT/mixed_gpt2$TAG.json" 2>&1 | grep -v XDG \
              | tee "$OUT/mixed_gpt2$TAG.txt" ;;
    matmul) timeout 420 python3 bench/report.py --matmul ${MATMUL_ARGS:-} 2>&1 | grep -v XDG \
              | tee "$OUT/matmul$TAG.txt" ;;
  esac
done
