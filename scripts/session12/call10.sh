# Session 12, call 10: mvi with chunk pairs (PR = 1: one tail a pair, every lane's useful) and 3 blocks ahead.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session12/mvc_proto.py 2>&1 | grep -A40 "^shape"
