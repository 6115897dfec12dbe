# Session 11, call 16: mvt's timeline (scripts/mvt_timeline.py: when each team's trips land and its
# compute ends) over G4 and over repack12, after qx and after another mvt.
source scripts/device_setup.sh >/dev/null 2>&1
for s in "TIQ3_XXSG<1, 2>" "TIQ3_XXSW"; do
  timeout 60 python3 scripts/mvt_timeline.py --struct "$s"
  timeout 60 python3 scripts/mvt_timeline.py --struct "$s" --no-qx
done
