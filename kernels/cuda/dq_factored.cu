// dQ of the factored scale layout (matched_factored, kernels/README.md) in one warp-specialised kernel, D = 128 (and
// D = 64: dm_dq_factored_d64, below), causal or not, any GQA group: the dQ half of M4 in kernels/CUDA_BACKWARD.md, deterministic (no atomics), on the structure of
// dkdv_factored.cu with the roles of queries and keys exchanged.
//
// One CTA per 128 queries and query head, three warpgroups:
//   - a producer warpgroup that gives its registers back (setmaxnreg 24); one thread loads Q̂ and dÔ of the 128
//     queries once, then per key tile K̂, V̂ (rows, 128-byte swizzle) and K̂ᶜᵀ (channel-major, 64-byte swizzle) into a
//     ring of STAGES stages;
//   - two consumer warpgroups (setmaxnreg 240), one per 64-query half: each is Triton's factored dQ launch
//     (triton_bwd._attn_bwd_dq_kernel, BLOCK_M = BLOCK_N = 64) for its 64 queries, reading the key tiles both share.
// Per key tile a consumer forms S = Q̂ K̂ᵀ and dP̂ = dÔ V̂ᵀ (4 + 4 SS m64n64k32), then P = ex2.approx.ftz(fma(S,
// (s_q·s_k)·qk_scale, −lse2)), masked; dS = P · fma(dP̂, s_do·s_v, −δ); dŜ = e4m3(dS · div.full(1, s)) (Triton's PTX,
// lse2 = 0, δ = 0, s = 1 for queries ≥ N as its masked loads give), and adds dQ += dŜ K̂ᶜ (2 RS m64n128k32 over the
// tile's 64 keys; K̂ᶜ in fragment order, triton_quant.fragment_token_order, so dŜ is the A fragments as it lies):
// promoted (ACC_PROMOTE = 64, the default) each tile's product starts from zero and is added in FP32, otherwise the
// wgmma accumulates in place. The epilogue writes ((dQ · s) · s_Kᶜ[d]) · softmax_scale, queries < N.
// Each half visits its key tiles in Triton's order (the unmasked ones, then the causal diagonal or the ragged end);
// the two orders merge (factored.cuh Walk): causal, the second half reads one key tile more than the first.
#include <cuda_runtime.h>

#include <cstdint>

#include "dq_factored.cuh"
#include "factored.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dm {
namespace dq {

using namespace factored;

template <int D>
constexpr uint32_t kTileBytesOf = 3 * kBlockN * D;  // K̂, V̂, K̂ᶜᵀ

// Rows of D codes: D = 128, D = 64 (dm_dq_factored_d64).
template <int STAGES, int D = kHeadDim>
struct __align__(1024) Smem {
  uint8_t q[kConsumers][kBlockM * D];
  uint8_t dout[kConsumers][kBlockM * D];
  uint8_t k[STAGES][kBlockN * D];
  uint8_t v[STAGES][kBlockN * D];
  uint8_t kt[STAGES][D * kBlockN];
  StageInfo info[STAGES];
  uint64_t full[STAGES], empty[STAGES], rows_full;
};
template <int STAGES, int D = kHeadDim>
constexpr int smem_bytes() { return int(sizeof(Smem<STAGES, D>)) + 1024; }  // + room to align the base

struct Maps {
  CUtensorMap q, dout, k, v;  // rows of D codes, boxes of 64 rows, RowTile<D>'s swizzle
  CUtensorMap kt;             // K̂ᶜ channel-major, boxes of D channels x 64 keys, 64-byte swizzle
};

template <int STAGES, int D>
__device__ __forceinline__ void produce(Smem<STAGES, D>& s, const Maps& maps, int64_t bh_kv, int n_pad,
                                        Walk<STAGES, KeySchedule> w) {
  const int64_t kv_rows = bh_kv * n_pad;
  produce_walk(s.info, s.full, s.empty, w, kTileBytesOf<D>, [&](int st, const auto& at, uint64_t* full) {
    tma_load_2d(s.k[st], &maps.k, 0, int(kv_rows + at.start), full);
    tma_load_2d(s.v[st], &maps.v, 0, int(kv_rows + at.start), full);
    tma_load_2d(s.kt[st], &maps.kt, at.start, int(bh_kv * D), full);
  });
}

// dŜ before its cast, in place in `dpt`, from S (st) and dP̂ (dpt) of the key tile at start_n for this thread's two
// query rows (`row[r]`, with their lse2, δ and 1/s).
__device__ __forceinline__ void ds_rows(const float (&st)[kBlockN / 2], float (&dpt)[kBlockN / 2], const int (&row)[2],
                                        const float (&lse)[2], const float (&delta)[2], const float (&inv_s)[2],
                                        float row_scale, float dp_scale, bool masked, int start_n, int n,
                                        bool causal) {
  const int q = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int r = v / 2, key = start_n + 8 * i + 2 * q + v % 2;
      float pv = ex2_approx_ftz(fmaf(st[4 * i + v], row_scale, -lse[r]));
      if (masked) {
        const bool visible = key < n && row[r] < n && (!causal || key <= row[r]);
        pv = visible ? pv : 0.0f;
      }
      const float ds = __fmul_rn(pv, fmaf(dpt[4 * i + v], dp_scale, -delta[r]));
      dpt[4 * i + v] = __fmul_rn(ds, inv_s[r]);
    }
  }
}

