#!/usr/bin/env bash
# scripts/gpu_comm.sh — the collectives run on a multi-GPU machine (nvidia-h200-x2 through the
# device tool): configures with -DSPLITFLOW_CUDA=ON, builds test_comm, test_comm_cuda and splitflow,
# prints how the GPUs are linked, runs the CPU and multi-GPU comm tests, then
# `splitflow bench allreduce`; prints a short summary (accuracy table, latency tables).
#
# The GPU machine lacks pcre2.h and xxhash.h: carry .carry/include (see scripts/gpu_test.sh).
# NCCL: the CUDA toolkit's when it has one, else the nvidia-nccl Python wheel's (SPLITFLOW_NCCL_ROOT
# overrides). Logs and the bench JSON go to $OUT when set (the device tool brings them back).
# TESTS=0 skips the tests, BENCH=0 the benchmark; BENCH_ARGS adds arguments to it; GTEST_ARGS to
# test_comm_cuda (e.g. --gtest_filter=...).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${BUILD_DIR:-build-gpu-comm}
carry=${CARRY_DIR:-.carry}
logs=${OUT:-$root/$build}
mkdir -p "$logs"
# NVLink multicast stays off (the machine's rule); workers inherit it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

echo "=== GPUs ==="
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv,noheader || echo "nvidia-smi: no GPU visible"
nvidia-smi topo -m 2>&1 | head -12
nvidia-smi nvlink --status -i 0 2>&1 | head -4

# NCCL: the toolkit's when it has one, else the nvidia-nccl wheel's.
nccl_root=${SPLITFLOW_NCCL_ROOT:-}
if [[ -z $nccl_root && ! -e /usr/local/cuda/include/nccl.h ]]; then
  nccl_root=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
fi
echo "NCCL root: ${nccl_root:-CUDA toolkit}"
export LD_LIBRARY_PATH=${nccl_root:+$nccl_root/lib:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}

# PREBUILT=<folder> with test_comm, test_comm_cuda and splitflow built elsewhere (x86-64, CUDA 13;
# extra shared libraries in <folder>/lib) skips the build when every library they need is found;
# <folder>/.source-commit (`git describe --always --dirty` where they were built) names their
# commit in the bench JSON (a binary run outside its checkout cannot ask git).
test_comm= test_comm_cuda= splitflow=
if [[ -n ${PREBUILT:-} ]]; then
  # Libraries the build machine had and this one may lack travel in $PREBUILT/lib.
  [[ -d $PREBUILT/lib ]] && export LD_LIBRARY_PATH=$PREBUILT/lib:$LD_LIBRARY_PATH
  missing=$(ldd "$PREBUILT/test_comm_cuda" "$PREBUILT/splitflow" "$PREBUILT/test_comm" 2>&1 | grep "not found" | sort -u)
  if [[ -z $missing ]]; then
    test_comm=$PREBUILT/test_comm test_comm_cuda=$PREBUILT/test_comm_cuda splitflow=$PREBUILT/splitflow
    echo "using prebuilt binaries from $PREBUILT"
    [[ -f $PREBUILT/.source-commit ]] && export SPLITFLOW_COMMIT=$(cat "$PREBUILT/.source-commit")
  else
    echo "prebuilt binaries miss libraries, building instead: $missing"
  fi
fi
if [[ -z $splitflow ]]; then
  args=(-DSPLITFLOW_CUDA=ON)
  [[ -d $carry/include ]] && args+=("-DSPLITFLOW_EXTRA_INCLUDE=$root/$carry/include")
  [[ -n $nccl_root ]] && args+=("-DSPLITFLOW_NCCL_ROOT=$nccl_root")
  start=$SECONDS
  cmake -S . -B "$build" -G Ninja "${args[@]}" >"$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
  if ! cmake --build "$build" -j16 --target test_comm test_comm_cuda splitflow >"$logs/build.log" 2>&1; then
    grep -E "error|Error" "$logs/build.log" | head -40
    exit 1
  fi
  echo "configure + build: $((SECONDS - start)) s"
  test_comm=$build/tests/test_comm test_comm_cuda=$build/tests/test_comm_cuda splitflow=$build/splitflow
fi

rc=0
if [[ ${TESTS:-1} == 1 ]]; then
  "$test_comm" >"$logs/test_comm.log" 2>&1 || rc=1
  echo "test_comm: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$logs/test_comm.log" | tr '\n' ' ')"
  start=$SECONDS
  timeout 200 "$test_comm_cuda" ${GTEST_ARGS:-} >"$logs/test_comm_cuda.log" 2>&1 || rc=1
  echo "test_comm_cuda ($((SECONDS - start)) s): $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$logs/test_comm_cuda.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|error:|trapping" "$logs/test_comm_cuda.log" | sort | uniq -c | head -30
  grep -h "\[comm" "$logs/test_comm_cuda.log" | sed 's/^\[comm[a-z ]*\] //'
fi
if [[ ${BENCH:-1} == 1 ]]; then
  start=$SECONDS
  # shellcheck disable=SC2086
  timeout 150 "$splitflow" bench allreduce --results-dir "$logs" ${BENCH_ARGS:-} >"$logs/bench.log" 2>&1 || rc=1
  echo "=== bench allreduce ($((SECONDS - start)) s) ==="
  sed -n '/^allreduce latency/,$p' "$logs/bench.log"
  grep -E "error" "$logs/bench.log" | head -10
fi
exit $rc
