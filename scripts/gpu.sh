#!/usr/bin/env bash
# Everything the GPU machine runs, in one call, plus the steps around it on the development machine.
#
# The chosen way (docs/gpu-workflow.md): build HERE on Debian 12 with nvcc 13 (CUDA runtime linked statically,
# arch sm_90), gather the GPU programs and the few shared libraries the GPU machine's image lacks (fmt,
# utf8proc, pcre2, cpp-httplib, brotli) into build-cuda/gpu-bundle, and carry that folder with the device
# call; the programs run there with LD_LIBRARY_PATH=bundle. Nothing is compiled on the GPU machine (its
# image has no -dev packages).
#
#   scripts/gpu.sh pack            here: configure + build build-cuda (-j2), fill build-cuda/gpu-bundle
#   scripts/gpu.sh run             on the GPU machine (device `run`, carry ["build-cuda/gpu-bundle"]):
#                                  GPU op + end-to-end tests, then the op timings; JSON under $OUT, a table last
#   scripts/gpu.sh record DIR      here: copy the JSON that came back (DIR = files_at) into bench/results/
#   scripts/gpu.sh archive DIR...  here: bundles (QSPEC_BUNDLE=build-cuda/gpu-bundle-X pack) into one archive
#   scripts/gpu.sh ab              on the GPU machine (carry ["build-cuda/bundles.tgz"]): tests and step
#                                  times of every bundle in it, for comparing branches in one call
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build-cuda
BUNDLE=${QSPEC_BUNDLE:-$BUILD/gpu-bundle}  # another bundle (e.g. a branch's, for an A/B run) by QSPEC_BUNDLE

pack() {
  export PATH="$PATH:/usr/local/cuda/bin"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSPEC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  cmake --build "$BUILD" -j2 --target qspec qspec_cuda_tests qspec_cuda_bench
  rm -rf "$BUNDLE" && mkdir -p "$BUNDLE"
  cp "$BUILD/qspec" "$BUILD/tests/cuda/qspec_cuda_tests" "$BUILD/tests/cuda/qspec_cuda_bench" "$BUNDLE/"
  # Shared libraries of the Debian build that the GPU machine's image does not have (cuBLAS it has).
  for program in "$BUNDLE/qspec" "$BUNDLE/qspec_cuda_tests" "$BUNDLE/qspec_cuda_bench"; do
    ldd "$program" | awk '/libfmt|libutf8proc|libpcre2|libcpp-httplib|libbrotli/ {print $3}' | xargs -r -I{} cp -L {} "$BUNDLE/"
  done
  local commit
  commit=$(git rev-parse --short HEAD)
  git diff --quiet HEAD -- src tests/cuda CMakeLists.txt || commit="$commit+uncommitted"
  echo "$commit" >"$BUNDLE/COMMIT"
  du -sh "$BUNDLE"
}

