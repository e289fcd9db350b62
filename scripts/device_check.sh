#!/usr/bin/env bash
# One-shot GPU check, run on the device machine from the repository root:
#
#     bash scripts/device_check.sh            # with the wheels of .whl/ carried along
#
# 1. installs the carried wheels (.whl/: bitsandbytes, flwr, flwr-datasets, datasets, rouge-score,
#    transformers/peft as tested here, ...) into /tmp/site; 2. prints the GPU and package versions;
# then, newest checks first so that a short budget still reaches them:
# 3. the Deployment Engine on this GPU: scripts/launch_federation.py brings up a SuperLink and 2
#    SuperNodes (TLS, node authentication) and runs one FedUP class request, while nvidia-smi is
#    sampled to see the ClientApp processes on the GPU (forked from the launcher's ClientApp fork
#    server, so they carry its command line);
# 4. (LETHE_LLM=1, default) a whole in-process LLM run of Lethe with 4-bit clients, whose
#    results.json holds the rectification guard's record (Lethe never destroys utility, on the LLM
#    task too);
# 5. the 4-bit NF4 / FIRM-on-4-bit tests (tests/test_gpu_4bit.py);
# 6. (BENCH=1, default) times FIRM's merge, projection and Fisher on cuda and (CPU_BENCH=1) cpu
#    (benchmarks/bench_firm.py) and FedUP's filter training (benchmarks/bench_fedup.py --filter-only);
# 7. (STRETCH=1, default) a whole in-process LLM run of FIRM with 4-bit clients.
# Every step is guarded (a failure is reported, the next step runs) and time-boxed against one overall
# deadline (BUDGET seconds, default 480), so the whole finishes inside a 600 s device call. Everything
# printed goes to $OUT/device_log.txt too; results files are copied into $OUT with flat names.
set -o pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
OUT=${OUT:-/tmp/device_check_out}
BUDGET=${BUDGET:-480}
STRETCH=${STRETCH:-1}
LETHE_LLM=${LETHE_LLM:-1}
CPU_BENCH=${CPU_BENCH:-1}
BENCH=${BENCH:-1}
STRETCH_4BIT=${STRETCH_4BIT:-true}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/device-check.XXXXXX)
START=$(date +%s)
DEADLINE=$((START + BUDGET))
SUMMARY=()

section() { printf '\n==================== %s  [t=%ss]\n' "$1" "$(($(date +%s) - START))"; }

# step NAME MAX_SECONDS COMMAND...: run COMMAND under timeout, capped by the overall deadline; record OK/FAIL.
step() {
    local name=$1 limit=$2 left rc
    shift 2
    left=$((DEADLINE - $(date +%s) - 5))
    section "$name"
    if [ "$left" -lt 20 ]; then
        echo "SKIPPED: ${left}s left of the ${BUDGET}s budget"
        SUMMARY+=("SKIP  $name (no time left)")
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "+ $* (timeout ${limit}s)"
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    if [ $rc -eq 0 ]; then
        SUMMARY+=("OK    $name")
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        SUMMARY+=("FAIL  $name (timed out after ${limit}s)")
    else
        SUMMARY+=("FAIL  $name (exit $rc)")
    fi
    return 0
}

# The Deployment Engine on this GPU (docs/deployment.md): a SuperLink and 2 SuperNodes as separate
# processes, one FedUP class request on a short schedule. The ClientApp uses CUDA when it sees it; a
# sampler writes every GPU compute process (pid, memory, command line where /proc shows it) once a
# second, and the check fails unless a flwr-clientapp process was among them.
deploy_on_gpu() {
    local seen="$OUT/deploy_gpu_processes.txt" sampler results
    (while sleep 1; do
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null |
            while IFS=', ' read -r pid memory _; do
                echo "$(date +%s) pid=$pid memory=$memory $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-160)"
            done
    done) > "$seen" 2>&1 &
    sampler=$!
    step "deployment: SuperLink + 2 SuperNodes (TLS, node auth) on this GPU, fedup class" 200 \
        python3 scripts/launch_federation.py --nodes 2 --workdir "$WORK/federation" --timeout 170 --run-config \
        "method='fedup' scenario='class' pretrain-rounds=2 continue-rounds=1 local-epochs=1 fedup.epochs=20 mia-max-samples=30 outputs-dir='$WORK/deploy-out' cache-dir='$WORK/deploy-cache'"
    kill "$sampler" 2>/dev/null
    echo "GPU compute processes seen during the run: $(wc -l < "$seen") samples"
    grep -m 5 . "$seen"
    # a ClientApp forked from the launcher's fork server keeps the server's command line
    if grep -q "flwr-clientapp\|clientapp_commands.py serve" "$seen"; then
        echo "ClientApp processes on the GPU: $(grep "flwr-clientapp\|clientapp_commands.py serve" "$seen" | awk '{print $2}' | sort -u | wc -l)"
    elif [ -s "$seen" ]; then
        SUMMARY+=("FAIL  deployment: GPU processes seen, but none is a ClientApp by its command line (see deploy_gpu_processes.txt)")
    else
        SUMMARY+=("FAIL  deployment: no process used the GPU during the run")
    fi
    results=$(find "$WORK/deploy-out" -name results.json 2>/dev/null | head -1)
    [ -n "$results" ] && cp "$results" "$OUT/deploy_gpu_results.json" && echo "copied $results -> $OUT/deploy_gpu_results.json"
    cp -r "$WORK/federation/logs" "$OUT/deploy_logs" 2>/dev/null
    return 0
}

# inprocess_llm NAME METHOD LIMIT: one whole in-process llm-tofu run with 4-bit clients; its results
# are copied to $OUT as METHOD_4bit_results.{json,csv}.
inprocess_llm() {
    local name=$1 method=$2 limit=$3 results
    step "$name" "$limit" \
        python3 -m server_app.inprocess --clients 4 --run-config \
        "task='llm-tofu' method='$method' llm.load-in-4bit=$STRETCH_4BIT outputs-dir='$WORK/outputs-$method' cache-dir='$WORK/cache'"
    results=$(find "$WORK/outputs-$method" -name results.json 2>/dev/null | head -1)
    if [ -n "$results" ]; then
        cp "$results" "$OUT/${method}_4bit_results.json"
        cp "$WORK/outputs-$method/results.csv" "$OUT/${method}_4bit_results.csv" 2>/dev/null
        echo "copied $results -> $OUT/${method}_4bit_results.json"
    fi
}

main() {
    section "install carried wheels"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
    # the carried packages' commands (flwr, flower-superlink, flwr-clientapp, ...) land in /tmp/site/bin
    export PATH=/tmp/site/bin:$PATH
    ls .whl

    section "machine"
    date -u; nproc; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
    # If the carried transformers (the version the code was tested with) cannot be imported next to this
    # image's packages, fall back to the image's own transformers and say so.
    if ! timeout 120 python3 -c "import transformers, peft" 2>"$WORK/tf_err.txt"; then
        echo "WARNING: carried transformers/peft do not import; falling back to the image's transformers:"
        tail -3 "$WORK/tf_err.txt"
        rm -rf /tmp/site/transformers /tmp/site/transformers-*.dist-info
    fi
    timeout 120 python3 - <<'EOF' || SUMMARY+=("FAIL  versions / bitsandbytes smoke test")
import sys, importlib
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| available:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for name in ("transformers", "peft", "accelerate", "tokenizers", "huggingface_hub", "safetensors", "bitsandbytes",
             "flwr", "datasets", "nltk", "rouge_score", "dp_accounting", "numpy", "google.protobuf", "grpc"):
    try:
        module = importlib.import_module(name)
        print(f"  {name:16} {getattr(module, '__version__', '?'):12} {getattr(module, '__file__', '')}")
    except Exception as error:  # report, go on
        print(f"  {name:16} IMPORT FAILED: {type(error).__name__}: {error}")
import bitsandbytes as bnb
from bitsandbytes import cextension
print("bitsandbytes native library:", type(cextension.lib).__name__, getattr(cextension.lib, "_lib", ""))
w = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
packed, state = bnb.functional.quantize_4bit(w, quant_type="nf4")
back = bnb.functional.dequantize_4bit(packed, state)
print(f"NF4 round trip on cuda: packed {packed.dtype} {tuple(packed.shape)}, "
      f"relative error {float((back - w).norm() / w.norm()):.3f}")
EOF

    deploy_on_gpu
    if [ "$LETHE_LLM" = 1 ]; then
        inprocess_llm "in-process llm-tofu lethe run, 4 clients, llm.load-in-4bit=$STRETCH_4BIT" lethe 200
    fi

    step "pytest tests/test_gpu_4bit.py" 240 \
        python3 -m pytest -q -rA -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" tests/test_gpu_4bit.py
    # here a skip is a failure: the tests exist for this machine (no bitsandbytes, or no CUDA seen)
    if grep -qE 'skipped="[1-9]' "$OUT/gpu_tests.xml" 2>/dev/null; then
        SUMMARY+=("FAIL  tests/test_gpu_4bit.py: tests were SKIPPED on the GPU machine (see the skip reasons)")
    fi

    if [ "$BENCH" = 1 ]; then
        step "bench_firm: cuda, full size (3 x 14336 x 4096) + Fisher" 120 \
            python3 benchmarks/bench_firm.py --device cuda --clock wall --fisher
        if [ "$CPU_BENCH" = 1 ]; then
            step "bench_firm: cpu, full size, 1 repeat + Fisher (side by side)" 90 \
                python3 benchmarks/bench_firm.py --device cpu --clock wall --repeats 1 --fisher
        fi
        step "bench_fedup --filter-only: cpu vs cuda" 90 \
            python3 benchmarks/bench_fedup.py --filter-only --device cpu,cuda --filter-epochs 10
    fi

    if [ "$STRETCH" = 1 ]; then
        inprocess_llm "stretch: in-process llm-tofu firm run, 4 clients, llm.load-in-4bit=$STRETCH_4BIT" firm 300
    fi

    section "summary (total $(($(date +%s) - START))s)"
    printf '%s\n' "${SUMMARY[@]}"
}

main 2>&1 | tee "$OUT/device_log.txt"
