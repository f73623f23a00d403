#!/usr/bin/env bash
# One check-and-measure pass on a GPU host, in parts that each fit a 10-minute command:
#
#   PART=suite-a  bash benchmarks/gpu_pass.sh   # pytest -m gpu, all but the zoo, emit and tune --model
#   PART=suite-b  bash benchmarks/gpu_pass.sh   # pytest -m gpu: the zoo, emit and tune --model
#   PART=llama    bash benchmarks/gpu_pass.sh   # epilab tune --model on transformers' Llama (defaults)
#   PART=convnext bash benchmarks/gpu_pass.sh   # ... on torchvision's ConvNeXt-T (defaults)
#   PART=mobilenet bash benchmarks/gpu_pass.sh  # ... on torchvision's MobileNetV3-L (defaults)
#   PART=report   bash benchmarks/gpu_pass.sh   # tune --suite quick,llm into a database for the example report
#
# Logs, JUnit XML, databases and --out JSON go to $OUT (default ./gpu-pass); each part prints
# its wall time and, for the suites, the failures by name (-v -rfE: named even when cut off).
# LIMIT (seconds) bounds each part; N is pytest-xdist's worker count. Where a folder .whl holds
# wheels of what the host lacks (optuna, SQLAlchemy, alembic ...), they are installed first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-pass}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
fi
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log --oneline -1 2>/dev/null
} | tee "$OUT/host.txt"

suite() {  # $1: part name, rest: pytest selection
  local part=$1
  shift
  timeout "${LIMIT:-520}" python3 -m pytest -m gpu -n "${N:-16}" -p no:benchmark -p no:cacheprovider \
    -v -rfE "$@" --junitxml "$OUT/junit-$part.xml" >"$OUT/$part.log" 2>&1
  echo "$part: exit $? ($(grep -cE ' PASSED' "$OUT/$part.log") passed)"
  grep -E "^(FAILED|ERROR)" "$OUT/$part.log" | head -40
  tail -2 "$OUT/$part.log"
}

tune_model() {  # $1: name, $2: factory, rest: options
  local name=$1 factory=$2
  shift 2
  (cd tests && timeout "${LIMIT:-540}" epilab tune --model "zoo.factories:$factory" "$@" \
    --db "$OUT/$name.db" --out "$OUT/$name.json" >"$OUT/$name.log" 2>&1)
  echo "$name: exit $?"
  tail -25 "$OUT/$name.log"
}

start=$(date +%s)
case "${PART:?set PART: suite-a, suite-b, llama, convnext, mobilenet or report}" in
  suite-a) suite suite-a tests --ignore tests/test_zoo.py --ignore tests/test_emit.py \
             --ignore tests/test_model_tuning.py ;;
  suite-b) suite suite-b tests/test_zoo.py tests/test_emit.py tests/test_model_tuning.py ;;
  llama) tune_model llama hf_llama --input 4x512x2048:bfloat16 ;;
  convnext) tune_model convnext tv_convnext_tiny ;;
  mobilenet) tune_model mobilenet tv_mobilenet_v3_large ;;
  report)
    timeout "${LIMIT:-540}" epilab tune --suite quick,llm --trials 12 --db "$OUT/quick-llm.db" \
      >"$OUT/report.log" 2>&1
    echo "report: exit $?"
    epilab report --db "$OUT/quick-llm.db" --out "$OUT/quick-llm.html" && tail -5 "$OUT/report.log" ;;
  *) echo "unknown PART $PART" >&2; exit 2 ;;
esac
echo "wall $(($(date +%s) - start)) s"
