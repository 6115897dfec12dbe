// Generated from gguf-py's tables (kernels/iq_tables.py; tests/test_kernels_iq.py checks them).
__device__ const int IQ4_KVALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
