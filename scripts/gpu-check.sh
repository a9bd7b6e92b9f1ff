#!/usr/bin/env bash
# pinguard against NVIDIA's real runtime and driver, with the workload that motivated it:
# PyTorch's DataLoader(pin_memory=True, num_workers=2) (live and peak pinned bytes against
# torch.cuda.host_memory_stats(), the top callsite), a budget under `error` (an exception in
# Python) and `downgrade` (unpinned batches, same results, budget held), the cudaHostRegister
# path, CuPy's pinned pool and a JAX array in pinned host memory where installed, host memory from
# the driver's cuMemCreate and from a host memory pool where the driver supports them, and the
# loop's throughput with and without pinguard, and which of the process's counters (VmLck, VmPin,
# RssShmem) cudaHostAlloc and cudaHostRegister move, with no such pin counted again as
# kernel-pinned (VmPin) bytes, an I/O-memory registration (passes through, counts nothing) and a
# device allocation (counted only where the device says it is integrated), and a range
# cudaHostRegister pinned registered with the RDMA card too (counted once; skipped without a card). One PASS/FAIL/SKIP line per check; exit 1 if any fails.
#
# On the GPU machine: Python 3 with PyTorch (CUDA), no network, no Rust toolchain; the library is
# built beforehand (scripts/release.sh: target/release-artifacts/x86_64/libpinguard.so) and
# travels with the script. Bounded to 8 minutes.
#   scripts/gpu-check.sh [LIB]             on a machine with an NVIDIA GPU
#   scripts/gpu-check.sh --dry-run [LIB]   the same checks on the CPU, against the emulated
#                                          runtime of tests/emul (needs a C compiler)
#   scripts/gpu-check.sh --hip [LIB]       on a machine with an AMD GPU: PyTorch for ROCm through the
#                                          same checks, and HIP's own entry points (check 8)
#   scripts/gpu-check.sh --hip --dry-run [LIB]   check 8 against the emulated libamdhip64.so.5
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
hip=()
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry=1; shift ;;
        --hip) hip=(--hip); shift ;;
        *) break ;;
    esac
done
lib=${1:-}
if [ -z "$lib" ]; then
    for c in target/release-artifacts/x86_64/libpinguard.so target/release/libpinguard.so; do
        if [ -f "$c" ]; then lib=$c; break; fi
    done
fi
if [ -z "$lib" ] || [ ! -f "$lib" ]; then
    echo "gpu-check: no libpinguard.so (build it with scripts/release.sh or cargo build --release, or pass its path)" >&2
    exit 2
fi
if [ $dry = 1 ]; then
    emul=$(scripts/build-fixtures.sh 2>/dev/null)
    exec timeout 470 python3 scripts/gpu_check.py --backend emul --emul-dir "$emul" --lib "$lib" --timeout 90 ${hip[@]+"${hip[@]}"}
fi
if ((${#hip[@]})); then
    # PyTorch for ROCm answers torch.cuda.* over HIP; torch.version.hip names the runtime.
    python3 -c "import torch, sys; sys.exit(0 if torch.version.hip and torch.cuda.is_available() else 1)" 2>/dev/null || {
        echo "gpu-check: PyTorch for ROCm with an AMD device is needed for --hip (or add --dry-run)" >&2
        exit 2
    }
    rocm-smi --showproductname 2>/dev/null | sed -n 's/^GPU\[[0-9]*\].*Card [Ss]eries: */# gpu: /p' || true
    python3 -c "import torch; print('# torch', torch.__version__, 'hip', torch.version.hip)"
    exec timeout 470 python3 scripts/gpu_check.py --backend torch --lib "$lib" --timeout 90 --hip
fi
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null || {
    echo "gpu-check: PyTorch with a CUDA device is needed here (or use --dry-run)" >&2
    exit 2
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/# gpu: /' || true
python3 -c "import torch; print('# torch', torch.__version__, 'cuda', torch.version.cuda)"
exec timeout 470 python3 scripts/gpu_check.py --backend torch --lib "$lib" --timeout 90
