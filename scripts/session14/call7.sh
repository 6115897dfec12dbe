# Session 14, call 7: mvb's B fragments masked by IMADs on the FMA pipe (LT_MVB_IMASK) against LOP3s on the ALU pipe.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session14/mvb_ab14.py --imask 2>&1 | tail -12
