// M3a of the CUDA backward (kernels/CUDA_BACKWARD.md section 5): dK alone in the factored scale layout
// (matched_factored, kernels/README.md), D = 128, causal or not, any GQA group; the TMA pipeline of dv_factored.cu.
//
// The Triton twin is the factored dK launch (triton_bwd._attn_bwd_dkdv_kernel with FACTORED, DO_DK only, BLOCK_M =
// BLOCK_N = 64), followed operation for operation (its PTX read for the arithmetic), so that on identical operands it
// is meant to give the same bits. Per 64-query tile of a 64-key block:
//   - Sᵀ = K̂ Q̂ᵀ and dP̂ᵀ = V̂ dÔᵀ (each four SS m64n64k32 over D), issued as one wgmma group;
//   - P = ex2.approx.ftz(fma(Sᵀ, (s_q·qk_scale)·s_k, −lse2)), masked; dS = P · fma(dP̂ᵀ, s_v·s_do, −δ); dŜᵀ =
//     e4m3(dS · div.full(1, s)) with s dŜ's row scale of each query (lse2 = 0, δ = 0, s = 1 for queries ≥ N, as
//     Triton's masked loads give);
//   - dK += dŜᵀ Q̂'ᶜ (two RS m64n128k32 over the tile's queries, B = Q'ᶜ channel-major in the 64-byte swizzle),
//     accumulated in place (Triton's ACC_PROMOTE = None; the promoted form is written but not built, see below);
//   - GQA: dK *= s_prev[d] / s_next[d] before each query head; after the loop dK · s_Q'[d] · softmax_scale.
// Pipeline (as the TMA dV): Sᵀ and dP̂ᵀ of the next tile issued with dK of this one; the next tile's dS is formed on
// the CUDA cores while dK runs; one thread issues the TMA loads (Q̂, dÔ, Q'ᶜᵀ, and lse2, δ, s by bulk copies) on the
// stage's `full` barrier, and each warp releases the stage on its `empty` barrier after its dK product.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dk_factored.cuh"
#include "factored.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dm {
namespace dk {

using namespace factored;

constexpr uint32_t kTileBytes = 3 * kBlockM * kHeadDim + 3 * kBlockM * sizeof(float);  // Q̂, dÔ, Q'ᶜᵀ; lse2, δ, s

template <int STAGES>
struct __align__(1024) Smem {
  uint8_t k[kBlockN * kHeadDim];
  uint8_t v[kBlockN * kHeadDim];
  uint8_t q[STAGES][kBlockM * kHeadDim];
  uint8_t dout[STAGES][kBlockM * kHeadDim];
  uint8_t qt[STAGES][kHeadDim * kBlockM];
  float lse[STAGES][kBlockM], delta[STAGES][kBlockM], rs[STAGES][kBlockM];
  uint64_t full[STAGES], empty[STAGES], kv_full;
};
template <int STAGES>
constexpr int smem_bytes() { return int(sizeof(Smem<STAGES>)) + 1024; }  // + room to align the base

struct Maps {
  CUtensorMap q, k, v, dout, qt;  // Q̂, K̂, V̂, dÔ rows (box 64 rows x 128 bytes); Q'ᶜᵀ (box 128 channels x 64 queries)
};

// The epilogue: dK · s_Q'[d] · softmax_scale of the last query head in the output dtype, keys < N.
__device__ __forceinline__ void store_dk(const float (&dk)[kHeadDim / 2], const float* sqc, const DkFactoredParams& p,
                                         int b, int h_kv, int start_n) {
  const float scale = p.softmax_scale;
  store_rows(dk, [&](float x, int, int col) { return __fmul_rn(__fmul_rn(x, sqc[col]), scale); }, p.dk, p.out_fp16,
             p.stride_b, p.stride_n, p.stride_h, b, h_kv, start_n, p.n);
}

template <bool PROMOTE, int STAGES>
__device__ __forceinline__ void dk_block(uint8_t* raw, const DkFactoredParams& p, const Maps& maps) {
  static_assert(STAGES >= 3, "tile j+1 must be resident while tile j+STAGES-1 loads into tile j-1's stage");
  Smem<STAGES>& s = aligned_smem<Smem<STAGES>>(raw);
  const int start_n = blockIdx.x * kBlockN;
  const int bh_kv = blockIdx.y, b = bh_kv / p.h_kv, h_kv = bh_kv % p.h_kv;
  const int group = p.h / p.h_kv;
  const Schedule sched(start_n, p.n, p.causal);
  const int total = sched.tiles * group;
  if (total == 0) return;
  const int64_t bh0 = int64_t(b) * p.h + int64_t(h_kv) * group;
  const bool issuer = threadIdx.x == 0;
  using Cursor = factored::Cursor<STAGES>;
  Cursor ahead{0, 0, 0, 0, bh0};  // the next tile to load
  auto load = [&]() {  // by the issuing thread: tile `ahead` into its stage once that stage's last reader is done
    if (issuer && ahead.j < total) {
      if (ahead.j >= STAGES) mbar_wait(&s.empty[ahead.stage], ahead.phase ^ 1);
      uint64_t* full = &s.full[ahead.stage];
      const int st = ahead.stage, start_m = sched.start(ahead.it);
      const int64_t row = ahead.bh * p.n_pad + start_m;
      mbar_arrive_expect_tx(full, kTileBytes);
      tma_load_2d(s.q[st], &maps.q, 0, int(row), full);
      tma_load_2d(s.dout[st], &maps.dout, 0, int(row), full);
      tma_load_2d(s.qt[st], &maps.qt, start_m, int(ahead.bh * kHeadDim), full);
      bulk_load(s.lse[st], p.lse2 + row, kBlockM * sizeof(float), full);
      bulk_load(s.delta[st], p.delta + row, kBlockM * sizeof(float), full);
      bulk_load(s.rs[st], p.rs + row, kBlockM * sizeof(float), full);
    }
    __syncwarp();
    ahead.advance(sched.tiles);
  };
  const int64_t kv_block = int64_t(bh_kv) * (p.n_pad / kBlockN) + start_n / kBlockN;
  const float s_k = p.sk[kv_block], s_v = p.sv[kv_block];
  struct Scales {
    float row, dp;  // Sᵀ's (s_q·qk_scale)·s_k and dP̂ᵀ's s_v·s_do
  };
  auto scales_of = [&](const Cursor& c) {  // read ahead of their use: global loads
    const int64_t at = c.bh * (p.n_pad / 128) + sched.start(c.it) / 128;
    return Scales{__fmul_rn(__fmul_rn(p.sq[at], p.qk_scale), s_k), __fmul_rn(s_v, p.sdo[at])};
  };
  auto ds = [&](const Cursor& c, Scales sc, float (&st)[kBlockM / 2], float (&dpt)[kBlockM / 2]) {
    ds_tile<false, false>(st, dpt, s.lse[c.stage], s.delta[c.stage], s.rs[c.stage], sc.row, sc.dp,
                          c.it >= sched.unmasked, start_n, sched.start(c.it), p.n, p.causal);
  };

  if (issuer) init_stage_barriers<STAGES>(s.full, s.empty, &s.kv_full);
  __syncthreads();
  if (issuer) {
    const int row = int(int64_t(bh_kv) * p.n_pad + start_n);
    mbar_arrive_expect_tx(&s.kv_full, 2 * kBlockN * kHeadDim);
    tma_load_2d(s.k, &maps.k, 0, row, &s.kv_full);
    tma_load_2d(s.v, &maps.v, 0, row, &s.kv_full);
  }
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) load();
  mbar_wait(&s.kv_full, 0);

