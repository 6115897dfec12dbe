#!/usr/bin/env bash
# Build llama.cpp's llama-bench with CUDA for sm_90 on this (GPU-less) machine, to run it on the
# device machine as the peer of `lite bench` (the device reaches no registry and has no llama.cpp).
# ~1.5-2 h on 2 cores. Everything lives under ${LLB:-/tmp/llb}.
#   - source: the llama-cpp-python sdist (vendor/llama.cpp), `pip download --no-deps --no-binary :all:
#     llama-cpp-python==0.3.36`
#   - cuBLAS: the local CUDA toolkit has nvcc but no cuBLAS; the `nvidia-cublas` wheel provides
#     headers and libcublas.so.13 (the device's toolkit provides the same soname at run time)
#   - libcuda: no driver here, so a stub with the few driver symbols ggml-cuda links (soname
#     libcuda.so.1; the device's real driver library is loaded at run time)
# Then carry build-cuda/bin/llama-bench (split if over the carry limit) and run on the device:
#   ./llama-bench -m /tmp/8b.gguf -p 8192,32768 -n 128 -fa 1 -ngl 99 -r 3
set -euo pipefail
LLB=${LLB:-/tmp/llb}; mkdir -p "$LLB" && cd "$LLB"
ls llama_cpp_python-0.3.36.tar.gz >/dev/null 2>&1 || pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
[ -d llama_cpp_python-0.3.36 ] || tar xzf llama_cpp_python-0.3.36.tar.gz
CUDA=${CUDA_HOME:-/usr/local/cuda}
if [ ! -e "$CUDA/lib64/libcublas.so" ]; then
  ls nvidia_cublas-*.whl >/dev/null 2>&1 || pip download --no-deps nvidia-cublas
  mkdir -p cublas && (cd cublas && unzip -q -o ../nvidia_cublas-*.whl)
  cp cublas/nvidia/cu13/include/*.h "$CUDA/include/"
  cp cublas/nvidia/cu13/lib/libcublas.so.13 cublas/nvidia/cu13/lib/libcublasLt.so.13 "$CUDA/lib64/"
  ln -sf libcublas.so.13 "$CUDA/lib64/libcublas.so"; ln -sf libcublasLt.so.13 "$CUDA/lib64/libcublasLt.so"
fi
mkdir -p stub
for f in cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree cuMemAddressReserve \
         cuMemCreate cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap \
         cuDriverGetVersion cuInit cuGetProcAddress cuGetProcAddress_v2; do
  echo "int $f(void){return 0;}"; done > stub/stub.c
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o stub/libcuda.so stub/stub.c
cd llama_cpp_python-0.3.36/vendor/llama.cpp
cmake -S . -B build-cuda -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=OFF \
  -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_BUILD_TYPE=Release -DCUDA_cuda_driver_LIBRARY="$LLB/stub/libcuda.so" >/dev/null
nice -n 10 ninja -C build-cuda -j"$(nproc)" llama-bench
ls -la build-cuda/bin/llama-bench