run_on_gpu() {
  : "${OUT:?OUT must name the folder for results (set by the device tool)}"
  export LD_LIBRARY_PATH="$PWD/$BUNDLE:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  export QSPEC_COMMIT QSPEC_FIXTURES_DIR="$PWD/tests/fixtures"
  QSPEC_COMMIT=$(cat "$BUNDLE/COMMIT")
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
  local tests_status=0 bench_status=0
  QSPEC_CUDA_CHECKS_JSON="$OUT/cuda_checks.json" "$BUNDLE/qspec_cuda_tests" --gtest_brief=1 2>&1 |
    tee "$OUT/cuda_tests.log" || tests_status=$?
  # The 64-row prefill attention kernel (the path of GPUs where the paired kernel does not fit) here too.
  QSPEC_PREFILL_ATTENTION=rows64 QSPEC_CUDA_CHECKS_JSON="$OUT/cuda_checks_rows64.json" "$BUNDLE/qspec_cuda_tests" \
    --gtest_brief=1 --gtest_filter='CudaOps.Attention*' 2>&1 | tee -a "$OUT/cuda_tests.log" || tests_status=$?
  "$BUNDLE/qspec_cuda_bench" "$OUT/cuda_bench.json" 2>&1 || bench_status=$?
  # Out-of-bounds / uninitialised accesses in the kernels: the op tests once more under compute-sanitizer.
  local memcheck_status=0
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout 200 "$sanitizer" --tool memcheck --error-exitcode 3 "$BUNDLE/qspec_cuda_tests" \
    --gtest_brief=1 --gtest_filter="${QSPEC_MEMCHECK_FILTER:-CudaOps.*}" >"$OUT/memcheck.log" 2>&1 ||
    memcheck_status=$?
  # Model steps on the synthetic Qwen3.5-4B (exact layout, random weights), W4A16 g32 and BF16.
  local model_status=0
  mkdir -p "$OUT/records"  # qspec bench records, sent back as one archive (the device returns 8 files)
  for format in ${QSPEC_BENCH_FORMATS:-w4a16-g32 bf16}; do
    local dir=/tmp/qwen3.5-4b-$format
    { "$BUNDLE/qspec" synth --arch qwen3.5-4b --format "$format" --out "$dir" &&
      "$BUNDLE/qspec" inspect --model "$dir" &&
      "$BUNDLE/qspec" bench --model "$dir" --backend cuda --prefill "${QSPEC_BENCH_PREFILL:-64,2048,8192}" \
        --out "$OUT/records"; } 2>&1 | tee -a "$OUT/steps.log" || model_status=$?
  done
  # The W4A16 target without BF16 copies (--bf16-copies off: the W4A16 prefill kernel up to 2,048 rows, the
  # dequantization beyond), with the memory it saves.
  if [ -d "$STEP_TARGET" ]; then
    "$BUNDLE/qspec" bench --model "$STEP_TARGET" --backend cuda --bf16-copies off --prefill 64,128,2048 \
      --out "$OUT/records" 2>&1 | tee -a "$OUT/steps.log" || model_status=$?
  fi
  # Decode and verify at a 32k context, with the memory it takes (weights, state, workspaces).
  if [ -d "$STEP_TARGET" ]; then
    "$BUNDLE/qspec" bench --model "$STEP_TARGET" --backend cuda --context 32768 --prefill 64 \
      --out "$OUT/records" 2>&1 | tee -a "$OUT/steps.log" || model_status=$?
  fi
  # Speculative decoding on the W4A16 target: the DFlash drafter's layout (W4A16 g128), the draft and commit
  # steps, then the competition protocol at oracle acceptance lengths, without and with the drafter running;
  # the draft step again with the drafter's W4A16 copy of the head (--draft-head w4a16).
  local spec_status=0
  local target=$STEP_TARGET drafter=$STEP_DRAFTER
  if [ -d "$target" ]; then
    { "$BUNDLE/qspec" synth --arch dflash-qwen3.5-4b --format w4a16-g128 --out "$drafter" &&
      "$BUNDLE/qspec" bench --model "$target" --backend cuda --draft-model "$drafter" --prefill 64 --e2e \
        --acceptance 1,4,8,16 --e2e-runs "${QSPEC_E2E_RUNS:-5}" --out "$OUT/records" &&
      "$BUNDLE/qspec" bench --model "$target" --backend cuda --draft-model "$drafter" --draft-head w4a16 \
        --prefill 64 --out "$OUT/records"; } 2>&1 |
    tee "$OUT/spec.log" || spec_status=$?
  fi
  # Where the step time goes, kernel by kernel (Nsight Compute; QSPEC_PROFILE=0 skips it).
  local profile_status=0
  if [ "${QSPEC_PROFILE:-1}" = 1 ] && [ -d "$target" ]; then
    timeout 240 python3 scripts/gpu_profile.py "$BUNDLE" "$target" "$drafter" "$OUT/profile.json" \
      >"$OUT/profile.log" 2>&1 || profile_status=$?
  fi
  # The records first: a failure of the summary below must not lose them.
  tar czf "$OUT/records.tgz" -C "$OUT/records" . && rm -rf "$OUT/records"
  python3 - "$OUT" <<'PY' || echo "the summary table failed (the JSON and logs are kept)"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print("\n== CUDA vs CPU: per op, worst case (max |gpu-cpu| / max |cpu|) ==")
try:
    report = json.loads((out / "cuda_checks.json").read_text())
    by_op = {}
    for c in report["checks"]:
        err = float("inf") if c["error"] == "inf" else c["error"]
        worst = by_op.setdefault(c["op"], {"n": 0, "fail": 0, "ratio": -1, "err": 0, "tol": 0})
        worst["n"] += 1
        worst["fail"] += not c["passed"]
        ratio = err / c["tolerance"] if c["tolerance"] > 0 else (0 if err == 0 else float("inf"))
        if ratio > worst["ratio"]:
            worst.update(ratio=ratio, err=err, tol=c["tolerance"])
    print(f"{'op':<18}{'cases':>6}{'max error':>12}{'tolerance':>11}  result")
    for op, w in by_op.items():
        print(f"{op:<18}{w['n']:>6}{w['err']:>12.2e}{w['tol']:>11.1e}  {'PASS' if w['fail'] == 0 else 'FAIL x%d' % w['fail']}")
    print(f"gtest status {report['gtest_status']}")
except (OSError, ValueError) as e:
    print(f"no test results: {e}")
print("\n== first timings (GB/s vs 4.16 TB/s measured) ==")
try:
    bench = json.loads((out / "cuda_bench.json").read_text())
    print(f"{bench['gpu']}, commit {bench['commit']}")
    for o in bench["ops"]:
        if "GB_per_s" in o:
            print(f"{o['op']:<60}{o['us']:>9.1f} us{o['GB_per_s']:>8.0f} GB/s{100 * o['fraction_of_4_16_TB_per_s']:>6.1f}%")
        else:
            print(f"{o['op']:<60}{o['us']:>9.1f} us  " + ", ".join(f"{k} {v}" for k, v in o.items() if k not in ("op", "us")))
except (OSError, ValueError) as e:
    print(f"no timings: {e}")
PY
  [ -f "$OUT/profile.log" ] && tail -n 60 "$OUT/profile.log"
  echo "memcheck of the op tests: exit $memcheck_status ($(grep -c '^========= Invalid' "$OUT/memcheck.log" || true) invalid accesses; 124 = timed out)"
  grep -E -A8 '^(memory|step) ' "$OUT/steps.log" | grep -v '^recorded' || true
  grep -E '^(step|draft|commit|decode|verify|prefill|e2e|plain|accept|prompt )|^[0-9]+ +[0-9]+ ' "$OUT/spec.log" 2>/dev/null || true
  # The device returns at most 8 files: the logs travel as one archive.
  tar czf "$OUT/logs.tgz" -C "$OUT" gpu.txt cuda_tests.log memcheck.log steps.log $(cd "$OUT" && ls spec.log profile.log 2>/dev/null) &&
    (cd "$OUT" && rm -f gpu.txt cuda_tests.log memcheck.log steps.log spec.log profile.log)
  echo "tests exit $tests_status, bench exit $bench_status, model steps exit $model_status, speculative $spec_status, profile $profile_status"
  [ "$tests_status" -eq 0 ] && [ "$bench_status" -eq 0 ] && [ "$memcheck_status" -eq 0 ] &&
    [ "$model_status" -eq 0 ] && [ "$spec_status" -eq 0 ]
}

