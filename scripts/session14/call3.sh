# Session 14, call 3: session 13's mvb with the signed table 16 KB aligned in dynamic shared memory (LT_MVB_ALIGN: a
# lookup's address one LOP3) and / or its weights not allocated in L1 (LT_MVB_L1NA), against session 13's text.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 500 python3 scripts/session14/mvb_ab14.py --timeline 2>&1 | tail -48
