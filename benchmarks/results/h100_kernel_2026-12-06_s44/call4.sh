#!/usr/bin/env bash
# Session 44, call 4 (back to back, carrying the last flash-attn-4 part): flash-attn-4 installed from the parts, then
# the full bench (D 64, 128, 256; causal and not at D = 128; every method with FA4 and cuDNN FP8), the backward-memory
# table and the CUPTI profile of every method: the project-level kernel tables.
bash tools/device/kernel_gpu.sh fa4,bench full 2>&1 | tail -60
cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz
