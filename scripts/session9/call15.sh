#!/usr/bin/env bash
# Session 9, call 15 (warm after call 14; run as this one command line): test_experts_iq and
# test_cuda_backend (the real-model and gemma3 tests deselected for time) with the IQ3_XXS epilogues.
source scripts/device_setup.sh >/dev/null 2>&1; timeout 100 python3 -m pytest -q tests/test_experts_iq.py tests/test_cuda_backend.py -k "not real and not gemma" 2>&1 | grep -E "^FAILED|^ERROR|passed|failed" | tail -5
