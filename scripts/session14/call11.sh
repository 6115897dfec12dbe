# Session 14, call 11: mvb<W, P, A, S, SG> -- a band's K in two halves over 2 CTAs (S = 2, the second summing both)
# and the odd chunk's signs by an add (SG = 1) -- its GPU tests, then the A/B at the kernel table's shapes.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 300 python3 scripts/session14/mvb_ab14.py --split 2>&1 | tail -18