template <bool PROMOTE, int STAGES, int D>
__device__ __forceinline__ void consume(Smem<STAGES, D>& s, const DqFactoredParams& p, int half, int64_t bh,
                                        int64_t bh_kv, int start_m) {
  const bool releaser = threadIdx.x % 32 == 0;
  const auto [warp, g, q] = lane();
  int row[2];
  float lse[2], delta[2], s_row[2], inv_s[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // Triton's masked loads: lse2 0, δ 0, s 1 for queries ≥ N
    row[r] = start_m + 16 * warp + g + 8 * r;
    const bool valid = row[r] < p.n;
    const int64_t at = bh * p.n_pad + row[r];
    lse[r] = valid ? p.lse2[at] : 0.0f;
    delta[r] = valid ? p.delta[at] : 0.0f;
    s_row[r] = valid ? p.rs[at] : 1.0f;
    inv_s[r] = div_full(1.0f, s_row[r]);
  }
  const int64_t scale_at = bh * (p.n_pad / 128) + start_m / 128;
  const float s_q = p.sq[scale_at], s_do = p.sdo[scale_at];
  const int64_t kv_scales = bh_kv * (p.n_pad / kBlockN);
  const uint8_t* q8 = s.q[half];
  const uint8_t* do8 = s.dout[half];
  Ring<STAGES> ring;
  float dq[D / 2] = {};
  float part[PROMOTE ? D / 2 : 1];  // one tile's product (PROMOTE)
  uint32_t frag[kTileSteps][4];
  mbar_wait(&s.rows_full, 0);
  Tile t;
  while (ring.take(s.info, s.full, s.empty, half, releaser, t)) {
    const float s_k = p.sk[kv_scales + t.start / kBlockN], s_v = p.sv[kv_scales + t.start / kBlockN];
    const float row_scale = __fmul_rn(__fmul_rn(s_q, s_k), p.qk_scale), dp_scale = __fmul_rn(s_do, s_v);
    {
      float st[kBlockN / 2], dpt[kBlockN / 2];
      issue_s_dp<D>(st, dpt, q8, do8, s.k[t.stage], s.v[t.stage]);  // S = Q̂ K̂ᵀ, dP̂ = dÔ V̂ᵀ
      wgmma_wait<0>();
      fence_operands(st);
      fence_operands(dpt);
      if (t.masked) {  // two bodies: the unmasked one keeps no mask in registers
        ds_rows(st, dpt, row, lse, delta, inv_s, row_scale, dp_scale, true, t.start, p.n, p.causal);
      } else {
        ds_rows(st, dpt, row, lse, delta, inv_s, row_scale, dp_scale, false, t.start, p.n, p.causal);
      }
      to_fragments<true>(dpt, frag);  // K̂ᶜ in fragment order
    }
    if constexpr (PROMOTE) {
      issue_channel_product<true>(dq, part, frag, s.kt[t.stage]);
    } else {
      issue_channel_product<false>(dq, dq, frag, s.kt[t.stage]);
    }
    wgmma_wait<0>();
    if (releaser) mbar_arrive(&s.empty[t.stage]);
    if constexpr (PROMOTE) {
      finish_acc<true>(dq, part);
    } else {
      fence_operands(dq);
    }
  }
  const float* skc = p.skc + bh_kv * D;
  const float scale = p.softmax_scale;
  store_rows(dq, [&](float x, int r, int col) {
    return __fmul_rn(__fmul_rn(__fmul_rn(x, s_row[r]), skc[col]), scale);
  }, p.dq, p.out_fp16, p.stride_b, p.stride_n, p.stride_h, int(bh / p.h), int(bh % p.h), start_m, p.n);
}

template <bool PROMOTE, int STAGES, int D = kHeadDim>
__device__ __forceinline__ void dq_block(uint8_t* raw, const DqFactoredParams& p, const Maps& maps) {
  Smem<STAGES, D>& s = aligned_smem<Smem<STAGES, D>>(raw);
  if (threadIdx.x == 0) {
    load_query_rows<STAGES, D>(s, &maps.q, &maps.dout, int(int64_t(blockIdx.y) * p.n_pad + blockIdx.x * kCtaRows));
  }
  __syncthreads();  // the barriers are initialised; no block-wide barrier after this point
  // what each role needs is computed after the register split: a value live across it would be spilled
  const int role = threadIdx.x / kThreads;  // 0: producer; 1, 2: the consumer of queries start + 64 (role − 1) ..
  const int64_t bh = blockIdx.y, bh_kv = (bh / p.h) * p.h_kv + (bh % p.h) / (p.h / p.h_kv);
  if (role == 0) {
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      const int start_m = blockIdx.x * kCtaRows;
      KeySchedule second(start_m + kBlockM, p.n, p.causal);
      if (start_m + kBlockM >= p.n) second.tiles = 0;  // no query of the second half exists
      produce(s, maps, bh_kv, p.n_pad,
                      Walk<STAGES, KeySchedule>(KeySchedule(start_m, p.n, p.causal), second, bh, 1));
    }
    return;
  }
  claim_registers<kConsumerRegs>();
  consume<PROMOTE, STAGES>(s, p, role - 1, bh, bh_kv, blockIdx.x * kCtaRows + kBlockM * (role - 1));
}

}  // namespace dq
}  // namespace dm

