// dK and dV of the factored scale layout (matched_factored, kernels/README.md) in one warp-specialised kernel, D = 128,
// causal or not, any GQA group: M3 of kernels/CUDA_BACKWARD.md on M6's structure.
//
// One CTA per 128 keys and kv head, three warpgroups:
//   - a producer warpgroup that gives its registers back (setmaxnreg 24); one thread issues the TMA loads: K̂ and V̂
//     of the 128 keys once, then per query tile Q̂, dÔ (token-major, 128-byte swizzle), Q'ᶜᵀ and dÔᶜᵀ
//     (channel-major, 64-byte swizzle) and lse2, δ, s (bulk copies) into a ring of STAGES stages;
//   - two consumer warpgroups (setmaxnreg 240), one per 64-key half: each is Triton's factored dK and dV launches for
//     its 64-key block fused (their BLOCK_N), reading the stages both share.
// Per query tile a consumer forms Sᵀ = K̂ Q̂ᵀ and dP̂ᵀ = V̂ dÔᵀ (4 + 4 SS m64n64k32, one wgmma group), then on the CUDA
// cores P, P̂ᵀ = e4m3(P · 448) and dŜᵀ = e4m3(P · fma(dP̂ᵀ, s_v·s_do, −δ) · div.full(1, s)) (factored.cuh ds_tile, the
// arithmetic of Triton's PTX), and adds dV += P̂ᵀ dÔᶜ and dK += dŜᵀ Q̂'ᶜ (2 + 2 RS m64n128k32).
//   - Unpromoted (Triton's ACC_PROMOTE = None): the wgmma accumulates into dV and dK over the whole loop, and Sᵀ, dP̂ᵀ
//     of the next tile are issued with dV, dK of this one (the softmax and dS of the next tile run beside them).
//   - Promoted (ACC_PROMOTE = 64, matched_factored's default): each tile's dV and then dK product start from zero in
//     one FP32 temporary and are added in FP32; with both accumulators and the temporary live there is no room for the
//     next tile's Sᵀ and dP̂ᵀ, so a consumer runs its tile in turn and the overlap comes from the other consumer.
//   - GQA: dV, dK *= s_prev[d] / s_next[d] before each query head; the epilogue dV · (s_dOᶜ[d] / 448) and
//     dK · s_Q'[d] · softmax_scale of the last head, keys < N.
// Each half visits its query tiles in its own Triton order (unmasked tiles, the causal diagonal, the ragged end), so
// each half's dK and dV are Triton's bit for bit. The two orders differ near the diagonal, so the CTA loads the merge of
// the two (Walk, walked by the producer alone): a tile both halves read is loaded once; causal, the first half's first
// tile is loaded again at the end for the second half (one extra tile per key block and head). The producer writes
// each stage's query tile, head and which half reads it into the stage (Smem::Info). A consumer that does not read a
// stage still waits for it to fill and releases it, so that every `empty` phase counts all eight consumer warps in
// order (an arrival before the fill could complete an earlier phase of that stage).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "dkdv_factored.cuh"
#include "factored.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dm {
namespace dkdv {

using namespace factored;

// Q̂, dÔ, Q'ᶜᵀ, dÔᶜᵀ; lse2, δ, s
constexpr uint32_t kTileBytes = 4 * kBlockM * kHeadDim + 3 * kBlockM * sizeof(float);

template <int STAGES>
struct __align__(1024) Smem {
  uint8_t k[kConsumers][kBlockN * kHeadDim];
  uint8_t v[kConsumers][kBlockN * kHeadDim];
  uint8_t q[STAGES][kBlockM * kHeadDim];
  uint8_t dout[STAGES][kBlockM * kHeadDim];
  uint8_t qt[STAGES][kHeadDim * kBlockM];
  uint8_t dot[STAGES][kHeadDim * kBlockM];
  float lse[STAGES][kBlockM], delta[STAGES][kBlockM], rs[STAGES][kBlockM];
  StageInfo info[STAGES];
  uint64_t full[STAGES], empty[STAGES], kv_full;
};
template <int STAGES>
constexpr int smem_bytes() { return int(sizeof(Smem<STAGES>)) + 1024; }  // + room to align the base

struct Maps {
  CUtensorMap q, k, v, dout;  // rows of 128 codes, boxes of 64 rows, 128-byte swizzle
  CUtensorMap qt, dot;        // channel-major codes, boxes of 128 channels x 64 queries, 64-byte swizzle
};

template <int STAGES>
__device__ __forceinline__ void produce(Smem<STAGES>& s, const DkdvFactoredParams& p, const Maps& maps,
                                        Walk<STAGES, Schedule> w) {
  produce_walk(s.info, s.full, s.empty, w, kTileBytes, [&](int st, const auto& at, uint64_t* full) {
    const int64_t row = at.bh * p.n_pad + at.start;
    tma_load_2d(s.q[st], &maps.q, 0, int(row), full);
    tma_load_2d(s.dout[st], &maps.dout, 0, int(row), full);
    tma_load_2d(s.qt[st], &maps.qt, at.start, int(at.bh * kHeadDim), full);
    tma_load_2d(s.dot[st], &maps.dot, at.start, int(at.bh * kHeadDim), full);
    bulk_load(s.lse[st], p.lse2 + row, kBlockM * sizeof(float), full);
    bulk_load(s.delta[st], p.delta + row, kBlockM * sizeof(float), full);
    bulk_load(s.rs[st], p.rs + row, kBlockM * sizeof(float), full);
  });
}

template <bool PROMOTE, bool PIPELINED, int STAGES>
__device__ __forceinline__ void consume(Smem<STAGES>& s, const DkdvFactoredParams& p, int half, int b, int h_kv,
                                        int start_n) {
  const bool releaser = threadIdx.x % 32 == 0;
  Ring<STAGES> ring;
  auto take = [&](Tile& t) { return ring.take(s.info, s.full, s.empty, half, releaser, t); };
  const uint8_t* k = s.k[half];
  const uint8_t* v = s.v[half];
  const int64_t kv_block = (int64_t(b) * p.h_kv + h_kv) * (p.n_pad / kBlockN) + start_n / kBlockN;
  const float s_k = p.sk[kv_block], s_v = p.sv[kv_block];
  struct Scales {
    float row, dp;  // Sᵀ's (s_q·qk_scale)·s_k and dP̂ᵀ's s_v·s_do
  };
  auto scales_of = [&](const Tile& t) {  // read ahead of their use: global loads
    const int64_t at = t.bh * (p.n_pad / 128) + t.start / 128;
    return Scales{__fmul_rn(__fmul_rn(p.sq[at], p.qk_scale), s_k), __fmul_rn(s_v, p.sdo[at])};
  };
  // P̂ᵀ (·448, uncast) into st and dŜᵀ (uncast) into dpt, from Sᵀ and dP̂ᵀ of tile t
  auto form = [&](const Tile& t, Scales sc, float (&st)[kBlockM / 2], float (&dpt)[kBlockM / 2]) {
    if (t.masked) {  // two bodies: the unmasked one, most tiles, keeps no mask in registers across the wgmma
      ds_tile<true>(st, dpt, s.lse[t.stage], s.delta[t.stage], s.rs[t.stage], sc.row, sc.dp, true, start_n, t.start,
                    p.n, p.causal);
    } else {
      ds_tile<true>(st, dpt, s.lse[t.stage], s.delta[t.stage], s.rs[t.stage], sc.row, sc.dp, false, start_n,
                    t.start, p.n, p.causal);
    }
  };
  auto new_head = [&](float (&dv)[kHeadDim / 2], float (&dk)[kHeadDim / 2], int64_t prev, int64_t next) {
    rescale_channels(dv, p.sdoc + prev * kHeadDim, p.sdoc + next * kHeadDim);
    rescale_channels(dk, p.sqc + prev * kHeadDim, p.sqc + next * kHeadDim);
  };

  Tile cur;
  if (!take(cur)) return;  // no key of this half below N
  mbar_wait(&s.kv_full, 0);
  float dv[kHeadDim / 2] = {}, dk[kHeadDim / 2] = {};  // [64 keys, D]; in units of the current head's channel scales
  uint32_t pfrag[kTileSteps][4], dsfrag[kTileSteps][4];

  static_assert(!(PROMOTE && PIPELINED), "no registers for the next tile's Sᵀ and dP̂ᵀ beside the promotion's");
  if constexpr (!PIPELINED) {
    float part[PROMOTE ? kHeadDim / 2 : 1];  // one tile's dV, then dK product (PROMOTE)
    int64_t head = cur.bh;
    Tile t = cur;
    do {
      const Scales sc = scales_of(t);
      if (t.bh != head) new_head(dv, dk, head, t.bh), head = t.bh;
      {
        float st[kBlockM / 2], dpt[kBlockM / 2];
        issue_s_dp(st, dpt, k, v, s.q[t.stage], s.dout[t.stage]);
        wgmma_wait<0>();
        fence_operands(st);
        fence_operands(dpt);
        form(t, sc, st, dpt);
        to_fragments(st, pfrag);
        to_fragments(dpt, dsfrag);
      }
      if constexpr (PROMOTE) {
        issue_channel_product<true>(dv, part, pfrag, s.dot[t.stage]);
        wgmma_wait<0>();
        finish_acc<true>(dv, part);
        issue_channel_product<true>(dk, part, dsfrag, s.qt[t.stage]);
        wgmma_wait<0>();
        if (releaser) mbar_arrive(&s.empty[t.stage]);
        finish_acc<true>(dk, part);
      } else {
        issue_channel_product<false>(dv, dv, pfrag, s.dot[t.stage]);
        issue_channel_product<false>(dk, dk, dsfrag, s.qt[t.stage]);
        wgmma_wait<0>();
        if (releaser) mbar_arrive(&s.empty[t.stage]);
        fence_operands(dv);
        fence_operands(dk);
      }
      cur = t;
    } while (take(t));
  } else {
    {
      float st[kBlockM / 2], dpt[kBlockM / 2];
      const Scales sc = scales_of(cur);
      issue_s_dp(st, dpt, k, v, s.q[cur.stage], s.dout[cur.stage]);
      wgmma_wait<0>();
      fence_operands(st);
      fence_operands(dpt);
      form(cur, sc, st, dpt);
      to_fragments(st, pfrag);
      to_fragments(dpt, dsfrag);
    }
    Tile next;
#pragma unroll 1
    while (take(next)) {
      const Scales sc = scales_of(next);
      float st[kBlockM / 2], dpt[kBlockM / 2];
      issue_s_dp(st, dpt, k, v, s.q[next.stage], s.dout[next.stage]);
      issue_channel_product<false>(dv, dv, pfrag, s.dot[cur.stage]);
      issue_channel_product<false>(dk, dk, dsfrag, s.qt[cur.stage]);
      wgmma_wait<2>();  // Sᵀ and dP̂ᵀ of next; dV and dK of cur run on
      fence_operands(st);
      fence_operands(dpt);
      form(next, sc, st, dpt);
      wgmma_wait<0>();  // dV(cur), dK(cur): this warp is done with cur's stage
      if (releaser) mbar_arrive(&s.empty[cur.stage]);
      fence_operands(dv);
      fence_operands(dk);
      if (next.bh != cur.bh) new_head(dv, dk, cur.bh, next.bh);
      to_fragments(st, pfrag);
      to_fragments(dpt, dsfrag);
      cur = next;
    }
    issue_channel_product<false>(dv, dv, pfrag, s.dot[cur.stage]);
    issue_channel_product<false>(dk, dk, dsfrag, s.qt[cur.stage]);
    wgmma_wait<0>();
    fence_operands(dv);
    fence_operands(dk);
  }
  const float* sdoc = p.sdoc + cur.bh * kHeadDim;
  const float* sqc = p.sqc + cur.bh * kHeadDim;
  const float scale = p.softmax_scale;
  store_rows(dv, [&](float x, int, int col) { return __fmul_rn(x, __fmul_rn(sdoc[col], 1.0f / 448.0f)); }, p.dv,
             p.out_fp16, p.stride_b, p.stride_n, p.stride_h, b, h_kv, start_n, p.n);
  store_rows(dk, [&](float x, int, int col) { return __fmul_rn(__fmul_rn(x, sqc[col]), scale); }, p.dk, p.out_fp16,
             p.stride_b, p.stride_n, p.stride_h, b, h_kv, start_n, p.n);
}

template <bool PROMOTE, bool PIPELINED, int STAGES>
__device__ __forceinline__ void dkdv_block(uint8_t* raw, const DkdvFactoredParams& p, const Maps& maps) {
  Smem<STAGES>& s = aligned_smem<Smem<STAGES>>(raw);
  if (threadIdx.x == 0) {
    init_stage_barriers<STAGES>(s.full, s.empty, &s.kv_full, kConsumers * kThreads / 32);
    const int row = int(int64_t(blockIdx.y) * p.n_pad + blockIdx.x * kCtaRows);
    mbar_arrive_expect_tx(&s.kv_full, 2 * kCtaRows * kHeadDim);
#pragma unroll
    for (int i = 0; i < kConsumers; ++i) {
      tma_load_2d(s.k[i], &maps.k, 0, row + kBlockN * i, &s.kv_full);
      tma_load_2d(s.v[i], &maps.v, 0, row + kBlockN * i, &s.kv_full);
    }
  }
  __syncthreads();  // the barriers are initialised; no block-wide barrier after this point
  // what each role needs is computed after the register split: a value live across it would be spilled
  const int role = threadIdx.x / kThreads;  // 0: producer; 1, 2: the consumer of keys start_n + 64 (role − 1) ..
  if (role == 0) {
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      const int group = p.h / p.h_kv, b = blockIdx.y / p.h_kv, h_kv = blockIdx.y % p.h_kv;
      const int64_t bh0 = int64_t(b) * p.h + int64_t(h_kv) * group;
      const int start_n = blockIdx.x * kCtaRows;
      Schedule second(start_n + kBlockN, p.n, p.causal);
      if (start_n + kBlockN >= p.n) second.tiles = 0;  // no key of the second half exists
      produce<STAGES>(s, p, maps, Walk<STAGES, Schedule>(Schedule(start_n, p.n, p.causal), second, bh0, group));
    }
    return;
  }
  claim_registers<kConsumerRegs>();
  consume<PROMOTE, PIPELINED, STAGES>(s, p, role - 1, blockIdx.y / p.h_kv, blockIdx.y % p.h_kv,
                           blockIdx.x * kCtaRows + kBlockN * (role - 1));
}

}  // namespace dkdv
}  // namespace dm

