// M2 of the CUDA backward (kernels/CUDA_BACKWARD.md section 5): dV alone in the factored scale layout
// (matched_factored, kernels/README.md), D = 128, causal or not, any GQA group.
//
// The Triton twin is the factored dV launch (triton_bwd._attn_bwd_dkdv_kernel with FACTORED, DO_DV only, BLOCK_M =
// BLOCK_N = 64). This kernel follows it operation for operation, so that on identical operands it is meant to give
// the same bits:
//   - one CTA (one warpgroup) per 64-key block and kv head; it loops over the group's query heads and, per head, over
//     the 64-query tiles in Triton's order (the unmasked tiles first, then the causal diagonal, then the ragged end);
//   - Sᵀ = K̂ Q̂ᵀ (64 keys x 64 queries, four SS m64n64k32), P = ex2.approx.ftz(fma(Sᵀ, (s_q * qk_scale) * s_k, -lse2)),
//     masked to 0 on the masked tiles, P̂ᵀ = e4m3(clamp(P * 448, ±448)) cast in registers and permuted into A
//     fragments (acc_to_a_fragment);
//   - dV += P̂ᵀ dÔᶜ (two RS m64n128k32 over the tile's 64 queries, B = the token-major dÔᶜᵀ codes). PROMOTE (Triton's
//     default, ACC_PROMOTE = 64): each tile's product starts from zero and is added into the FP32 dV, as Triton's
//     max_num_imprecise_acc = 64 does; otherwise the wgmma accumulates into dV itself over the whole loop;
//   - GQA: before each query head dV *= s_prev[d] / s_next[d] (div.full, Triton's `/`); after the loop
//     dV * (s_dOᶜ[d] * (1/448)) in the output dtype, keys < N only.
// Every FP32 multiply and add outside the one explicit FMA is written __fmul_rn / __fadd_rn (PTX mul.rn / add.rn),
// which ptxas never contracts into an FMA: Triton's PTX has none of them next to a contractible partner, so each is
// one IEEE rounding there too.
// Loads: cp.async into two shared-memory stages (the next tile's Q̂, dÔᶜᵀ and lse2 land while this one computes).
// No warp specialisation yet (M6): overlap comes from the 2-3 CTAs an SM holds.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dv_factored.cuh"
#include "quant.cuh"
#include "wgmma.cuh"

