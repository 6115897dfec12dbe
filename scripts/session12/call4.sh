# Session 12, call 4: the tensor-core prototypes (scripts/session12/mvc_proto.py: mvc f16 mma, mvi int8
# mma over a made-up band layout and random fields) against float64, and their times.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session12/mvc_proto.py 2>&1 | tail -30
