// Matched's δ pass with the factored layout's dŜ row scales (matched_factored), D = 128, causal or not, any GQA group:
// δ and s with the bits of Triton's pass (triton_bwd._attn_bwd_delta_matched_kernel, ROW_SCALES, BLOCK_M = 128,
// BLOCK_N = 64, 8 warps), on the structure of dq_factored.cu.
//
// One CTA per 128 queries (Triton's block) and query head: a producer warpgroup (setmaxnreg 24) whose one thread
// loads Q̂ and dÔ of the 128 queries once, then per key tile K̂ and V̂ into a ring of stages; two consumer warpgroups
// (setmaxnreg 240), one per 64-query half, reading every key tile of the block's range (Triton's: unmasked left of
// the block's diagonal, masked from there; the two halves share it, as Triton's two warpgroups do).
// Per tile a consumer forms S = Q̂ K̂ᵀ and dP̂ = dÔ V̂ᵀ (4 + 4 SS m64n64k32), then as Triton's PTX has it:
// P = ex2.approx.ftz(fma(S, (s_q·s_k)·qk_scale, −lse2)) (masked where a key is ≥ N, a query ≥ N or, causal, a key
// right of the query: 0), dP = dP̂ · (s_do·s_v), the row's Σ P·dP as fma(p0, dp0, p1·dp1) then fma(p, dp, ·) in
// register order, across the quad xor 2 then xor 1, added into δ; max P·|dP| and max P per row. The epilogue writes
// δ, s = (fma(|δ|, max P, max P·|dP|) > 0 ? div.rn(·, 448) : 1) and div.full(1, s) for every query of the block.
// PIPELINED: S and dP̂ of the next tile are issued before this tile's arithmetic.
#include <cuda_runtime.h>

#include <cstdint>

#include "delta_factored.cuh"
#include "factored.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dm {
namespace delta {

using namespace factored;

constexpr uint32_t kTileBytes = 2 * kBlockN * kHeadDim;  // K̂, V̂
constexpr int kStages = 4;

template <int STAGES>
struct __align__(1024) Smem {
  uint8_t q[kConsumers][kBlockM * kHeadDim];
  uint8_t dout[kConsumers][kBlockM * kHeadDim];
  uint8_t k[STAGES][kBlockN * kHeadDim];
  uint8_t v[STAGES][kBlockN * kHeadDim];
  StageInfo info[STAGES];
  uint64_t full[STAGES], empty[STAGES], rows_full;
};
template <int STAGES>
constexpr int smem_bytes() { return int(sizeof(Smem<STAGES>)) + 1024; }  // + room to align the base

struct Maps {
  CUtensorMap q, dout, k, v;  // rows of 128 codes, boxes of 64 rows, 128-byte swizzle
};

template <int STAGES>
__device__ __forceinline__ void produce(Smem<STAGES>& s, const Maps& maps, int64_t bh_kv, int n_pad,
                                        Walk<STAGES, KeySchedule> w) {
  const int64_t kv_rows = bh_kv * n_pad;
  produce_walk(s.info, s.full, s.empty, w, kTileBytes, [&](int st, const auto& at, uint64_t* full) {
    tma_load_2d(s.k[st], &maps.k, 0, int(kv_rows + at.start), full);
    tma_load_2d(s.v[st], &maps.v, 0, int(kv_rows + at.start), full);
  });
}

struct Rows {
  int row[2];
  float lse[2], delta[2], pdp_max[2], p_max[2];
};

// One key tile's contribution to this thread's two rows, from its complete S (st) and dP̂ (dpt).
__device__ __forceinline__ void accumulate(const float (&st)[kBlockN / 2], const float (&dpt)[kBlockN / 2], Rows& r,
                                           float row_scale, float dp_scale, bool masked, int start_n, int n,
                                           bool causal) {
  const int q = threadIdx.x % 4;
  float sum[2], pdp[2] = {0.0f, 0.0f}, pm[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the row's two values of this 8-key chunk: v0 = 4i + 2h, v1 = v0 + 1
      float p[2], dp[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int v = 4 * i + 2 * h + c, key = start_n + 8 * i + 2 * q + c;
        p[c] = ex2_approx_ftz(fmaf(st[v], row_scale, -r.lse[h]));
        if (masked) {
          const bool visible = key < n && r.row[h] < n && (!causal || key <= r.row[h]);
          p[c] = visible ? p[c] : 0.0f;
        }
        dp[c] = __fmul_rn(dp_scale, dpt[v]);
        pdp[h] = fmaxf(pdp[h], __fmul_rn(p[c], fabsf(dp[c])));
        pm[h] = fmaxf(pm[h], p[c]);
      }
      sum[h] = i == 0 ? fmaf(p[0], dp[0], __fmul_rn(p[1], dp[1])) : fmaf(p[1], dp[1], fmaf(p[0], dp[0], sum[h]));
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float x = __fadd_rn(sum[h], __shfl_xor_sync(0xffffffffu, sum[h], 2));
    x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
    r.delta[h] = __fadd_rn(r.delta[h], x);
    float m = fmaxf(pdp[h], __shfl_xor_sync(0xffffffffu, pdp[h], 2));
    r.pdp_max[h] = fmaxf(r.pdp_max[h], fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1)));
    m = fmaxf(pm[h], __shfl_xor_sync(0xffffffffu, pm[h], 2));
    r.p_max[h] = fmaxf(r.p_max[h], fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1)));
  }
}

