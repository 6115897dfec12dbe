# Session 12, call 8: mvh (mvi over half blocks: even shares a warp; x's words loaded with the weights).
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session12/mvc_proto.py 2>&1 | grep -A40 "^shape"
