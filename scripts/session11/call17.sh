# Session 11, call 17: call 16 found mvt's CTAs ~4.8 us past their entry before the PDL wait lets them
# on; stamp 6 (the copies issued and the CTA's barrier passed, before the PDL wait) says which.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 60 python3 scripts/mvt_timeline.py
timeout 60 python3 scripts/mvt_timeline.py --teams 4x4 4096 14336