template <bool PIPELINED, int STAGES>
__device__ __forceinline__ void consume(Smem<STAGES>& s, const DeltaFactoredParams& p, int half, int64_t bh,
                                        int64_t bh_kv, int start_m) {
  const bool releaser = threadIdx.x % 32 == 0;
  const auto [warp, g, q] = lane();
  Rows r;
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // Triton's masked load: lse2 0 for queries ≥ N
    r.row[i] = start_m + 16 * warp + g + 8 * i;
    r.lse[i] = r.row[i] < p.n ? p.lse2[bh * p.n_pad + r.row[i]] : 0.0f;
    r.delta[i] = 0.0f, r.pdp_max[i] = 0.0f, r.p_max[i] = 0.0f;
  }
  const int64_t scale_at = bh * (p.n_pad / 128) + start_m / 128;
  const float s_q = p.sq[scale_at], s_do = p.sdo[scale_at];
  const float* sk = p.sk + bh_kv * (p.n_pad / kBlockN);
  const float* sv = p.sv + bh_kv * (p.n_pad / kBlockN);
  const uint8_t* q8 = s.q[half];
  const uint8_t* do8 = s.dout[half];
  Ring<STAGES> ring;
  mbar_wait(&s.rows_full, 0);
  auto add = [&](const float (&st)[kBlockN / 2], const float (&dpt)[kBlockN / 2], const Tile& t) {
    const float row_scale = __fmul_rn(__fmul_rn(s_q, sk[t.start / kBlockN]), p.qk_scale);
    const float dp_scale = __fmul_rn(s_do, sv[t.start / kBlockN]);
    if (t.masked) {  // two bodies: the unmasked one keeps no mask in registers
      accumulate(st, dpt, r, row_scale, dp_scale, true, t.start, p.n, p.causal);
    } else {
      accumulate(st, dpt, r, row_scale, dp_scale, false, t.start, p.n, p.causal);
    }
  };
  Tile t;
  if constexpr (PIPELINED) {  // issues unconditional in the loop: the first tile before it, the last after it
    // two register sets that take turns (a copy of the next tile's 64 values into the current's cost 64 moves a tile)
    float st_a[kBlockN / 2], dpt_a[kBlockN / 2], st_b[kBlockN / 2], dpt_b[kBlockN / 2];
    Tile u;
    auto settle = [&](float (&st)[kBlockN / 2], float (&dpt)[kBlockN / 2]) {
      wgmma_wait<0>();
      fence_operands(st);
      fence_operands(dpt);
    };
    auto finish = [&](const float (&st)[kBlockN / 2], const float (&dpt)[kBlockN / 2], const Tile& ct) {
      add(st, dpt, ct);
      if (releaser) mbar_arrive(&s.empty[ct.stage]);
    };
    if (ring.take(s.info, s.full, s.empty, half, releaser, t)) {
      issue_s_dp(st_a, dpt_a, q8, do8, s.k[t.stage], s.v[t.stage]);
      settle(st_a, dpt_a);
#pragma unroll 1
      while (true) {  // a: tile t, complete; b: tile u
        if (!ring.take(s.info, s.full, s.empty, half, releaser, u)) {
          finish(st_a, dpt_a, t);
          break;
        }
        issue_s_dp(st_b, dpt_b, q8, do8, s.k[u.stage], s.v[u.stage]);
        finish(st_a, dpt_a, t);  // beside the next tile's products
        settle(st_b, dpt_b);
        if (!ring.take(s.info, s.full, s.empty, half, releaser, t)) {
          finish(st_b, dpt_b, u);
          break;
        }
        issue_s_dp(st_a, dpt_a, q8, do8, s.k[t.stage], s.v[t.stage]);
        finish(st_b, dpt_b, u);
        settle(st_a, dpt_a);
      }
    }
  } else {
    while (ring.take(s.info, s.full, s.empty, half, releaser, t)) {
      float st[kBlockN / 2], dpt[kBlockN / 2];
      issue_s_dp(st, dpt, q8, do8, s.k[t.stage], s.v[t.stage]);
      wgmma_wait<0>();
      if (releaser) mbar_arrive(&s.empty[t.stage]);
      fence_operands(st);
      fence_operands(dpt);
      add(st, dpt, t);
    }
  }
  if (q == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t at = bh * p.n_pad + r.row[i];
      const float bound = fmaf(fabsf(r.delta[i]), r.p_max[i], r.pdp_max[i]);
      p.delta[at] = r.delta[i];
      const float s = bound > 0.0f ? __fdiv_rn(bound, 448.0f) : 1.0f;
      p.rs[at] = s;
      p.irs[at] = div_full(1.0f, s);  // Triton's `1.0 / s`
    }
  }
}

