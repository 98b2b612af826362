#!/usr/bin/env bash
# Cycle-regression snapshot: writes the `--json` reports of a fixed set of CLI runs (functional
# and cost-only) into DIR using the day0 binary BIN, without the error fields (they depend on the
# random data only through the reference check). Compare two simulators with `diff -r`:
#   benches/cycles_check.sh /tmp/day0-before /tmp/before
#   benches/cycles_check.sh target/release/day0 /tmp/after && diff -r /tmp/before /tmp/after
# A simulator change that should not move any cycle must leave every file byte-identical.
set -u
B=${1:?usage: cycles_check.sh BIN DIR}; D=${2:?usage: cycles_check.sh BIN DIR}; mkdir -p "$D"
i=0
run() { i=$((i+1)); "$B" "$@" --json > "$D/$i.json" 2>/dev/null || echo "FAIL $i: $*"; sed -i -E '/"(max_rel_error|max_abs_error|rel_error|error)"/d' "$D/$i.json"; }
run kernel gemm --m 1024 --n 1024 --k 1024 --device npu-910b
run kernel gemm --m 300 --n 200 --k 170 --device h200
run kernel gemm --m 7168 --n 2048 --k 7168 --cost-only
run kernel gemm --m 129 --n 77 --k 300 --dtype f32 --tile 64x64x64
run kernel expert-ffn --experts 8 --tokens 64 --hidden 1024 --inter 512 --cost-only
run kernel attention --kind prefill --seq 1000 --heads 4
run kernel attention --seq 1 --kind decode --ctx 5000 --heads 8
run kernel attention --seq 1 --kind mla-decode --ctx 3000 --heads 16
run kernel attention --seq 1 --kind dsa-decode --ctx 20000 --heads 16 --cost-only
run kernel attention --kind dsa-prefill --seq 300 --heads 16 --topk 64
run kernel attention --seq 1 --kind decode --ctx 700 --heads 8 --kv-dtype fp8
run kernel linear-attention --kind gdn --mode chunk --seq 1000 --heads 4 --dk 64 --dv 64
run kernel linear-attention --kind kda --mode chunk --seq 333 --heads 3 --dk 64 --dv 64 --chunk 32
run kernel linear-attention --kind gdn --mode recurrent --seq 50 --heads 4 --dk 128 --dv 128
run kernel linear-attention --kind gdn --mode chunk --seq 65536 --heads 32 --dk 128 --dv 128 --chunk 64 --cost-only
run kernel linear-attention --kind gdn --mode chunk --seq 4097 --heads 5 --dk 128 --dv 128 --chunk 16 --cost-only
