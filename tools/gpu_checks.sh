#!/usr/bin/env bash
# The test files on the GPU machine (after `source tools/device_setup.sh`), one summary line
# per file; the full output in ${OUT:-/tmp/lite-checks}/FILE.log. Files whose tests all skip there
# (no second GPU, no real model carried) say so in their line.
#   bash tools/gpu_checks.sh                  # every test file (GPU tests run, CPU tests too)
#   bash tools/gpu_checks.sh tests/test_cuda_backend.py
set -u
out=${OUT:-/tmp/lite-checks}; mkdir -p "$out"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/test_*.py)
rc=0
for f in "${files[@]}"; do
  name=$(basename "$f" .py)
  python3 -m pytest -q -p no:cacheprovider "$f" > "$out/$name.log" 2>&1 || rc=1
  printf '%-40s %s\n' "$name" "$(tail -1 "$out/$name.log")"
done
exit $rc