#define DM_DQ_KERNEL(NAME, PROMOTE, STAGES)                                                 \
  extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)                           \
      NAME(const DqFactoredParams p, const __grid_constant__ dm::dq::Maps maps) {                      \
    extern __shared__ uint8_t smem[];                                                                \
    dm::dq::dq_block<PROMOTE, STAGES>(smem, p, maps);                                      \
  }
DM_DQ_KERNEL(dm_dq_factored_ws3_promoted, true, 3)
DM_DQ_KERNEL(dm_dq_factored_ws3_unpromoted, false, 3)
#undef DM_DQ_KERNEL
// D = 64: rows of 64 codes (Q̂, dÔ, K̂, V̂ in the 64-byte swizzle, two k = 32 steps of S and dP̂), dQ [64 queries,
// 64 channels] by m64n64k32 into 32 accumulators a thread
#define DM_DQ_D64_KERNEL(NAME, PROMOTE, STAGES)                                                     \
  extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)                       \
      NAME(const DqFactoredParams p, const __grid_constant__ dm::dq::Maps maps) {                  \
    extern __shared__ uint8_t smem[];                                                            \
    dm::dq::dq_block<PROMOTE, STAGES, 64>(smem, p, maps);                                        \
  }
DM_DQ_D64_KERNEL(dm_dq_factored_ws3_promoted_d64, true, 3)
DM_DQ_D64_KERNEL(dm_dq_factored_ws3_unpromoted_d64, false, 3)
#undef DM_DQ_D64_KERNEL

namespace {

// A dQ launch at D: the device and shared memory prepared, the maps encoded (rows of D codes, K̂ᶜ in boxes of D
// channels x 64 keys), one CTA per 128 queries and query head.
template <int D>
int launch_dq(void (*kernel)(DqFactoredParams, dm::dq::Maps), const DqFactoredParams& p, int device,
              cudaStream_t stream) {
  using namespace dm::factored;
  const int smem = dm::dq::smem_bytes<3, D>();
  if (cudaError_t err = prepare_launch(reinterpret_cast<const void*>(kernel), smem, device); err != cudaSuccess) {
    return err;
  }
  dm::dq::Maps maps;
  const uint64_t n_pad = p.n_pad, q_rows = uint64_t(p.b) * p.h * n_pad, kv_rows = uint64_t(p.b) * p.h_kv * n_pad;
  if (!encode_rows<D>(&maps.q, p.q8, q_rows, kBlockM) || !encode_rows<D>(&maps.dout, p.do8, q_rows, kBlockM) ||
      !encode_rows<D>(&maps.k, p.k8, kv_rows, kBlockN) || !encode_rows<D>(&maps.v, p.v8, kv_rows, kBlockN) ||
      !encode_channels<D>(&maps.kt, p.k8t, n_pad, uint64_t(p.b) * p.h_kv * D, kBlockN)) {
    return cudaErrorInvalidValue;  // no driver entry point, or a layout the TMA cannot describe
  }
  kernel<<<cta_grid(p.n, p.b * p.h), kCtaThreads, smem, stream>>>(p, maps);
  return cudaGetLastError();
}

}  // namespace

// variant: 0 each tile in turn (ws3), the one form (cuda_lib.DQ_VARIANTS; FA3's ping-pong, ws3pp, gained nothing on
// the H200 and was removed: kernels/NOTES.md, session 11)
extern "C" int dm_dq_factored(const DqFactoredParams* p, int promote, int variant, int device, cudaStream_t stream) {
  if (!dm::factored::valid_shape(*p) || variant != 0) return cudaErrorInvalidValue;
  return launch_dq<dm::factored::kHeadDim>(promote ? dm_dq_factored_ws3_promoted : dm_dq_factored_ws3_unpromoted, *p,
                                           device, stream);
}

// dQ at D = 64 (promote and variant as dm_dq_factored's). Operands as dm_dq_factored's with D = 64: K̂ᶜ channel-major
// in fragment order.
extern "C" int dm_dq_factored_d64(const DqFactoredParams* p, int promote, int variant, int device,
                                  cudaStream_t stream) {
  if (!dm::factored::valid_shape(*p) || variant != 0) return cudaErrorInvalidValue;
  return launch_dq<64>(promote ? dm_dq_factored_ws3_promoted_d64 : dm_dq_factored_ws3_unpromoted_d64, *p, device,
                       stream);
}

// sizeof(DqFactoredParams), for the loader's check that its ctypes mirror has the same layout.
extern "C" int dm_dq_factored_params_size(void) { return static_cast<int>(sizeof(DqFactoredParams)); }