#define DM_DKDV_KERNEL(NAME, PROMOTE, PIPELINED, STAGES)                                              \
  extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)                           \
      NAME(const DkdvFactoredParams p, const __grid_constant__ dm::dkdv::Maps maps) {                  \
    extern __shared__ uint8_t smem[];                                                                \
    dm::dkdv::dkdv_block<PROMOTE, PIPELINED, STAGES>(smem, p, maps);                                 \
  }
// wsN: N stages; unpromoted, the next tile's Sᵀ and dP̂ᵀ are issued with this tile's dV and dK (PIPELINED).
// ws3s: unpromoted without that overlap, each consumer's tile in turn (as promoted runs).
DM_DKDV_KERNEL(dm_dkdv_factored_ws3_promoted, true, false, 3)
DM_DKDV_KERNEL(dm_dkdv_factored_ws3_unpromoted, false, true, 3)
DM_DKDV_KERNEL(dm_dkdv_factored_ws4_promoted, true, false, 4)
DM_DKDV_KERNEL(dm_dkdv_factored_ws4_unpromoted, false, true, 4)
DM_DKDV_KERNEL(dm_dkdv_factored_ws3s_unpromoted, false, false, 3)
#undef DM_DKDV_KERNEL

namespace {

using DkdvKernel = void (*)(DkdvFactoredParams, dm::dkdv::Maps);

// The kernel of each (variant, promote), in cuda_lib.DKDV_VARIANTS' numbering, and its dynamic shared memory.
struct DkdvLaunch {
  DkdvKernel kernel;
  int smem;
};
DkdvLaunch dkdv_launch(int variant, bool promote) {
  using namespace dm::dkdv;
  switch (variant) {
    case 0: return {promote ? dm_dkdv_factored_ws3_promoted : dm_dkdv_factored_ws3_unpromoted, smem_bytes<3>()};
    case 1: return {promote ? dm_dkdv_factored_ws4_promoted : dm_dkdv_factored_ws4_unpromoted, smem_bytes<4>()};
    case 2: return {promote ? nullptr : dm_dkdv_factored_ws3s_unpromoted, smem_bytes<3>()};
    default: return {nullptr, 0};
  }
}

}  // namespace

