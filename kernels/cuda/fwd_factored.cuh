// The parameters of the factored forward kernel (fwd_factored.cu), a plain C struct that ctypes mirrors field for field
// (deltamatch.kernels.cuda_lib.FwdFactoredParams): keep the two in the same order.
#pragma once
#include <cstdint>

extern "C" {

struct FwdFactoredParams {
  const uint8_t* q8;    // Q̂ codes (B, H, N_pad, D), one scale per 128 queries
  const uint8_t* k8;    // K̂ codes (B, H_kv, N_pad, D), centred, one scale per 64 keys
  const uint8_t* v8t;   // V̂ᶜ codes channel-major (B, H_kv, D, N_pad), one scale per channel (PV's B)
  const float* sq;      // (B, H, N_pad / 128)
  const float* sk;      // (B, H_kv, N_pad / 64)
  const float* svc;     // (B, H_kv, D): V̂ᶜ's channel scales
  float* lse2;          // (B, H, N_pad): the row log-sum-exp in the log2 domain, written
  void* o;              // (B, N, H, D) bf16 or fp16, element strides below, D contiguous
  int64_t stride_b, stride_n, stride_h;
  int b, h, h_kv, n, n_pad;
  float qk_scale;       // softmax_scale · log2(e), rounded to FP32 as Triton's launch does
  int causal, out_fp16;
};

}  // extern "C"
