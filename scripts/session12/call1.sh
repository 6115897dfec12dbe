# Session 12, call 1: session 11's `next` (SC = 3 / 4 against the default; Nsight source counters).
source scripts/device_setup.sh >/dev/null 2>&1
OUT=$OUT bash scripts/gpu_first_checks.sh next 2>&1 | grep -v "^  IQ3" | tail -60
