#!/usr/bin/env bash
# scripts/gpu_snapshot.sh — the committed tree (HEAD) as .carry/snap, for device runs while other
# work is uncommitted in the checkout: run `scripts/gpu_snapshot.sh`, then on the device machine
# (carry [".carry"]): `cd .carry/snap && source scripts/gpu_snapshot.sh --enter && <script>`.
# --enter links .carry/snap/.carry to the carried .carry (headers, models) and exports
# SPLITFLOW_COMMIT so benchmark JSON names the snapshot's commit.
if [[ ${1:-} == --enter ]]; then
  ln -sfn .. .carry
  export SPLITFLOW_COMMIT=$(cat .source-commit)
  return 0 2>/dev/null || exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry/snap && mkdir -p .carry/snap
git archive HEAD | tar -x -C .carry/snap
git rev-parse --short HEAD >.carry/snap/.source-commit
echo "snapshot of $(cat .carry/snap/.source-commit) in .carry/snap ($(du -sh .carry/snap | cut -f1))"