record() {
  local from=${1:?usage: scripts/gpu.sh record FILES_AT}
  local stamp
  stamp=$(date -u +%Y%m%dT%H%MZ)
  mkdir -p bench/results
  for name in cuda_checks cuda_checks_rows64 cuda_bench profile; do
    [ -f "$from/$name.json" ] && cp "$from/$name.json" "bench/results/$stamp-h200-$name.json"
  done
  [ -f "$from/records.tgz" ] && tar xzf "$from/records.tgz" -C bench/results --wildcards '*.json'
  ls bench/results | grep "$stamp"
}

# Several bundles in one archive, xz -9: its dictionary spans the bundles (one full and three slim bundles of
# stripped programs: ~5 MB), under the 64 MiB carry with the tracked files (~54.5 MB in 1 KB blocks).
archive() {
  [ "$#" -gt 0 ] || { echo "usage: scripts/gpu.sh archive BUNDLE_DIR..." >&2; exit 2; }
  local names=()
  for dir in "$@"; do names+=("$(basename "$dir")"); done
  tar cf - -C "$BUILD" "${names[@]}" | xz -9e -T0 >"$BUILD/bundles.tgz"
  du -sh "$BUILD/bundles.tgz"
}

# The bundles in build-cuda/bundles.tgz (the folders holding a COMMIT), one name a line.
archived_bundles() {
  tar tf "$BUILD/bundles.tgz" | sed -n 's|/COMMIT$||p'
}

# Every archived bundle on the library path (they are built alike): a slim bundle finds its libraries in
# another.
export_bundle_libraries() {
  local path=/usr/local/cuda/lib64 bundle
  for bundle in $(archived_bundles); do path="$PWD/$BUILD/$bundle:$path"; done
  export LD_LIBRARY_PATH="$path"
}

