#!/usr/bin/env bash
# Session 44, call 3 (back to back with call 2, carrying .fa4b): the quick bench at D = 128 (causal, 4K/8K/16K);
# its prewarm compiles every head dim's Triton kernels into .cache/triton for call 4's full bench.
bash tools/device/kernel_gpu.sh bench quick 2>&1 | tail -40
cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz
