#!/usr/bin/env bash
# One-node GPU benchmark: NCCL collective sweep + training-throughput bench, then the report.
# Sized to finish in < 10 minutes on one node (1-8 GPUs); each phase has its own timeout.
#
#   bash benchmarks/gpu/gpu_bench.sh                 # results -> benchmarks/results/{comm,train}_<gpu>x<n>_<yyyymm>.jsonl
#   NGPU=4 STEPS=20 bash benchmarks/gpu/gpu_bench.sh
#
# Phase budget (8x H100/H200): comm ~2-3 min (5 ops x 1K..1G, 20 iters x 5 reps, 4 s per row cap),
# train ~3-4 min (zero1/zero2/zero3 strategies of a 0.4B llama, 15 steps each incl. 5 warm-up, DeepSpeed
# JIT-compiles fused_adam once, ~1 min on a fresh machine), report < 10 s.
# With a single GPU the NCCL sweep is skipped (NCCL needs >= 2 devices; two ranks cannot share one GPU)
# and a gloo sweep on 2 CPU ranks is recorded instead so the harness still runs end to end.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
export PATH="$(dirname "$(command -v "$PY")"):$PATH"   # the deepspeed launcher of the same environment
"$PY" -c "import torch, deepspeed; assert torch.cuda.is_available(), 'no CUDA device visible'" || {
  echo "gpu_bench: needs torch with CUDA and deepspeed importable by $PY" >&2; exit 2; }
NGPU="${NGPU:-$("$PY" -c 'import torch; print(torch.cuda.device_count())')}"
GPU_RAW="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
case "$GPU_RAW" in
  *H200*) GPU_TABLE=H200 ;;
  *H800*) GPU_TABLE=H800 ;;
  *H100*) GPU_TABLE=H100-SXM ;;
  *A100*80*) GPU_TABLE=A100-80G ;;
  *A100*) GPU_TABLE=A100-40G ;;
  *L40S*) GPU_TABLE=L40S ;;
  *) GPU_TABLE=H100-SXM ;;
esac
TAG="$(echo "${GPU_TABLE}" | tr 'A-Z' 'a-z' | tr -d '-')x${NGPU}"
STAMP="$(date -u +%Y%m)"
RES="${RES:-benchmarks/results}"
STEPS="${STEPS:-15}"
mkdir -p "$RES"
echo "gpu_bench: $NGPU x $GPU_RAW (table: $GPU_TABLE) -> $RES/*_${TAG}_${STAMP}.jsonl"
t0=$(date +%s)

# 1) Collectives. nccl-tests columns and busbw factors; every row is checked (#wrong).
if [ "$NGPU" -ge 2 ]; then
  timeout 240 "$PY" -m dstoolkit bench comm --backend nccl --world-size "$NGPU" \
    --ops all_reduce,all_gather,reduce_scatter,all_to_all,broadcast --sizes 1K:1G --iters 20 --warmup 5 --reps 5 \
    --time-budget-s 4 --no-progress --out "$RES/comm_nccl_${TAG}_${STAMP}.jsonl" \
    || echo "gpu_bench: comm sweep failed or timed out (exit $?)" >&2
else
  echo "gpu_bench: 1 GPU -- NCCL sweep skipped; recording a 2-rank gloo sweep instead"
  timeout 120 "$PY" -m dstoolkit bench comm --backend gloo --world-size 2 --sizes 1K:64M:4 --time-budget-s 2 \
    --no-progress --out "$RES/comm_gloo2_${TAG}host_${STAMP}.jsonl" || echo "gpu_bench: gloo sweep failed (exit $?)" >&2
fi
echo "gpu_bench: comm done after $(( $(date +%s) - t0 )) s"

# 2) Training throughput through the deepspeed launcher, estimate beside each measurement.
WORK="$(mktemp -d)"
GB=$(( 8 * NGPU ))
sed -e "s/^  gpus_per_node: .*/  gpus_per_node: ${NGPU}/" -e "s/^  gpu: .*/  gpu: ${GPU_TABLE}/" \
    -e "s/^  global_batch: .*/  global_batch: ${GB}/" benchmarks/gpu/gpu_bench_spec.yaml > "$WORK/spec.yaml"
if timeout 90 "$PY" -m dstoolkit generate "$WORK/spec.yaml" --out "$WORK/gen" > "$WORK/generate.log" 2>&1; then
  STRATS=$(ls "$WORK/gen" | grep -E '^zero[1-3]$' | sed 's/^/--strategy /' | tr '\n' ' ')
  # shellcheck disable=SC2086
  timeout 300 "$PY" -m dstoolkit bench train "$WORK/gen" --spec "$WORK/spec.yaml" $STRATS --steps "$STEPS" \
    --skip-steps 5 --world-size "$NGPU" --timeout-s 150 --no-progress \
    --out "$RES/train_${TAG}_${STAMP}.jsonl" || echo "gpu_bench: train bench failed or timed out (exit $?)" >&2
else
  echo "gpu_bench: dstoolkit generate failed:" >&2; tail -5 "$WORK/generate.log" >&2
fi
echo "gpu_bench: train done after $(( $(date +%s) - t0 )) s"

# 2b) The host floor (estimate.host_cost.host_layer_s): the same model at micro batch 1 x 1024 tokens, where
# the host's time to issue each block's kernels, not the GPU, sets the step. ZeRO-2 and ZeRO-3, ~2 min.
sed -e "s/^  micro_batch: .*/  micro_batch: 1/" -e "s/^  seq_len: .*/  seq_len: 1024/" "$WORK/spec.yaml" > "$WORK/spec_mb1.yaml"
if timeout 90 "$PY" -m dstoolkit generate "$WORK/spec_mb1.yaml" --out "$WORK/gen_mb1" > "$WORK/generate_mb1.log" 2>&1; then
  timeout 240 "$PY" -m dstoolkit bench train "$WORK/gen_mb1" --spec "$WORK/spec_mb1.yaml" --strategy zero2 --strategy zero3 \
    --steps 10 --skip-steps 4 --world-size "$NGPU" --timeout-s 110 --no-progress \
    --out "$RES/train_mb1_${TAG}_${STAMP}.jsonl" || echo "gpu_bench: micro-batch-1 bench failed or timed out (exit $?)" >&2
else
  echo "gpu_bench: dstoolkit generate (micro batch 1) failed:" >&2; tail -5 "$WORK/generate_mb1.log" >&2
fi
echo "gpu_bench: host-floor pass done after $(( $(date +%s) - t0 )) s"

# 3) Tables and plots from every result file.
"$PY" -m dstoolkit report "$RES" --include "*_${TAG}*_${STAMP}.jsonl" --out "$RES/report_${TAG}_${STAMP}.md" --force > /dev/null \
  && echo "gpu_bench: report -> $RES/report_${TAG}_${STAMP}.md"
rm -rf "$WORK"
echo "gpu_bench: total $(( $(date +%s) - t0 )) s"