namespace dm {
namespace dv {

constexpr int kThreads = 128;  // one warpgroup
constexpr int kBlockN = 64;    // keys per CTA: one K̂/V̂ scale block, wgmma's M
constexpr int kBlockM = 64;    // queries per tile: the promotion depth and the K of the dV product
constexpr int kHeadDim = 128;
using QTile = KMajor128<Swizzle::k128B>;  // K̂ [64 keys, D], Q̂ [64 queries, D]
using DoTile = KMajor64;                  // dÔᶜᵀ [D, 64 queries]

struct __align__(1024) Smem {
  uint8_t k[kBlockN * kHeadDim];
  uint8_t q[2][kBlockM * kHeadDim];
  uint8_t dot[2][kHeadDim * kBlockM];
  float lse[2][kBlockM];
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float div_full(float a, float b) {
  float y;
  asm("div.full.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

// Triton's query-tile order for one key block (triton_bwd._attn_bwd_dkdv_kernel with SPLIT, BLOCK_M = BLOCK_N = 64):
// the unmasked range [diag_end, full_end), then the masked one from lo, jumping from diag_end to tail.
struct Schedule {
  int lo, diag_end, full_end, tail, unmasked, tiles;

  __device__ Schedule(int start_n, int n, bool causal) {
    full_end = (n / kBlockM) * kBlockM;
    lo = 0;
    diag_end = 0;
    if (causal) {
      lo = start_n;
      diag_end = max(lo, min(start_n + kBlockN, full_end));
    }
    tail = max(full_end, lo);
    if (start_n + kBlockN > n) {  // the ragged last key block: every tile masked
      diag_end = lo;
      tail = lo;
      full_end = lo;
    }
    unmasked = full_end > diag_end ? (full_end - diag_end + kBlockM - 1) / kBlockM : 0;
    const int hi = n - (tail - diag_end);
    tiles = unmasked + (hi > lo ? (hi - lo + kBlockM - 1) / kBlockM : 0);
  }
  __device__ int start_m(int it) const {
    if (it < unmasked) return diag_end + kBlockM * it;
    const int tile_m = lo + kBlockM * (it - unmasked);
    return tile_m < diag_end ? tile_m : tile_m + (tail - diag_end);
  }
};

// One query tile's operands into stage `stage`: Q̂ rows (128-byte swizzle), dÔᶜᵀ rows of 64 queries, lse2.
__device__ __forceinline__ void load_tile(Smem& s, int stage, const DvFactoredParams& p, int64_t bh, int start_m) {
  const uint8_t* q = p.q8 + (bh * p.n_pad + start_m) * kHeadDim;
  const uint8_t* dot = p.do8t + bh * kHeadDim * p.n_pad + start_m;
  static_assert(kBlockM * kHeadDim / 16 % kThreads == 0, "whole 16-byte chunks per thread");
#pragma unroll
  for (int c = 0; c < kBlockM * kHeadDim / 16 / kThreads; ++c) {  // 4 chunks of Q̂ and 4 of dÔᶜᵀ per thread
    const int i = threadIdx.x + c * kThreads;
    cp_async16(s.q[stage] + QTile::chunk_offset(i / (kHeadDim / 16), i % (kHeadDim / 16)), q + 16 * i);
    const int row = i / (kBlockM / 16), chunk = i % (kBlockM / 16);
    cp_async16(s.dot[stage] + DoTile::chunk_offset(row, chunk), dot + int64_t(row) * p.n_pad + 16 * chunk);
  }
  if (threadIdx.x < kBlockM / 4) {
    cp_async16(s.lse[stage] + 4 * threadIdx.x, p.lse2 + bh * p.n_pad + start_m + 4 * threadIdx.x);
  }
}

template <bool PROMOTE>
__device__ __forceinline__ void dv_block(Smem& s, const DvFactoredParams& p) {
  const int start_n = blockIdx.x * kBlockN;
  const int bh_kv = blockIdx.y, b = bh_kv / p.h_kv, h_kv = bh_kv % p.h_kv;
  const int group = p.h / p.h_kv;
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
  const Schedule sched(start_n, p.n, p.causal);
  const int total = sched.tiles * group;
  auto head = [&](int j) { return int64_t(b) * p.h + int64_t(h_kv) * group + j / sched.tiles; };

  // K̂ once, with the first tile (one cp.async group)
  const uint8_t* k = p.k8 + (int64_t(bh_kv) * p.n_pad + start_n) * kHeadDim;
#pragma unroll
  for (int c = 0; c < kBlockN * kHeadDim / 16 / kThreads; ++c) {
    const int i = threadIdx.x + c * kThreads;
    cp_async16(s.k + QTile::chunk_offset(i / (kHeadDim / 16), i % (kHeadDim / 16)), k + 16 * i);
  }
  if (total > 0) load_tile(s, 0, p, head(0), sched.start_m(0));
  cp_async_commit();
  const float s_k = p.sk[int64_t(bh_kv) * (p.n_pad / kBlockN) + start_n / kBlockN];

  float dv[kHeadDim / 2] = {};  // [64 keys, D], accumulator order; in units of the current head's dÔᶜ scales
  float scale_col[kHeadDim / 4];  // the current head's dÔᶜ scale per accumulator column: [i][v % 2] as 2i + v % 2
#pragma unroll
  for (int c = 0; c < kHeadDim / 4; ++c) scale_col[c] = 1.0f;

#pragma unroll 1
  for (int j = 0; j < total; ++j) {
    const int it = j % sched.tiles, stage = j & 1;
    const int64_t bh = head(j);
    const int start_m = sched.start_m(it);
    if (j + 1 < total) load_tile(s, stage ^ 1, p, head(j + 1), sched.start_m((j + 1) % sched.tiles));
    cp_async_commit();
    const float s_q = p.sq[bh * (p.n_pad / 128) + start_m / 128];
    if (it == 0) {  // a new query head: dV into its dÔᶜ units (Triton: dv * (s_doc / s_next), also for the first)
#pragma unroll
      for (int i = 0; i < kHeadDim / 8; ++i) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float next = p.sdoc[bh * kHeadDim + 8 * i + 2 * q + c];
          const float ratio = div_full(scale_col[2 * i + c], next);
          dv[4 * i + c] = __fmul_rn(dv[4 * i + c], ratio);
          dv[4 * i + 2 + c] = __fmul_rn(dv[4 * i + 2 + c], ratio);
          scale_col[2 * i + c] = next;
        }
      }
    }
    cp_async_wait<1>();
    fence_async_shared();
    __syncthreads();

    // Sᵀ = K̂ Q̂ᵀ: [64 keys, 64 queries]
    float st[kBlockM / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < QTile::kSteps; ++kk) {
      WgmmaE4M3<kBlockM>::ss(st, QTile::desc(s.k, kk), QTile::desc(s.q[stage], kk), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(st);

    // P = exp2(Sᵀ · scale − lse2), masked on the masked tiles; P̂ᵀ = e4m3(P · 448) as A fragments
    const float row_scale = __fmul_rn(__fmul_rn(s_q, p.qk_scale), s_k);
    const bool masked = it >= sched.unmasked;
#pragma unroll
    for (int i = 0; i < kBlockM / 8; ++i) {
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int key = start_n + 16 * warp + g + 8 * (v / 2), col = 8 * i + 2 * q + (v % 2);
        float pv = ex2_approx_ftz(fmaf(st[4 * i + v], row_scale, -s.lse[stage][col]));
        if (masked) {
          const int query = start_m + col;
          const bool visible = key < p.n && query < p.n && (!p.causal || query >= key);
          pv = visible ? pv : 0.0f;
        }
        st[4 * i + v] = fminf(fmaxf(__fmul_rn(pv, 448.0f), -448.0f), 448.0f);
      }
    }
    uint32_t frag[DoTile::kSteps][4];
#pragma unroll
    for (int kk = 0; kk < DoTile::kSteps; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int h16 = 2 * kk + r / 2, v0 = 8 * h16 + 2 * (r % 2);  // 16-query half h16, key row g or g + 8
        frag[kk][r] = acc_to_a_fragment(cvt_e4m3x4(st[v0], st[v0 + 1], st[v0 + 4], st[v0 + 5]));
      }
    }

    // dV += P̂ᵀ dÔᶜ: [64 keys, D] over the tile's 64 queries
#pragma unroll
    for (int kk = 0; kk < DoTile::kSteps; ++kk) fence_operands(frag[kk]);
    if constexpr (PROMOTE) {
      float part[kHeadDim / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DoTile::kSteps; ++kk) {
        WgmmaE4M3<kHeadDim>::rs(part, frag[kk], DoTile::desc(s.dot[stage], kk), kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(part);
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) dv[i] = __fadd_rn(dv[i], part[i]);
    } else {
      fence_operands(dv);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DoTile::kSteps; ++kk) {
        WgmmaE4M3<kHeadDim>::rs(dv, frag[kk], DoTile::desc(s.dot[stage], kk), 1);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(dv);
    }
    __syncthreads();  // every warp is done with this stage before the next iteration loads into it
  }
  cp_async_wait<0>();

  // dV · (s_dOᶜ[d] / 448) in the output dtype, keys < N
  constexpr float kInv448 = 1.0f / 448.0f;
#pragma unroll
  for (int i = 0; i < kHeadDim / 8; ++i) {
    const int col = 8 * i + 2 * q;
    const float c0 = __fmul_rn(scale_col[2 * i], kInv448), c1 = __fmul_rn(scale_col[2 * i + 1], kInv448);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = start_n + 16 * warp + g + 8 * half;
      if (key >= p.n) continue;
      const float x0 = __fmul_rn(dv[4 * i + 2 * half], c0), x1 = __fmul_rn(dv[4 * i + 2 * half + 1], c1);
      const int64_t at = int64_t(b) * p.stride_b + int64_t(key) * p.stride_n + int64_t(h_kv) * p.stride_h + col;
      if (p.out_fp16) {
        *reinterpret_cast<__half2*>(static_cast<__half*>(p.dv) + at) = __floats2half2_rn(x0, x1);
      } else {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.dv) + at) = __floats2bfloat162_rn(x0, x1);
      }
    }
  }
}

}  // namespace dv
}  // namespace dm

