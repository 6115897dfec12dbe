# Session 14, call 9: the odd chunk's signs put on by an add on the CUDA cores ((g ^ m) + (m & 0x01010101): no second
# mma, LT_MVB_SIGNADD) and T32 (every chunk's words through the signed table: 2 mma a pair; its own repack), against
# today's kernel: the mma.sync (12 a block) was call 8's largest part of the compute.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session14/mvb_ab14.py --signs 2>&1 | tail -18
