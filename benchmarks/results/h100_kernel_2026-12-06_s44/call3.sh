#!/usr/bin/env bash
# Session 44, call 3: the full bench (D 64, 128, 256; causal and not at D = 128; every method with cuDNN FP8; FA4 not
# staged this session), the backward-memory table and the CUPTI profile of every method: the project-level tables.
bash tools/device/kernel_gpu.sh bench full 2>&1 | tail -60
cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz
