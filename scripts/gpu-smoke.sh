#!/usr/bin/env bash
# Real-GPU smoke check for gpumem.
#
# On a host with an NVIDIA GPU, its driver and PyTorch, runs gpumem while
# PyTorch allocates with each allocator mode (default caching allocator,
# expandable_segments:True, backend:cudaMallocAsync) and prints, per mode,
# what gpumem saw next to torch.cuda.memory_reserved()/memory_allocated()
# (allocated from PyTorch's USDT probes), then checks that `gpumem leaks`
# names the Python line that keeps tensors (default allocator).
#
# Needs only the built gpumem binary (no Rust toolchain), python3 and torch:
#   sudo scripts/gpu-smoke.sh [PATH/TO/gpumem]
# Exit status: 0 when every mode ran and gpumem saw allocations; 1 otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gpumem=${1:-${GPUMEM:-}}
if [ -z "$gpumem" ]; then
  for c in "$here/../target/release/gpumem" "$here/../target/debug/gpumem" "$(command -v gpumem || true)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then gpumem=$c; break; fi
  done
fi
[ -n "$gpumem" ] && [ -x "$gpumem" ] || { echo "gpu-smoke: no gpumem binary; pass its path as the first argument" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "gpu-smoke: run as root (gpumem loads eBPF)" >&2; exit 1; }
python=${PYTHON:-python3}
"$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { echo "gpu-smoke: PyTorch with a usable CUDA device is required ($python)" >&2; exit 1; }

out=$(mktemp -d /tmp/gpumem-smoke.XXXXXX)
echo "gpu-smoke: gpumem $("$gpumem" --version) ; results in $out"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
"$gpumem" status | sed -n '1,12p'

status=0
for mode in default expandable cudaMallocAsync; do
  case $mode in
    default) conf="" ;;
    expandable) conf="expandable_segments:True" ;;
    cudaMallocAsync) conf="backend:cudaMallocAsync" ;;
  esac
  echo
  echo "=== mode $mode (PYTORCH_CUDA_ALLOC_CONF=$conf)"
  if ! PYTORCH_CUDA_ALLOC_CONF=$conf GPUMEM_SMOKE_OUT="$out/$mode.torch.json" \
      "$gpumem" trace --json -c "$python $here/gpu_smoke.py" >"$out/$mode.jsonl" 2>"$out/$mode.err"; then
    echo "gpu-smoke: mode $mode failed; see $out/$mode.err" >&2
    tail -5 "$out/$mode.err" >&2
    status=1
    continue
  fi
  "$python" "$here/gpu_smoke_report.py" "$out/$mode.jsonl" "$out/$mode.torch.json" || status=1
done

echo
echo "=== the leak's Python line (gpumem leaks, default allocator)"
if GPUMEM_SMOKE_OUT="$out/leaks.torch.json" GPUMEM_SMOKE_HOLD=4 \
    "$gpumem" leaks --json --older-than 0 --duration 6 -c "$python $here/gpu_smoke.py" >"$out/leaks.json" 2>"$out/leaks.err"; then
  "$python" "$here/gpu_smoke_report.py" --leaks "$out/leaks.json" "$out/leaks.torch.json" || status=1
else
  echo "gpu-smoke: gpumem leaks failed; see $out/leaks.err" >&2
  status=1
fi
exit $status
