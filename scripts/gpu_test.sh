#!/usr/bin/env bash
# scripts/gpu_test.sh — the CUDA test run on the GPU machine (see README): configures with
# -DSPLITFLOW_CUDA=ON, builds the CUDA tests and test_e2e with ninja, runs `ctest -L backend_cuda`
# and test_e2e, and prints a short summary (the fixtures' measured bf16 logits errors included).
# Carried files (.carry/include, .carry/shared/models for test_e2e) as scripts/gpu_common.sh says.
# SANITIZE=1 also runs the whole CUDA test binary under compute-sanitizer memcheck.
# Logs go to $OUT when it is set (the device tool brings them back), else to the build dir.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
start=$SECONDS
gpu_build test_backend_cuda test_e2e

(cd "$build" && ctest -L backend_cuda --output-on-failure --timeout 300) >"$logs/ctest_backend_cuda.log" 2>&1
cuda_rc=$?
"$build/tests/test_e2e" >"$logs/test_e2e.log" 2>&1
e2e_rc=$?
san_rc=0
if [[ ${SANITIZE:-0} == 1 ]]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout "${SANITIZE_TIMEOUT:-600}" "$sanitizer" --tool memcheck --error-exitcode 9 "$build/tests/test_backend_cuda" \
    >"$logs/memcheck.log" 2>&1
  san_rc=$?
fi

echo "=== summary ==="
grep -h "\[cuda fixture\]" "$build/Testing/Temporary/LastTest.log" | sed 's/^.*\[cuda fixture\] //' || true
grep -E "tests passed|tests failed" "$logs/ctest_backend_cuda.log"
if [[ $cuda_rc -ne 0 ]]; then
  grep -A30 "The following tests FAILED" "$logs/ctest_backend_cuda.log"
  grep -B1 -A5 "Failure$" "$logs/ctest_backend_cuda.log" | head -80
fi
echo "test_e2e: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$logs/test_e2e.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]" "$logs/test_e2e.log" | head -20
if [[ ${SANITIZE:-0} == 1 ]]; then
  echo "memcheck (rc $san_rc): $(grep -E 'ERROR SUMMARY' "$logs/memcheck.log" | tail -1) $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$logs/memcheck.log" | tr '\n' ' ')"
fi
[[ $cuda_rc -eq 0 && $e2e_rc -eq 0 && $san_rc -eq 0 ]]
