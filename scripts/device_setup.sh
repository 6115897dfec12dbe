# Source this at the start of a command on the GPU machine (run with carry: [".whl"]):
#   source scripts/device_setup.sh && python3 -m pytest -q tests/...
# The device image has no gguf and a numpy (2.5) that breaks numba-cuda 0.30: put the carried
# wheels (numpy 2.4.6, gguf) first on the path, then install lite itself offline.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-index --no-build-isolation . >/dev/null
# Do not put the current directory on sys.path: the source folder ./lite would hide the
# installed package, whose lite.kernels / lite.models / lite.cli come from other folders.
export PYTHONSAFEPATH=1
