# Session 11, call 1: session 10's `bash scripts/gpu_first_checks.sh next` (mvm sweeps, the 30B-A3B
# IQ3_XXS trace, the kernel table) as it stood at the session's start (HEAD 290afd4).
source scripts/device_setup.sh && nvidia-smi -L && bash scripts/gpu_first_checks.sh next 2>&1 | tail -120
