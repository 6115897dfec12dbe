# Session 13, call 7: mvb<8, 1, 1, 0, 18> at 3 CTAs an SM (80 registers: the next product's CTAs find a slot
# while this one runs) against 2 (scripts/session13/mvb_ab13.py), and the timeline of both after qxe.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 120 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 300 python3 scripts/session13/mvb_ab13.py 2>&1 | tail -26
timeout 120 python3 -c "
import sys; sys.path.insert(0, 'scripts/session13')
import mvb_bands as mb
for m in (2, 3):
    mb.timeline((8, 1, 1), True, xlayout=18, min_ctas=m)
" 2>&1 | tail -30