#define DM_DV_KERNEL(NAME, PROMOTE)                                                               \
  extern "C" __global__ void __launch_bounds__(dm::dv::kThreads, 1) NAME(const DvFactoredParams p) { \
    __shared__ dm::dv::Smem smem;                                                                 \
    dm::dv::dv_block<PROMOTE>(smem, p);                                                           \
  }
DM_DV_KERNEL(dm_dv_factored_promoted, true)
DM_DV_KERNEL(dm_dv_factored_unpromoted, false)
#undef DM_DV_KERNEL

extern "C" int dm_dv_factored(const DvFactoredParams* p, int promote, int device, cudaStream_t stream) {
  if (p->n <= 0 || p->h_kv <= 0 || p->h % p->h_kv || p->n_pad % 128 || p->n_pad < p->n) return cudaErrorInvalidValue;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return err;
  const dim3 grid((p->n + dm::dv::kBlockN - 1) / dm::dv::kBlockN, p->b * p->h_kv);
  if (promote) {
    dm_dv_factored_promoted<<<grid, dm::dv::kThreads, 0, stream>>>(*p);
  } else {
    dm_dv_factored_unpromoted<<<grid, dm::dv::kThreads, 0, stream>>>(*p);
  }
  return cudaGetLastError();
}

// sizeof(DvFactoredParams), for the loader's check that its ctypes mirror has the same layout.
extern "C" int dm_dv_factored_params_size(void) { return static_cast<int>(sizeof(DvFactoredParams)); }