  float dk[kHeadDim / 2] = {};  // [64 keys, D], accumulator order; in units of the current head's Q' channel scales
  float part[kHeadDim / 2];     // one tile's product (PROMOTE)
  uint32_t frag[kTileSteps][4];
  Cursor cur{0, 0, 0, 0, bh0};  // the tile whose dŜᵀ is in `frag`
  {
    float st[kBlockM / 2], dpt[kBlockM / 2];
    const Scales sc = scales_of(cur);
    mbar_wait(&s.full[0], 0);
    issue_s_dp(st, dpt, s.k, s.v, s.q[0], s.dout[0]);
    wgmma_wait<0>();
    fence_operands(st);
    fence_operands(dpt);
    ds(cur, sc, st, dpt);
    to_fragments(dpt, frag);
  }
  rescale_channels(dk, nullptr, p.sqc + bh0 * kHeadDim);
  const bool releaser = threadIdx.x % 32 == 0;

#pragma unroll 1
  while (cur.j + 1 < total) {
    load();
    Cursor next = cur;
    next.advance(sched.tiles);
    const Scales sc = scales_of(next);
    mbar_wait(&s.full[next.stage], next.phase);

    float st[kBlockM / 2], dpt[kBlockM / 2];
    issue_s_dp(st, dpt, s.k, s.v, s.q[next.stage], s.dout[next.stage]);
    issue_channel_product<PROMOTE>(dk, part, frag, s.qt[cur.stage]);
    wgmma_wait<1>();  // Sᵀ and dP̂ᵀ of next; dK(cur) runs on
    fence_operands(st);
    fence_operands(dpt);
    ds(next, sc, st, dpt);
    wgmma_wait<0>();  // dK(cur): this warp is done with cur's stage
    if (releaser) mbar_arrive(&s.empty[cur.stage]);
    finish_acc<PROMOTE>(dk, part);
    if (next.it == 0) rescale_channels(dk, p.sqc + cur.bh * kHeadDim, p.sqc + next.bh * kHeadDim);  // a new head
    to_fragments(dpt, frag);
    cur = next;
  }
  issue_channel_product<PROMOTE>(dk, part, frag, s.qt[cur.stage]);
  wgmma_wait<0>();
  finish_acc<PROMOTE>(dk, part);
  store_dk(dk, p.sqc + cur.bh * kHeadDim, p, b, h_kv, start_n);
}

}  // namespace dk
}  // namespace dm

