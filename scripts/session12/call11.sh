# Session 12, call 11: mvs (conflict-free lookups: 32 copies of the unsigned grid, signs by XOR and a second
# mma against -x) against mvi, and mvi's chunk pairs after the scale fix.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session12/mvc_proto.py 2>&1 | grep -A40 "^shape"