template <bool PIPELINED, int STAGES, int CONSUMER_REGS>
__device__ __forceinline__ void delta_block(uint8_t* raw, const DeltaFactoredParams& p, const Maps& maps) {
  Smem<STAGES>& s = aligned_smem<Smem<STAGES>>(raw);
  if (threadIdx.x == 0) {
    load_query_rows<STAGES>(s, &maps.q, &maps.dout, int(int64_t(blockIdx.y) * p.n_pad + blockIdx.x * kCtaRows));
  }
  __syncthreads();  // the barriers are initialised; no block-wide barrier after this point
  // what each role needs is computed after the register split: a value live across it would be spilled
  const int role = threadIdx.x / kThreads;  // 0: producer; 1, 2: the consumer of queries start + 64 (role − 1) ..
  const int start_cta = blockIdx.x * kCtaRows;
  const int64_t bh = blockIdx.y, bh_kv = (bh / p.h) * p.h_kv + (bh % p.h) / (p.h / p.h_kv);
  if (role == 0) {
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      const KeySchedule keys(start_cta, p.n, p.causal, kCtaRows);  // Triton's block: both halves read all of it
      produce<STAGES>(s, maps, bh_kv, p.n_pad, Walk<STAGES, KeySchedule>(keys, keys, bh, 1));
    }
    return;
  }
  claim_registers<CONSUMER_REGS>();
  consume<PIPELINED, STAGES>(s, p, role - 1, bh, bh_kv, start_cta + kBlockM * (role - 1));
}

}  // namespace delta
}  // namespace dm

// CTAS: CTAs per SM the launch bounds ask for. One: the consumers take 240 registers each. Two (ws4x2, each tile in
// turn, which needs ≈ 100): the launch gets 80 per thread (65536 / (2·384), rounded down to 8), the producer gives 56
// of them back, the consumers take 104 (24·128 + 104·256 ≤ 80·384), and an SM runs sixteen consumer warps, as many as
// Triton's two CTAs of 8 warps (ncu, session 11: eight consumer warps left the CUDA pass latency-bound).
#define DM_DELTA_KERNEL(NAME, PIPELINED, CTAS, CONSUMER_REGS)                                         \
  extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, CTAS)                        \
      NAME(const DeltaFactoredParams p, const __grid_constant__ dm::delta::Maps maps) {                \
    extern __shared__ uint8_t smem[];                                                                \
    dm::delta::delta_block<PIPELINED, dm::delta::kStages, CONSUMER_REGS>(smem, p, maps);             \
  }
DM_DELTA_KERNEL(dm_delta_factored_ws4, false, 1, dm::factored::kConsumerRegs)
DM_DELTA_KERNEL(dm_delta_factored_ws4p, true, 1, dm::factored::kConsumerRegs)
DM_DELTA_KERNEL(dm_delta_factored_ws4x2, false, 2, 104)
#undef DM_DELTA_KERNEL

// variant: 0 each tile in turn (ws4), 1 the next tile's S and dP̂ issued before this tile's arithmetic (ws4p), 2 ws4
// with two CTAs per SM (ws4x2) (cuda_lib.DELTA_VARIANTS)
extern "C" int dm_delta_factored(const DeltaFactoredParams* p, int variant, int device, cudaStream_t stream) {
  using namespace dm::factored;
  if (!valid_shape(*p) || variant < 0 || variant > 2) {
    return cudaErrorInvalidValue;
  }
  auto kernel = variant == 2 ? dm_delta_factored_ws4x2 : variant ? dm_delta_factored_ws4p : dm_delta_factored_ws4;
  return launch_delta(kernel, dm::delta::smem_bytes<dm::delta::kStages>(), kBlockN, *p, device, stream);
}

// sizeof(DeltaFactoredParams), for the loader's check that its ctypes mirror has the same layout.
extern "C" int dm_delta_factored_params_size(void) { return static_cast<int>(sizeof(DeltaFactoredParams)); }