#define DM_DK_KERNEL(NAME, PROMOTE, STAGES)                                                           \
  extern "C" __global__ void __launch_bounds__(dm::factored::kThreads, 1)                              \
      NAME(const DkFactoredParams p, const __grid_constant__ dm::dk::Maps maps) {                      \
    extern __shared__ uint8_t smem[];                                                                \
    dm::dk::dk_block<PROMOTE, STAGES>(smem, p, maps);                                                \
  }
// Unpromoted only for now: promoted, the second FP32 accumulator beside Sᵀ, dP̂ᵀ, dK and the in-flight fragments needs
// 255 registers and spills (4 bytes); it waits for M6's register reallocation (kernels/CUDA_BACKWARD.md).
DM_DK_KERNEL(dm_dk_factored_tma3_unpromoted, false, 3)
#undef DM_DK_KERNEL

extern "C" int dm_dk_factored(const DkFactoredParams* p, int device, cudaStream_t stream) {
  using namespace dm::factored;
  if (p->n <= 0 || p->h_kv <= 0 || p->h % p->h_kv || p->n_pad % 128 || p->n_pad < p->n) return cudaErrorInvalidValue;
  auto kernel = dm_dk_factored_tma3_unpromoted;
  const int smem = dm::dk::smem_bytes<3>();
  if (cudaError_t err = prepare_launch(reinterpret_cast<const void*>(kernel), smem, device); err != cudaSuccess) {
    return err;
  }
  dm::dk::Maps maps;
  const uint64_t n_pad = p->n_pad, q_rows = uint64_t(p->b) * p->h * n_pad, kv_rows = uint64_t(p->b) * p->h_kv * n_pad;
  if (!encode_codes(&maps.q, p->q8, kHeadDim, q_rows, kHeadDim, kBlockM, CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode_codes(&maps.k, p->k8, kHeadDim, kv_rows, kHeadDim, kBlockN, CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode_codes(&maps.v, p->v8, kHeadDim, kv_rows, kHeadDim, kBlockN, CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode_codes(&maps.dout, p->do8, kHeadDim, q_rows, kHeadDim, kBlockM, CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode_codes(&maps.qt, p->q8t, n_pad, uint64_t(p->b) * p->h * kHeadDim, kBlockM, kHeadDim,
                    CU_TENSOR_MAP_SWIZZLE_64B)) {
    return cudaErrorInvalidValue;  // no driver entry point, or a layout the TMA cannot describe
  }
  const dim3 grid((p->n + kBlockN - 1) / kBlockN, p->b * p->h_kv);
  kernel<<<grid, kThreads, smem, stream>>>(*p, maps);
  return cudaGetLastError();
}

// sizeof(DkFactoredParams), for the loader's check that its ctypes mirror has the same layout.
extern "C" int dm_dk_factored_params_size(void) { return static_cast<int>(sizeof(DkFactoredParams)); }