# Archived bundle $1: its folder in `bundle`, its log name in `name`, and QSPEC_COMMIT (the records' commit
# field, as in run_on_gpu) set to its commit.
enter_bundle() {
  bundle=$BUILD/$1
  QSPEC_COMMIT=$(cat "$bundle/COMMIT")
  name=$(basename "$bundle")-$QSPEC_COMMIT
}

# The synthetic 4B target and drafter whose steps ab and graphs time, made by bundle folder $1's qspec unless
# an earlier bundle made them.
STEP_TARGET=/tmp/qwen3.5-4b-w4a16-g32
STEP_DRAFTER=/tmp/dflash-qwen3.5-4b-w4a16-g128
synth_step_models() {
  [ -d "$STEP_TARGET" ] || "$1/qspec" synth --arch qwen3.5-4b --format w4a16-g32 --out "$STEP_TARGET" >/dev/null
  [ -d "$STEP_DRAFTER" ] ||
    "$1/qspec" synth --arch dflash-qwen3.5-4b --format w4a16-g128 --out "$STEP_DRAFTER" >/dev/null
}

# QSPEC_AB_VARIANTS entry $1 ("NAME=BUNDLE:VAR=VALUE,..."): enter_bundle's variables for its bundle, the
# variant's name appended to `name`, and its assignments in the array `settings`.
enter_variant() {
  local spec=${1#*=}
  enter_bundle "${spec%%:*}"
  name=$name-${1%%=*}
  IFS=, read -ra settings <<<"${spec#*:}"
}

# The current bundle's GPU tests (if it has them) logged as $1, under the environment assignments after it.
ab_tests() {
  local log=$1 status=0
  shift
  [ -x "$bundle/qspec_cuda_tests" ] || return 0
  env "$@" QSPEC_FIXTURES_DIR="$PWD/tests/fixtures" "$bundle/qspec_cuda_tests" --gtest_brief=1 \
    >"$work/$log-tests.log" 2>&1 || status=$?
  env "$@" QSPEC_PREFILL_ATTENTION=rows64 QSPEC_FIXTURES_DIR="$PWD/tests/fixtures" "$bundle/qspec_cuda_tests" \
    --gtest_brief=1 --gtest_filter='CudaOps.Attention*' >>"$work/$log-tests.log" 2>&1 || status=$?
  echo "$log: cuda tests exit $status ($(grep -c '^\[  FAILED' "$work/$log-tests.log" || true) failed)"
}

# The current bundle's step times of round $2 logged as $1, under the environment assignments after them.
# QSPEC_AB_E2E=1,16 (acceptance lengths) adds the end-to-end protocol (3 timed requests; the short category, or
# the prompt lengths in QSPEC_AB_E2E_PROMPTS, e.g. 64,2048),
# where a verify step follows a commit (the bench's steps do not).
ab_steps() {
  local log=$1 round=$2
  shift 2
  local e2e=()
  [ -n "${QSPEC_AB_E2E:-}" ] &&
    e2e=(--e2e --e2e-prompts "${QSPEC_AB_E2E_PROMPTS:-64}" --acceptance "$QSPEC_AB_E2E" --e2e-runs 3)
  env "$@" "$bundle/qspec" bench --model "$STEP_TARGET" --backend cuda --draft-model "$STEP_DRAFTER" \
    --prefill "${QSPEC_AB_PREFILL:-64,2048}" "${e2e[@]}" --out "$work/$log-records" \
    >"$work/$log-round$round-steps.log" 2>&1 || echo "$log: qspec bench failed"
}

# On the GPU machine, carrying build-cuda/bundles.tgz: for each bundle in it, the GPU tests, the W4A16
# linear timings (QSPEC_AB_OPS=0 skips them) and the decode / verify / draft steps of the 4B (shorter than a
# full run: no memcheck, no end-to-end protocol). The steps per bundle come last; logs go to $OUT/ab.tgz.
# A slim bundle (qspec and COMMIT only: `strip`ped copies keep several under the carry limit) skips the tests
# and op timings it has no programs for and finds its libraries in the other bundles. QSPEC_AB_ROUNDS=N
# times the steps in N alternating rounds (the machine drifts by ~1% between minutes). QSPEC_AB_VARIANTS
# adds runs of a bundle under developer settings, "NAME=BUNDLE:VAR=VALUE[,VAR=VALUE...]" separated by spaces
# (e.g. "pdloff=gpu-bundle-x:QSPEC_PDL=0"): their steps join every round, and with QSPEC_AB_VARIANT_TESTS=1
# their GPU tests run too.
ab() {
  : "${OUT:?OUT must name the folder for results (set by the device tool)}"
  tar xf "$BUILD/bundles.tgz" -C "$BUILD"
  local work=/tmp/ab
  rm -rf "$work"  # an earlier call on the same machine must not add its logs to this one
  mkdir -p "$work"
  local bundles
  bundles=$(archived_bundles)
  export_bundle_libraries
  export QSPEC_COMMIT
  local entry bundle name variant settings=()
  for entry in $bundles; do
    enter_bundle "$entry"
    ab_tests "$name"
    synth_step_models "$bundle"
    if [ "${QSPEC_AB_OPS:-1}" = 1 ] && [ -x "$bundle/qspec_cuda_bench" ]; then  # ~60 s a bundle
      "$bundle/qspec_cuda_bench" "$work/$name-ops.json" >"$work/$name-ops.log" 2>&1 || echo "$name: op bench failed"
    fi
  done
  if [ "${QSPEC_AB_VARIANT_TESTS:-0}" = 1 ]; then
    for variant in ${QSPEC_AB_VARIANTS:-}; do
      enter_variant "$variant"
      ab_tests "$name" "${settings[@]}"
    done
  fi
  local round
  for round in $(seq "${QSPEC_AB_ROUNDS:-1}"); do
    for entry in $bundles; do
      enter_bundle "$entry"
      ab_steps "$name" "$round"
    done
    for variant in ${QSPEC_AB_VARIANTS:-}; do
      enter_variant "$variant"
      ab_steps "$name" "$round" "${settings[@]}"
    done
  done
  tar czf "$OUT/ab.tgz" -C "$work" .
  for log in "$work"/*-steps.log; do
    echo "== $(basename "$log" -steps.log)"
    grep -E '^(decode|verify|draft|commit|prefill)|^[0-9]+ +[0-9]+ ' "$log" || true
  done
  for log in "$work"/*-ops.log; do
    [ -f "$log" ] || continue
    echo "== $(basename "$log" -ops.log) linears"
    grep -E '^linear W4A16 g(32|128) M=' "$log" || true
  done
}

# On the GPU machine, carrying build-cuda/bundles.tgz: where each bundle's step graphs (decode, verify, draft,
# commit, prefill 64) spend their time, node by node as the GPU runs them (graph_profile.h); the JSON lines
# go to $OUT/graphs-BUNDLE.jsonl, the summaries to stdout.
graphs() {
  : "${OUT:?OUT must name the folder for results (set by the device tool)}"
  tar xf "$BUILD/bundles.tgz" -C "$BUILD"
  local bundles  # QSPEC_GRAPH_BUNDLES: some of them (names in the archive)
  bundles=${QSPEC_GRAPH_BUNDLES:-$(archived_bundles)}
  export_bundle_libraries
  for bundle in $bundles; do
    bundle=$BUILD/$bundle
    local name
    name=$(basename "$bundle")-$(tr -c 'a-z0-9\n' - <"$bundle/COMMIT")
    synth_step_models "$bundle"
    QSPEC_GRAPH_PROFILE="$OUT/graphs-$name.jsonl" "$bundle/qspec" bench --model "$STEP_TARGET" --backend cuda \
      --draft-model "$STEP_DRAFTER" --prefill 64 --repeats 3 --out /tmp/graphs-records >"$OUT/graphs-$name.log" 2>&1 ||
      { echo "$name: qspec bench failed"; tail -5 "$OUT/graphs-$name.log"; }
    echo "#### $name"
    python3 scripts/graph_profile.py "$OUT/graphs-$name.jsonl"
  done
}

case "${1:-}" in
  pack) pack ;;
  run) run_on_gpu ;;
  graphs) graphs ;;
  record) record "${2:-}" ;;
  archive)
    shift
    archive "$@"
    ;;
  ab) ab ;;
  *)
    echo "usage: scripts/gpu.sh pack | run | graphs | record FILES_AT | archive BUNDLE_DIR... | ab" >&2
    exit 2
    ;;
esac
