# Source this at the start of a command on the GPU machine (run with carry: [".whl"]):
#   source tools/device_setup.sh && python3 -m pytest -q tests/...
#   source tools/device_setup.sh && gpu_checks [FILES...]    # the test files, one line each (below)
# The device image has no gguf and a numpy (2.5) that breaks numba-cuda 0.30: put the carried
# wheels (numpy 2.4.6, gguf) first on the path, then install lite itself offline. On a warm machine
# where an earlier call installed the wheels into /tmp/site, a call may come without .whl (to carry
# a 60 MB model piece instead: tools/carry_model.sh).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
elif [ ! -d /tmp/site ]; then
  echo "device_setup: no .whl carried and no /tmp/site from an earlier call" >&2
fi
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-index --no-build-isolation . >/dev/null
# Do not put the current directory on sys.path: the source folder ./lite would hide the
# installed package, whose lite.kernels / lite.models / lite.cli come from other folders.
export PYTHONSAFEPATH=1

# gpu_checks [FILES...]: the test files (default: every tests/test_*.py; GPU tests run, CPU tests too),
# one summary line per file; the full output in ${OUT:-/tmp/lite-checks}/FILE.log. Files whose tests
# all skip there (no second GPU, no real model carried) say so in their line. Returns 1 if any failed.
gpu_checks() {
  local out=${OUT:-/tmp/lite-checks} rc=0 f name
  local files=("$@")
  mkdir -p "$out"
  [ ${#files[@]} -gt 0 ] || files=(tests/test_*.py)
  for f in "${files[@]}"; do
    name=$(basename "$f" .py)
    python3 -m pytest -q -p no:cacheprovider "$f" > "$out/$name.log" 2>&1 || rc=1
    printf '%-40s %s\n' "$name" "$(tail -1 "$out/$name.log")"
  done
  return $rc
}
