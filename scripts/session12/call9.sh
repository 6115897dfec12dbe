# Session 12, call 9: mvi with even shares at 14336 columns (14 warps: 4 blocks each) and x's words
# loaded a block ahead with the weights (XP = 1).
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session12/mvc_proto.py 2>&1 | grep -A40 "^shape"
