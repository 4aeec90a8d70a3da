#!/usr/bin/env bash
# Session 44, call 3 (back to back with call 2, carrying .fa4b): the GPU suite's other half.
TESTS="tests/models tests/evals" bash benchmarks/results/h100_kernel_2026-12-06_s44/call2.sh
