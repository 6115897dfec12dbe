#!/usr/bin/env bash
# Session 5, call 3: the decode step's kernels inside the graph (nsys) for the 8B and 30B-A3B
# Q4_K files, then LITE_PDL modes 2 and 3 (trigger after the wait; without the L2 prefetch).
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"
O=$OUT
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: $NSYS"
$L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1
$L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1
for m in 8b:512 30b:2048; do f=${m%%:*}; n=${m##*:}
  if [ -n "$NSYS" ]; then
    timeout 150 $NSYS profile -q --capture-range=cudaProfilerApi --cuda-graph-trace=node -o $O/t$f \
        python3 scripts/trace_decode.py /tmp/$f.gguf $n 20 > $O/nsys_$f.log 2>&1
    $NSYS stats -q --report cuda_gpu_trace --format csv -o $O/t$f $O/t$f.nsys-rep >> $O/nsys_$f.log 2>&1
    rm -f $O/t$f.nsys-rep $O/t$f.sqlite
    python3 scripts/trace_decode.py --summary $O/t${f}_cuda_gpu_trace.csv 20 2>&1 | head -30
  fi
done
for p in 0 2 3 0 2 3; do
  echo "LITE_PDL=$p 8b"; LITE_PDL=$p $L bench /tmp/8b.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | tail -1
done
for p in 0 2 3 0 2 3; do
  echo "LITE_PDL=$p 30b"; LITE_PDL=$p $L bench /tmp/30b.gguf -p 2048 -n 128 -r 3 --device cuda 2>&1 | tail -1
done