extern "C" int dm_dkdv_factored(const DkdvFactoredParams* p, int promote, int variant, int device,
                                cudaStream_t stream) {
  using namespace dm::factored;
  if (!valid_shape(*p)) return cudaErrorInvalidValue;
  const DkdvLaunch launch = dkdv_launch(variant, promote != 0);
  if (!launch.kernel) return cudaErrorInvalidValue;
  if (cudaError_t err = prepare_launch(reinterpret_cast<const void*>(launch.kernel), launch.smem, device);
      err != cudaSuccess) {
    return err;
  }
  dm::dkdv::Maps maps;
  const uint64_t n_pad = p->n_pad, q_rows = uint64_t(p->b) * p->h * n_pad, kv_rows = uint64_t(p->b) * p->h_kv * n_pad;
  const uint64_t channel_rows = uint64_t(p->b) * p->h * kHeadDim;
  if (!encode_rows(&maps.q, p->q8, q_rows, kBlockM) || !encode_rows(&maps.k, p->k8, kv_rows, kBlockN) ||
      !encode_rows(&maps.v, p->v8, kv_rows, kBlockN) || !encode_rows(&maps.dout, p->do8, q_rows, kBlockM) ||
      !encode_channels(&maps.qt, p->q8t, n_pad, channel_rows, kBlockM) ||
      !encode_channels(&maps.dot, p->do8t, n_pad, channel_rows, kBlockM)) {
    return cudaErrorInvalidValue;  // no driver entry point, or a layout the TMA cannot describe
  }
  launch.kernel<<<cta_grid(p->n, p->b * p->h_kv), kCtaThreads, launch.smem, stream>>>(*p, maps);
  return cudaGetLastError();
}

// sizeof(DkdvFactoredParams), for the loader's check that its ctypes mirror has the same layout.
extern "C" int dm_dkdv_factored_params_size(void) { return static_cast<int>(sizeof(DkdvFactoredParams)); }
