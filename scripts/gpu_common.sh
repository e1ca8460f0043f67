# scripts/gpu_common.sh — sourced by the scripts/gpu_*.sh runs on the GPU machine. Sets root (the
# checkout), build, logs, gpus (visible GPUs) and SPLITFLOW_COMMIT, and gives gpu_build TARGET...:
# configure with CUDA, build those targets with every core, print the GPUs and the build time; on a
# failure print the errors and exit.
# The GPU machine lacks pcre2.h, xxhash.h and ../shared: carry them in the git-ignored .carry/
# folder (CARRY_DIR overrides it):
#   .carry/include/{pcre2,xxhash}.h  (cp /usr/include/...)  -> -DSPLITFLOW_EXTRA_INCLUDE
#   .carry/shared/models/<name>  (small models tests read)  -> SPLITFLOW_SHARED_DIR
# Environment: BUILD_DIR (build-gpu), CUDA (ON; OFF builds for the CPU), CARRY_DIR, LOGS (where logs go; else OUT when set: the device
# tool brings it back; else the build dir), SPLITFLOW_COMMIT (else .source-commit, else git).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
build=${BUILD_DIR:-build-gpu}
carry=${CARRY_DIR:-.carry}
logs=${LOGS:-${OUT:-$root/$build}}
mkdir -p "$logs"
export SPLITFLOW_COMMIT=${SPLITFLOW_COMMIT:-$(cat .source-commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)}
cmake_args=("-DSPLITFLOW_CUDA=${CUDA:-ON}")
[[ -d $carry/include ]] && cmake_args+=("-DSPLITFLOW_EXTRA_INCLUDE=$root/$carry/include")
if [[ -d $carry/shared ]]; then
  export SPLITFLOW_SHARED_DIR=$root/$carry/shared
  cmake_args+=("-DSPLITFLOW_SHARED_DIR=$SPLITFLOW_SHARED_DIR")
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')

gpu_build() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi: no GPU visible"
  local start=$SECONDS
  # PREBUILT=archive (made here by scripts/carry_prebuilt.sh, carried): a binary built on the
  # development machine and the libraries the GPU machine lacks, unpacked instead of a build — for
  # a call whose device time cannot hold the four-minute build.
  # An archive not carried this call (only what a call names travels) but unpacked by an earlier
  # call on the same warm machine is reused.
  if [[ -n ${PREBUILT:-} ]]; then
    if [[ -f $PREBUILT ]]; then
      mkdir -p "$build" && tar xJf "$PREBUILT" -C "$build" || exit 1
    else
      [[ -f $build/commit ]] || { echo "PREBUILT $PREBUILT: not here, and nothing unpacked in $build"; exit 1; }
    fi
    export LD_LIBRARY_PATH=$root/$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export SPLITFLOW_TEST_FIXTURES_DIR=$root/tests/fixtures  # a test binary's build path is this machine's
    for binary in "$build/splitflow" "$build/tests/test_backend_cuda"; do
      [[ -f $binary ]] && ldd "$binary" | grep "not found" && exit 1
    done
    echo "prebuilt $(cat "$build/commit" 2>/dev/null) unpacked: $((SECONDS - start)) s"
    return
  fi
  cmake -S . -B "$build" -G Ninja "${cmake_args[@]}" >"$logs/configure.log" 2>&1 || { tail -40 "$logs/configure.log"; exit 1; }
  # A script that needs more than the configure's success defines gpu_configure_check (it reads
  # $logs/configure.log and exits when something it needs was not found).
  if declare -F gpu_configure_check >/dev/null; then gpu_configure_check; fi
  if ! cmake --build "$build" -j"$(nproc)" --target "$@" >"$logs/build.log" 2>&1; then
    grep -E "error|Error" "$logs/build.log" | head -40
    exit 1
  fi
  echo "configure + build ($*): $((SECONDS - start)) s"
}
