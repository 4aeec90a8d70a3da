// The parameters of the factored dQ kernel (dq_factored.cu), a plain C struct that ctypes mirrors field for field
// (deltamatch.kernels.cuda_lib.DqFactoredParams): keep the two in the same order.
#pragma once
#include <cstdint>

extern "C" {

struct DqFactoredParams {
  const uint8_t* q8;    // Q̂ codes (B, H, N_pad, D), one scale per 128 queries
  const uint8_t* k8;    // K̂ codes (B, H_kv, N_pad, D), centred, one scale per 64 keys
  const uint8_t* v8;    // V̂ codes (B, H_kv, N_pad, D), one scale per 64 keys
  const uint8_t* do8;   // dÔ codes token-major (B, H, N_pad, D), one scale per 128 queries
  const uint8_t* k8t;   // K̂ᶜ codes channel-major (B, H_kv, D, N_pad), one scale per channel (dQ's B)
  const float* sq;      // (B, H, N_pad / 128)
  const float* sk;      // (B, H_kv, N_pad / 64)
  const float* sv;      // (B, H_kv, N_pad / 64)
  const float* sdo;     // (B, H, N_pad / 128)
  const float* skc;     // (B, H_kv, D): K̂ᶜ's channel scales
  const float* rs;      // (B, H, N_pad): dŜ's row scales s (matched's δ pass)
  const float* lse2;    // (B, H, N_pad)
  const float* delta;   // (B, H, N_pad): matched's δ
  void* dq;             // (B, N, H, D) bf16 or fp16, element strides below, D contiguous
  int64_t stride_b, stride_n, stride_h;
  int b, h, h_kv, n, n_pad;
  float qk_scale;       // softmax_scale · log2(e), rounded to FP32 as Triton's launch does
  float softmax_scale;
  int causal, out_fp16;
};

}  // extern "C"
