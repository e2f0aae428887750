#!/usr/bin/env bash
# The real-engine bench on a CUDA host that has torch but no package index and no sgl-kernel
# (the device tool's GPU machine): run from the repository root as
#     bash bench/gpu_device_run.sh SITE_TAR OUT_DIR [bench_engine arguments ...]
# SITE_TAR is bench/gpu_bundle.py --site's site.tar.xz. It unpacks the bundle beside the host's own
# packages (first on the path, so SGLang's pinned versions win), puts the sgl_kernel stand-in and
# the CUDA patches of tests/sglang/cpu_standins on the path (AWP_GPU_STANDINS=1: fused ops on
# their torch paths, torch sampling, no CUDA graphs; docs/sglang.md, "GPU timings without
# weights"), checks the imports, then runs bench/bench_engine.py --gpu with the given arguments,
# writing engine-gpu.json / .log and the servers' logs into OUT_DIR; the bench is stopped after
# AWP_BENCH_TIMEOUT_S seconds (520), so the logs still come back from a call limited to 10 minutes.
set -uo pipefail
SITE_TAR="$1"; OUT_DIR="$2"; shift 2
mkdir -p "$OUT_DIR" /tmp/awp-site
t0=$(date +%s)
tar -xJf "$SITE_TAR" -C /tmp/awp-site || { echo "could not unpack $SITE_TAR"; exit 3; }
echo "unpacked in $(( $(date +%s) - t0 ))s"
export PYTHONPATH="$PWD:/tmp/awp-site:$PWD/tests/sglang/cpu_standins"
export AWP_GPU_STANDINS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       PYTHONUNBUFFERED=1 SGLANG_RUST_BUILD_MODE=never
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 - <<'PY' 2>&1 | tee "$OUT_DIR/imports.log"
import importlib.metadata as md, torch
import sglang.srt.server_args, sglang.srt.managers.scheduler, sglang.srt.models.llama, duckdb
import bench.bench_engine, serving_hooks.sglang_plugin
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))
print("sglang", md.version("sglang"), "transformers", md.version("transformers"))
print("plugins", [e.name for e in md.entry_points(group="sglang.srt.plugins")])
PY
[ "${PIPESTATUS[0]}" = 0 ] || { echo "imports failed"; exit 4; }
timeout "${AWP_BENCH_TIMEOUT_S:-520}" python3 bench/bench_engine.py --gpu --allow-load --attention-backend triton --out "$OUT_DIR/engine-gpu.json" \
    --work-dir /tmp/awp-work --quiet-wait 0 "$@" \
    2>&1 | tee "$OUT_DIR/engine-gpu.log"
rc=${PIPESTATUS[0]}
(cd /tmp/awp-work 2>/dev/null && find . -name '*.log' -size -20M | tar czf "$OUT_DIR/replica-logs.tar.gz" -T -) || true
echo "bench rc $rc after $(( $(date +%s) - t0 ))s"
exit $rc
