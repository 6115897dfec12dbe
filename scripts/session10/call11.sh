#!/usr/bin/env bash
# Session 10, call 11 (carry .llb, right after call 10 on the same warm machine: its /tmp/*.gguf):
# llama.cpp's decode on the files call 10 timed lite on.
set -u
mkdir -p /tmp/llb && cp .llb/llama-bench /tmp/llb/
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
for a in "8i 512" "30i 2048"; do
  set -- $a
  /tmp/llb/llama-bench -m /tmp/$1.gguf -p 0 -n 128 -d $2 -fa 1 -ngl 99 -r 3 -o md 2>&1 | grep -E "tg128|error" | sed "s/^/$1 /"
done | tee ${OUT:-/tmp}/llama.log
