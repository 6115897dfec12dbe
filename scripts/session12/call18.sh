# Session 12, call 18: mvx (half of each chunk pair's lookups conflict-free: the even chunk through mvi's
# signed table, the odd through the unsigned grid's 32 copies) against mvi's chunk pairs and mvs.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session12/mvc_proto.py 2>&1 | grep -A40 "^shape"
