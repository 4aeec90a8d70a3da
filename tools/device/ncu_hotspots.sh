#!/usr/bin/env bash
# One device call: an Nsight Compute profile of chosen kernels of tools/device/cuda_dv_bench.py --once (the CUDA forward,
# δ pass and dQ beside Triton's), with the sections that say where issue slots go (speed of light, compute and memory
# workload, scheduler, warp states, occupancy) and, per kernel, its hottest SASS instructions by warp-stall samples.
# Files under $OUT: ncu.txt (the sections), hotspots.txt (per kernel: the 40 instructions with the most samples and
# their top stall reasons), ncu_source.csv.gz (every instruction's counters).
# Usage (repo root, on the H200; carry build/cuda): [NCU_KERNELS=<regex>] [NCU_DRIVER=<script and args>]
# [NCU_COUNT=<launches>] bash tools/device/ncu_hotspots.sh  (NCU_DRIVER, e.g. "tools/device/attn_profile.py --once
# --iters 1": matched_factored's step at the reference shape, the kernels its switches pick)
set -uo pipefail
source tools/device/setup.sh
python3 -m deltamatch.kernels.cuda_build >/dev/null 2>&1 || echo "cuda_build failed"
regex=${NCU_KERNELS:-dm_fwd_factored_ws4_promoted|dm_delta_factored_ws4p|dm_dq_factored_ws3_promoted|_attn_fwd_kernel|_attn_bwd_delta_matched_kernel}
timeout 400 ncu --clock-control none --import-source no -o /tmp/prof -f \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
  --section WarpStateStats --section Occupancy --section LaunchStats --section SourceCounters \
  -k "regex:$regex" ${NCU_COUNT:+-c $NCU_COUNT} python3 ${NCU_DRIVER:-tools/device/cuda_dv_bench.py --once} \
  > "$OUT/ncu_run.log" 2>&1
echo "ncu rc $?"; tail -3 "$OUT/ncu_run.log"
ncu --import /tmp/prof.ncu-rep --print-details all > "$OUT/ncu.txt" 2>&1
ncu --import /tmp/prof.ncu-rep --page source --csv --print-source sass > /tmp/source.csv 2>&1
gzip -c /tmp/source.csv > "$OUT/ncu_source.csv.gz"
python3 - /tmp/source.csv > "$OUT/hotspots.txt" <<'PY'
import csv, io, sys
text = open(sys.argv[1], errors="replace").read()
# one CSV table per kernel; a header line starts each
blocks, cur = [], []
for line in text.splitlines():
    if line.startswith('"Address"') or line.startswith('"#"'):
        if cur: blocks.append(cur)
        cur = [line]
    elif cur:
        cur.append(line)
    else:
        print(line)  # kernel titles before the first table
if cur: blocks.append(cur)
for block in blocks:
    rows = list(csv.DictReader(io.StringIO("\n".join(block))))
    if not rows: continue
    keys = list(rows[0])
    samp = next((k for k in keys if "Warp Stall Sampling (All" in k), None)
    src = next((k for k in keys if k.lower() == "source"), keys[1])
    stall_cols = [k for k in keys if k.startswith("stall_") or "Stall" in k and k != samp]
    def num(x):
        try: return float(str(x).replace(",", ""))
        except ValueError: return 0.0
    total = sum(num(r.get(samp, 0)) for r in rows) if samp else 0
    print(f"== table of {len(rows)} instructions; samples {total:.0f}; columns: {keys[:40]}")
    if not samp: continue
    for r in sorted(rows, key=lambda r: -num(r[samp]))[:40]:
        print(f"{num(r[samp]) / max(total, 1):6.1%}  {r[src][:90]}")
PY
head -c 3000 "$OUT/hotspots.txt"
grep -E "^\s+[a-z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Shared Memory Throughput|Tensor|No Eligible|One or More Eligible" "$OUT/ncu.txt" | head -120
