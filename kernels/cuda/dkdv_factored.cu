// dK and dV of the factored scale layout (matched_factored, kernels/README.md) in one warp-specialised kernel, D = 128
// (and D = 64, dm_dkdv_factored_d64 below: without dQ, or ws3xfd's or ws3xfdt's form with it), causal or not, any GQA
// group: M3 of kernels/CUDA_BACKWARD.md on M6's structure.
//
// One CTA per 128 keys and kv head, three warpgroups:
//   - a producer warpgroup that gives its registers back (setmaxnreg 24); one thread issues the TMA loads: K̂ and V̂
//     of the 128 keys once, then per query tile Q̂, dÔ (token-major, 128-byte swizzle), Q'ᶜᵀ and dÔᶜᵀ
//     (channel-major, 64-byte swizzle) and lse2, δ, 1/s (bulk copies) into a ring of STAGES stages;
//   - two consumer warpgroups (setmaxnreg 240), one per 64-key half: each is Triton's factored dK and dV launches for
//     its 64-key block fused (their BLOCK_N), reading the stages both share.
// Per query tile a consumer forms Sᵀ = K̂ Q̂ᵀ and dP̂ᵀ = V̂ dÔᵀ (4 + 4 SS m64n64k32, one wgmma group), then on the CUDA
// cores P, P̂ᵀ = e4m3(P · 448) and dŜᵀ = e4m3(P · fma(dP̂ᵀ, s_v·s_do, −δ) · div.full(1, s)) (factored.cuh ds_tile, the
// arithmetic of Triton's PTX; div.full(1, s) as the δ pass wrote it, `irs`), and adds dV += P̂ᵀ dÔᶜ and
// dK += dŜᵀ Q̂'ᶜ (2 + 2 RS m64n128k32). dÔᶜ and Q̂'ᶜ come in fragment order (triton_quant.fragment_token_order: each
// 16-query group permuted), so the accumulators are the RS products' A fragments as they lie (to_fragments<true>).
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
//
// With dQ (`DQ`, promoted, 3 stages; FA3's dQ inside the dK/dV kernel, M4's reduce-add): both consumers take every
// stage. Per stage (tile j) each writes its dŜᵀ, cast, transposed into its 64 keys of a shared dŜ tile [64 queries, 128
// keys] (two buffers, j % 2; zeros for a stage its half does not read) and arrives on that buffer's `ds_full`; it then
// runs its dV and dK products and only after them waits for `ds_full` (the other half): consumer h forms the dQ product
// of the tile's queries and channels 64h .. 64h + 63 over the CTA's 128 keys (4 SS m64n64k32 from the K̂ᶜᵀ tile of the
// CTA's keys, loaded once, its keys in fragment order as the dŜ tile's columns are written; each 64-key half from zero
// and the two added in FP32, as dq_factored.cu promotes per key tile), arrives on `ds_empty`, writes the product into
// the shared FP32 dQ tile once `dq_empty` says the last one was read, and arrives on `dq_full`. Two threads of the
// producer warpgroup (the reducers) walk the same tiles, each taking every other one, and per tile wait for `dq_full`,
// add the 32 KB into dq_acc by the bulk-copy engine's reduction (cp.reduce.async.bulk .add.f32) and, once it has been
// read, arrive on `dq_empty` (a barrier pair per reducer: tile j's are [j % 2]). dm_dkdv_dq_epilogue then writes dQ
// with dq_factored.cu's epilogue arithmetic. On the H200 (kernels/NOTES.md, session 12) this form took 5.55 ms against
// 3.67 + 2.16 for the dK/dV and dQ launches; the forms timed beside it lost: the consumers meeting at two named
// barriers per tile (5.57 ms), each consumer reducing its own 64-key product (twice the reduce traffic: L2 bound, 5.99
// ms), and the dQ product issued with dK's into one 128-deep accumulator (6.97 ms, 128 B spilled, 10× dQ's error). The
// FP32 adds land in any order, so dQ is not bit-reproducible; dK and dV stay Triton's bits.
//
// Ordered (`ORDERED`, the kernel ..._dq_ordered, where dq_sem is set: FA3's deterministic mode): the adds into each
// query tile land in decreasing key blocks. The CTAs map to key blocks from the last (the shortest first, FA3's SPT
// order), kv heads interleaved in sections that fit in L2 (cta_coords); each half walks its tiles in increasing order
// (IncreasingSchedule: the diagonal first), so that a key block reaches a query tile two tiles after the next block
// does; the tile's reducer waits on the tile's counter for the blocks after its own and counts itself once its add has
// completed. Every CTA waited for was launched earlier, so no wait can deadlock. dQ is then bit-reproducible; dK and dV
// sum their tiles in that increasing order, not Triton's bits (within FP32 round-off). On the H200 (session 14) the
// waits cost ≈ 0.3 ms of its 5.2: 1.8% faster than the dK/dV and dQ launches, 8% slower than any order.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "dkdv_factored.cuh"
#include "factored.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dm {
namespace dkdv {

using namespace factored;

// Q̂, dÔ, Q'ᶜᵀ, dÔᶜᵀ; lse2, δ, 1/s
template <int D>
constexpr uint32_t kTileBytesOf = 4 * kBlockM * D + 3 * kBlockM * sizeof(float);

// Rows of D codes: D = 128 (every form), D = 64 (ws3 and ws4 without dQ: dm_dkdv_factored_d64).
template <int STAGES, int D = kHeadDim>
struct __align__(1024) Smem {
  uint8_t k[kConsumers][kBlockN * D];
  uint8_t v[kConsumers][kBlockN * D];
  uint8_t q[STAGES][kBlockM * D];
  uint8_t dout[STAGES][kBlockM * D];
  uint8_t qt[STAGES][D * kBlockM];
  uint8_t dot[STAGES][D * kBlockM];
  float lse[STAGES][kBlockM], delta[STAGES][kBlockM], irs[STAGES][kBlockM];  // irs: div.full(1, s)
  StageInfo info[STAGES];
  uint64_t full[STAGES], empty[STAGES], kv_full;
  // the persistent form (dkdv_persistent): kv_empty, once the consumers are done with a key block's K̂, V̂ and K̂ᶜᵀ
  // (8 arrivals, one a consumer warp); the key blocks taken, item[i] (a linear index of tile_from_last, −1: none
  // left), filled by the producer thread (item_full[i], 1 arrival) and read by the consumer warps and the reducers
  // (item_empty[i], 8 + 2 arrivals)
  uint64_t kv_empty, item_full[2], item_empty[2];
  int item[2];
};
// What the DQ form adds after Smem (whose size is a multiple of 1024).
template <int D = kHeadDim>
struct __align__(1024) DqSmem {
  uint8_t kt[D * kCtaRows];             // K̂ᶜᵀ of the CTA's keys: [D channels, 128 keys], 128-byte swizzle
  uint8_t ds[2][kBlockM * kCtaRows];    // dŜ of tile j in ds[j % 2]: [64 queries, 128 keys], 128-byte swizzle
  float dq[kBlockM * D];                // the dQ product of the current tile in dq_order, the reduction's source
  uint64_t ds_full[2], ds_empty[2];     // 256 arrivals each: every consumer thread has written / read ds[i]
  uint64_t dq_full[2], dq_empty[2];     // tile j's, [j % 2]: 256 arrivals: dq written; 1 (reducer j % 2): read
};
template <int STAGES, bool DQ = false, int D = kHeadDim>
constexpr int smem_bytes() {  // + room to align the base
  return int(sizeof(Smem<STAGES, D>)) + (DQ ? int(sizeof(DqSmem<D>)) : 0) + 1024;
}
template <int STAGES, int D>
__device__ __forceinline__ DqSmem<D>& dq_smem(Smem<STAGES, D>& s) { return *reinterpret_cast<DqSmem<D>*>(&s + 1); }

// Where a 64-query block's dQ product sits in DqSmem::dq and in its 32 KB block of dq_acc: thread t of consumer h stores
// its accumulator values 4i .. 4i + 3 (i < 8, channels 64h + 8i ..) as one float4 at dq_order(8h + i, t) = (8h + i) ·
// 512 + 4t (a warp's stores are 512 contiguous bytes): value 4i + v is query 16w + g + 8(v / 2), channel 64h + 8i + 2q +
// v % 2 (wgmma.cuh's accumulator layout). At D = 64 the dQ warpgroup's chunks give i < 8 over channels 8i .. alone.
__device__ __forceinline__ int dq_order(int i, int t) { return i * 512 + 4 * t; }
template <int D = kHeadDim>
constexpr int kDqBlockFloatsOf = kBlockM * D;

struct Maps {
  CUtensorMap q, k, v, dout;  // rows of 128 codes, boxes of 64 rows, 128-byte swizzle
  CUtensorMap qt, dot;        // channel-major codes, boxes of 128 channels x 64 queries, 64-byte swizzle
  CUtensorMap kt;             // DQ: K̂ᶜ channel-major, boxes of 128 channels x 128 keys, 128-byte swizzle
  CUtensorMap dk, dv;         // TMA_OUT: the outputs, boxes of 64 channels x kOutBoxRows<D> keys (encode_out_rows)
};

// e4m3(dpt), a consumer's dŜᵀ [64 keys, 64 queries] in accumulator order, as the A fragments of dK's product
// (to_fragments<true>) and, transposed, into the dŜ tile [64 queries, 128 keys] at keys key0 + 0 .. 63: one byte
// store per element (the 8 threads of a row group write 8 bytes of each of 4 rows, in distinct banks under the swizzle).
__device__ __forceinline__ void to_fragments_transposed(const float (&dpt)[kBlockM / 2], uint32_t (&frag)[kTileSteps][4],
                                                        uint8_t* ds, int key0) {
  const auto [warp, g, q] = lane();
#pragma unroll
  for (int kk = 0; kk < kTileSteps; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int h16 = 2 * kk + r / 2, v0 = 8 * h16 + 2 * (r % 2);
      const uint32_t codes = cvt_e4m3x4(dpt[v0], dpt[v0 + 1], dpt[v0 + 4], dpt[v0 + 5]);
      frag[kk][r] = codes;  // Q̂'ᶜ in fragment order (to_fragments<true>)
      // key key0 + 16 warp + g + 8 (r % 2) at its place in K̂ᶜ's fragment order (fragment_token_order's inverse: token
      // 8h + 2q' + j' of a 16-key group sits at 4q' + 2h + j'), the order of the dQ product's B operand
      const int key = key0 + 16 * warp, at = 4 * (g >> 1) + 2 * (r % 2) + (g & 1), query = 16 * h16 + 2 * q;
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // byte j: queries query, query + 1, query + 8, query + 9
        const int row = query + (j & 1) + 8 * (j >> 1);
        ds[QTile::chunk_offset(row, key >> 4) + at] = uint8_t(codes >> (8 * j));
      }
    }
  }
}

// to_fragments_transposed with the dŜ tile written a 32-bit word at a time (`ws3x`, the same bytes in the same places).
// A query's bytes at 4a .. 4a + 3 of a 16-key group (fragment order: keys 2a, 2a + 1, 2a + 8, 2a + 9 of the group)
// lie in the lanes of g = 2a and 2a + 1 (lane ^ 4), two registers each (rows g and g + 8). Per 16-query group each
// lane keeps the bytes of the two queries it writes (p = g & 1: queries 2q + p and 2q + p + 8), sends the partner the
// other two's (one SHFL), and packs and stores two words: 16 PRMT, 4 SHFL and 8 STS.32 a tile where the byte stores
// take 32 STS.U8 and their byte extraction and addresses (the SASS: 61 instructions fewer a tile). The words' rows
// differ by multiples of 8, so one swizzled base serves all eight stores; the eight rows a store's lanes write
// (2q + p) put its 32 words in 32 distinct banks. (A lane-level emulation of both functions gave the same tile.)
__device__ __forceinline__ void to_fragments_exchanged(const float (&dpt)[kBlockM / 2], uint32_t (&frag)[kTileSteps][4],
                                                       uint8_t* ds, int key0) {
  const auto [warp, g, q] = lane();
  const int p = g & 1;
  // __byte_perm selectors (bytes 0-3 the first operand's, 4-7 the second's): what this lane keeps and sends of its two
  // rows' registers, then its two words from what it keeps and what it receives (the partner's bytes second)
  const uint32_t keep_sel = p ? 0x7531u : 0x6420u, send_sel = p ? 0x6420u : 0x7531u;
  const uint32_t lo_sel = p ? 0x2604u : 0x6240u, hi_sel = p ? 0x3715u : 0x7351u;
  uint8_t* base = ds + QTile::chunk_offset(2 * q + p, (key0 + 16 * warp) >> 4) + 4 * (g >> 1);
#pragma unroll
  for (int kk = 0; kk < kTileSteps; ++kk) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int h16 = 2 * kk + m;
      uint32_t codes[2];  // rows g and g + 8; queries 16 h16 + 2q + (0, 1, 8, 9)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int v0 = 8 * h16 + 2 * rr;
        codes[rr] = cvt_e4m3x4(dpt[v0], dpt[v0 + 1], dpt[v0 + 4], dpt[v0 + 5]);
        frag[kk][2 * m + rr] = codes[rr];  // Q̂'ᶜ in fragment order (to_fragments<true>)
      }
      const uint32_t keep = __byte_perm(codes[0], codes[1], keep_sel);
      const uint32_t got = __shfl_xor_sync(0xffffffffu, __byte_perm(codes[0], codes[1], send_sel), 4);
      *reinterpret_cast<uint32_t*>(base + 16 * h16 * QTile::kRowBytes) = __byte_perm(keep, got, lo_sel);
      *reinterpret_cast<uint32_t*>(base + (16 * h16 + 8) * QTile::kRowBytes) = __byte_perm(keep, got, hi_sel);
    }
  }
}

// Zeros into keys 64h .. 64h + 63 of the dŜ tile: a stage half h does not read.
__device__ __forceinline__ void zero_ds_half(uint8_t* ds, int half) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int at = threadIdx.x % kThreads + kThreads * j, row = at / 4, chunk = 4 * half + at % 4;
    *reinterpret_cast<uint4*>(ds + QTile::chunk_offset(row, chunk)) = make_uint4(0, 0, 0, 0);
  }
}

// The CTA's key block and kv head. Ordered (dq_sem): the launch order is key block by key block from the last (the
// shortest first, causal: FA3's SPT order), the kv heads of a section of dq_section_heads interleaved (cta_from_last),
// so that every CTA a query tile's adds wait for was launched before the CTA that waits (no deadlock however few CTAs
// fit at once).
struct CtaCoords {
  unsigned block, bh_kv;
};
__device__ __forceinline__ CtaCoords cta_coords(const DkdvFactoredParams& p) {
  const CtaTile cta = cta_from_last(unsigned(p.dq_section_heads));
  return {cta.block, cta.bh};
}

// Where the dQ-in-dK/dV forms wait (tools/device/dq_clock.py), in a build with -DDM_DQ_CLOCK only: kClockSlots
// counters per CTA (linear blockIdx) in dm_dq_clock, read by the exported dm_dq_clock_read. Without the macro every
// member is empty and the kernels compile as before.
enum ClockSlot : int {  // reducer 1's from kReducerSlots on, the same way; the consumers' and kWhere in reducer 0's
  kWhere = 0,        // key block | (batch · head of the walk's first query head) << 16 | smid << 32
  kStartNs, kEndNs,  // the reducer's first and last moment (globaltimer)
  kStartClk, kEndClk,  // the same in SM cycles (clock64): cycles per ns
  kTurnClk,          // the reducer's cycles waiting for tiles' turns
  kFullClk,          // ... for the consumers' products (dq_full)
  kCountClk,         // ... for its last add's writes, and counting them
  kReadClk,          // ... for its adds to read the dQ buffer (issue to dq_empty)
  kTiles, kSpun,     // tiles; turns not reached at the first read of the counter
  kTurnMaxClk,       // its longest wait for a turn
  kEmptyClk0, kEmptyClk1,  // each consumer's cycles waiting for the reducer to read the dQ buffer (dq_empty)
  kPeerClk0, kPeerClk1,    // each consumer's cycles waiting for the other's dŜ (ds_full)
  kStageClk0, kStageClk1,  // each consumer's cycles waiting for its stages' loads (full)
  kLoopClk0, kLoopClk1,    // each consumer's cycles in its tile loop
  kCtaNs,                  // reducer 0's: thread 0's first moment (globaltimer; the CTA's start)
  kEpilogueNs, kExitNs,    // reducer r's: consumer r's epilogue start and end (its thread 0; globaltimer)
  kReducerSlots,
};
// The dQ warpgroup form (ws3xfd): each consumer's kPeerClk is its wait for the dQ warpgroup to release dŜ (ds_empty),
// and the dQ warpgroup's own counters sit in reducer 1's unused consumer slots: kPeerClk0 its waits for both
// consumers' dŜ (ds_full), kEmptyClk0 for the reducers to read its product (dq_empty), kLoopClk0 its tile loop.
#ifdef DM_DQ_CLOCK
constexpr int kClockSlots = 2 * kReducerSlots, kClockCtas = 16384;
__device__ unsigned long long dm_dq_clock[kClockSlots * kClockCtas];
struct DqClock {
  static __device__ __forceinline__ unsigned long long now() { return clock64(); }
  static __device__ __forceinline__ unsigned long long* slots(int row) {  // row < 0: the CTA's linear blockIdx
    return dm_dq_clock + kClockSlots * ((row >= 0 ? unsigned(row) : blockIdx.y * gridDim.x + blockIdx.x) % kClockCtas);
  }
  static __device__ __forceinline__ unsigned long long ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  static __device__ __forceinline__ void put(int slot, unsigned long long value, int reducer = 0, int row = -1) {
    slots(row)[slot + kReducerSlots * reducer] = value;
  }
  static __device__ __forceinline__ void where(int block, int bh, int row = -1) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    put(kWhere, unsigned(block) | (unsigned long long)(bh) << 16 | (unsigned long long)(sm) << 32, 0, row);
  }
};
// What the consumers' chain would cost without a product (timing only, the results wrong): dm_dq_diag's bit 1
// skips the consumers' dV product, bit 2 their dK product (the stage still released), bit 4 the reducers' adds into
// dq_acc (the kernel without its dQ traffic into L2), set by dm_dq_diag_set; read
// once before the tile loop (a global load a tile would lengthen the very chain it prices: 4.00 → 4.76 ms).
__device__ int dm_dq_diag;
__device__ __forceinline__ int diag_bits() { return *(volatile int*)&dm_dq_diag; }
#else
__device__ __forceinline__ constexpr int diag_bits() { return 0; }
struct DqClock {
  static __device__ __forceinline__ unsigned long long now() { return 0; }
  static __device__ __forceinline__ unsigned long long ns() { return 0; }
  static __device__ __forceinline__ void put(int, unsigned long long, int = 0, int = -1) {}
  static __device__ __forceinline__ void where(int, int, int = -1) {}
};
#endif

// How the ordered form's reducer orders its adds (dq_sync): kWritten counts an add once its writes have
// completed (checked before the next tile's turn, while the consumers form it), a release with proxy fences between
// the counter's generic accesses and the bulk-copy engine's; the others are cuda_dv_bench.py's controls, to see what
// each step costs: the same without the proxy fences; FA3's (a release once the add has read its shared memory, no
// fences: its writes may still be on their way); the launch order alone (no waits, no counts: the adds in any order);
// and a relaxed count once the writes have completed (no fences, no MEMBAR.GPU: the release's); then kWritten and
// that relaxed count each with the turns read relaxed (no CCTL.IVALL: wait_count); then kWritten's count without its
// wait, and its wait's read without the count (a turn always reached): each half alone, the adds in any order; then
// kWritten with no fence at all (relaxed reads, no proxy fences, a relaxed count once written), that form's read
// alone, FA3's count once read with no fence at all (kBareRead: as fast as the launch order alone, session 15; its
// order rests on the L2 applying two adds in the order they were issued; what cuda_lib dispatches since session 16,
// after 4,800 launches of tools/device/dq_stress.py gave one set of sums), and kBare's wait for the writes alone.
// kWritten keeps the order the PTX memory model guarantees.
enum DqSync : int {
  kWritten = 0, kWrittenNoFence = 1, kRead = 2, kOrderOnly = 3, kWrittenRelaxed = 4, kWrittenRelaxedPoll = 5,
  kRelaxed = 6, kCountOnly = 7, kReadOnly = 8, kBare = 9, kBareReadOnly = 10, kBareRead = 11, kBareWriteWait = 12
};
// Whether the ordered form's dq_sync orders the adds (each waits for its turn and then counts itself): then each query
// tile's first add (turn 0) stores its product rather than adding it, and dq_acc needs no zeroing before the launch.
__host__ __device__ constexpr bool stores_first(int sync) {
  return sync != kOrderOnly && sync != kCountOnly && sync != kReadOnly && sync != kBareReadOnly &&
         sync != kBareWriteWait;
}

// The reducers (two threads of the producer warpgroup, in two warps): reducer r takes the tiles j of the walk with
// j % 2 == r; per tile, once both consumers have written its dQ product (dq_full[r]), its 32 KB added into dq_acc,
// the buffer handed back (dq_empty[r]) once the bulk copy has read it. Ordered (dq_sem): first, while the consumers
// still form the product, the add into a query tile waits until the key blocks after this one that reach it (causal:
// those at or before it) have added theirs; after the add it counts itself on the tile's counter (dq_sync says when).
// Two, so that each has two tiles' time for its serial steps: the add's read (≈ 1 µs of a 2.3 µs tile on the H200), the
// turn (an acquire round trip) and the wait for the add's writes (L2's reduction, 2-3 µs under load) — one reducer
// made the ordered form wait on them (session 15, tools/device/dq_clock.py). What two left of its cost is the wait
// for the writes itself (or an acquire or proxy fence in the read): once a tile it slows the consumers' loops ≈ 6%.
// `j0`: the tiles the CTA walked before this key block (the persistent form), where the dQ buffers' turns and phases
// go on from; returns the count after it. `drain`: wait for the last add's writes at the end (not between a persistent
// CTA's key blocks). `clock_row`: DqClock's row of this key block (the persistent form's linear index; −1: blockIdx).
template <bool ORDERED, int STAGES, typename Sched, int D>
__device__ __forceinline__ uint32_t reduce_dq(DqSmem<D>& x, const DkdvFactoredParams& p, Walk<STAGES, Sched> w,
                                              int block, int r, uint32_t j0 = 0, bool drain = true,
                                              int clock_row = -1) {
  const int blocks = p.n_pad / kCtaRows;
  const bool ordered = ORDERED && p.dq_sync != kOrderOnly;
  const bool waits = p.dq_sync != kCountOnly;
  const bool counts = p.dq_sync != kReadOnly && p.dq_sync != kBareReadOnly && p.dq_sync != kBareWriteWait;
  const bool bare = p.dq_sync >= kBare;
  const bool fence = !bare && (p.dq_sync == kWritten || p.dq_sync >= kWrittenRelaxedPoll);
  const bool acquire = !bare && (p.dq_sync < kWrittenRelaxedPoll || p.dq_sync >= kCountOnly);
  auto wait_turn = [&](const int* counter, int value) {  // how many times it read the counter
    if (bare) return wait_count<false, false>(counter, value);
    if (acquire) return fence ? wait_count<true>(counter, value) : wait_count<false>(counter, value);
    return wait_count<true, false>(counter, value);
  };
  auto count = [&](int* counter) {
    if (p.dq_sync == kWrittenRelaxed || p.dq_sync == kRelaxed || bare) {
      count_relaxed(counter);
    } else if (fence) {
      release_count<true>(counter);
    } else {
      release_count<false>(counter);
    }
  };
  if (r == 0) DqClock::where(block, int(w.bh), clock_row);
  DqClock::put(kStartNs, DqClock::ns(), r, clock_row);
  DqClock::put(kStartClk, DqClock::now(), r, clock_row);
  unsigned turn_clk = 0, full_clk = 0, count_clk = 0, read_clk = 0, spun = 0, turn_max = 0, tiles = 0;
  const bool skip_add = (diag_bits() & 4) != 0;
  uint32_t j = j0;
  for (; !w.done(); ++j, w.advance()) {
    if ((j & 1) != uint32_t(r)) continue;
    const int64_t tile = w.bh * (p.n_pad / kBlockM) + w.start / kBlockM;
    const int last = p.causal ? min(blocks - 1, w.start / kCtaRows) : blocks - 1;  // the first block to add
    const bool store = ORDERED && stores_first(p.dq_sync) && block == last;
    if (ordered && waits) {
      const auto t0 = DqClock::now();
      const int turn = counts ? last - block : 0;
      spun += wait_turn(p.dq_sem + tile, turn) > 1;
      const unsigned waited = unsigned(DqClock::now() - t0);
      turn_clk += waited;
      turn_max = max(turn_max, waited);
    }
    const auto t1 = DqClock::now();
    mbar_wait(&x.dq_full[r], (j >> 1) & 1);
    const auto t2 = DqClock::now();
    if (skip_add) {  // DM_DQ_CLOCK's dm_dq_diag bit 4: no dQ traffic into L2 (timing only)
    } else if (store) {
      bulk_store_f32(p.dq_acc + tile * kDqBlockFloatsOf<D>, x.dq, kDqBlockFloatsOf<D> * sizeof(float));
    } else {
      bulk_reduce_add_f32(p.dq_acc + tile * kDqBlockFloatsOf<D>, x.dq, kDqBlockFloatsOf<D> * sizeof(float));
    }
    bulk_wait_read<0>();
    mbar_arrive(&x.dq_empty[r]);
    const auto t3 = DqClock::now();
    if (ordered && (counts || p.dq_sync == kBareWriteWait)) {
      if (p.dq_sync != kRead && p.dq_sync != kBareRead) bulk_wait<0>();  // its writes complete (FA3's: once read)
      if (counts) count(p.dq_sem + tile);
    }
    full_clk += unsigned(t2 - t1);
    read_clk += unsigned(t3 - t2);
    count_clk += unsigned(DqClock::now() - t3);
    ++tiles;
  }
  if (drain) bulk_wait<0>();
  DqClock::put(kEndNs, DqClock::ns(), r, clock_row);
  DqClock::put(kEndClk, DqClock::now(), r, clock_row);
  DqClock::put(kTurnClk, turn_clk, r, clock_row);
  DqClock::put(kFullClk, full_clk, r, clock_row);
  DqClock::put(kCountClk, count_clk, r, clock_row);
  DqClock::put(kReadClk, read_clk, r, clock_row);
  DqClock::put(kTiles, tiles, r, clock_row);
  DqClock::put(kSpun, spun, r, clock_row);
  DqClock::put(kTurnMaxClk, turn_max, r, clock_row);
  return j;
}

template <int STAGES, int D, typename Sched>
__device__ __forceinline__ uint32_t produce(Smem<STAGES, D>& s, const DkdvFactoredParams& p, const Maps& maps,
                                            Walk<STAGES, Sched> w, uint32_t j0 = 0) {
  return produce_walk(s.info, s.full, s.empty, w, kTileBytesOf<D>, [&](int st, const auto& at, uint64_t* full) {
    const int64_t row = at.bh * p.n_pad + at.start;
    tma_load_2d(s.q[st], &maps.q, 0, int(row), full);
    tma_load_2d(s.dout[st], &maps.dout, 0, int(row), full);
    tma_load_2d(s.qt[st], &maps.qt, at.start, int(at.bh * D), full);
    tma_load_2d(s.dot[st], &maps.dot, at.start, int(at.bh * D), full);
    bulk_load(s.lse[st], p.lse2 + row, kBlockM * sizeof(float), full);
    bulk_load(s.delta[st], p.delta + row, kBlockM * sizeof(float), full);
    bulk_load(s.irs[st], p.irs + row, kBlockM * sizeof(float), full);
  }, j0);
}

// A consumer's key block: its batch, kv head and first key.
struct KvBlock {
  int b, h_kv, start_n;
};
// Where the epilogue stores a consumer's dK and dV: the block it was given (a persistent CTA's, read again from shared
// memory after the tile loop instead of kept in registers through it).
struct SameBlock {
  __device__ KvBlock operator()(int b, int h_kv, int start_n) const { return {b, h_kv, start_n}; }
};

// dQ's product of N channels (`kt`: their rows of K̂ᶜᵀ, 128 keys each) over dŜ tile `ds` [64 queries, 128 keys]:
// keys 0-63 into qa and 64-127 into qb, each from zero (promoted at 64 keys), waited for.
template <int N>
__device__ __forceinline__ void dq_product(float (&qa)[N / 2], float (&qb)[N / 2], const uint8_t* ds,
                                           const uint8_t* kt) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < QTile::kSteps; ++kk) {
    if (kk < QTile::kSteps / 2) {
      WgmmaE4M3<N>::ss(qa, QTile::desc(ds, kk), QTile::desc(kt, kk), kk > 0);
    } else {
      WgmmaE4M3<N>::ss(qb, QTile::desc(ds, kk), QTile::desc(kt, kk), kk > QTile::kSteps / 2);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(qa);
  fence_operands(qb);
}
// Their FP32 sum into DqSmem::dq, four registers a float4, at dq_order(first + i, t) (t: the thread in its warpgroup).
template <int N>
__device__ __forceinline__ void store_dq_sum(float* dq, int first, int t, const float (&qa)[N / 2],
                                             const float (&qb)[N / 2]) {
#pragma unroll
  for (int i = 0; i < N / 8; ++i) {
    *reinterpret_cast<float4*>(dq + dq_order(first + i, t)) =
        make_float4(__fadd_rn(qa[4 * i], qb[4 * i]), __fadd_rn(qa[4 * i + 1], qb[4 * i + 1]),
                    __fadd_rn(qa[4 * i + 2], qb[4 * i + 2]), __fadd_rn(qa[4 * i + 3], qb[4 * i + 3]));
  }
}

// With DQ, `ring` and `j0` (the stages and tiles walked before this key block) go on across a persistent CTA's key
// blocks: K̂ and V̂ are those of kv_full's phase `kv_phase`, where `kv_empty` is set each warp arrives on it once the
// key block's last product has read them, and `where` gives the block again for the epilogue.
// SPLIT: the promotion through 32 registers, not 64 — 2: each product in two 64-channel halves, each waited for and
// added in turn (issue_channel_part<64>); 4: in four 32-channel quarters through two 16-register temporaries, the next
// quarter's product issued before this one's add (one group in flight while the other is added);
// DQ_GROUP (with DQ and SPLIT): dQ's product is the dQ warpgroup's (dq_group), the consumers only write dŜ for it.
// TMA_OUT (with DQ_GROUP): the epilogue stores dV, then dK through this half's K̂ and V̂ buffers, free once its last
// product has read them, by two tensor stores each (store_rows_tma, the maps `out`); not for the persistent form, whose
// producer refills those buffers with the next block's.
template <bool PROMOTE, bool PIPELINED, int STAGES, bool DQ, bool EXCHANGE = false, typename Where = SameBlock,
          bool FOLDED = false, int SPLIT = 0, bool DQ_GROUP = false, bool TMA_OUT = false, int D = kHeadDim>
__device__ __forceinline__ void consume(Smem<STAGES, D>& s, const DkdvFactoredParams& p, int half, int b, int h_kv,
                                        int start_n, Ring<STAGES>& ring, uint32_t& j0, uint32_t kv_phase = 0,
                                        uint64_t* kv_empty = nullptr, Where where = {}, const Maps* out = nullptr) {
  static_assert(!TMA_OUT || DQ_GROUP, "the TMA epilogue is built into the dQ warpgroup's form");
  static_assert(SPLIT == 0 || SPLIT == 2 || SPLIT == 4, "the promotion whole, in halves or in quarters");
  // at D = 128 the dQ warpgroup's registers come from the split promotion; at D = 64 the whole one takes 32
  static_assert(!DQ_GROUP || (DQ && (SPLIT || D < kHeadDim)), "the dQ warpgroup needs the split promotion at D = 128");
  static_assert(D == kHeadDim || ((!DQ || DQ_GROUP) && SPLIT == 0),
                "D = 64 is built without dQ or with the dQ warpgroup, its promotion whole");
  const bool releaser = threadIdx.x % 32 == 0;
  const int diag = diag_bits();  // 0 but in the DM_DQ_CLOCK build
  auto diag_skips = [&](int bit) { return (diag & bit) != 0; };
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
      ds_tile<true, true, FOLDED>(st, dpt, s.lse[t.stage], s.delta[t.stage], s.irs[t.stage], sc.row, sc.dp, true,
                                  start_n, t.start, p.n, p.causal);
    } else {
      ds_tile<true, true, FOLDED>(st, dpt, s.lse[t.stage], s.delta[t.stage], s.irs[t.stage], sc.row, sc.dp, false,
                                  start_n, t.start, p.n, p.causal);
    }
  };
  auto new_head = [&](float (&dv)[D / 2], float (&dk)[D / 2], int64_t prev, int64_t next) {
    rescale_channels(dv, p.sdoc + prev * D, p.sdoc + next * D);
    rescale_channels(dk, p.sqc + prev * D, p.sqc + next * D);
  };

  // Sᵀ and dP̂ᵀ of tile t, waited for, then formed (form) with its scales `sc`
  auto s_dp_formed = [&](const Tile& t, Scales sc, float (&st)[kBlockM / 2], float (&dpt)[kBlockM / 2]) {
    issue_s_dp<D>(st, dpt, k, v, s.q[t.stage], s.dout[t.stage]);
    wgmma_wait<0>();
    fence_operands(st);
    fence_operands(dpt);
    form(t, sc, st, dpt);
  };
  // Promoted: tile t's dV, then dK product through the temporary `part`, each added in FP32; the stage released
  auto promoted_products = [&](const Tile& t, float (&dv)[D / 2], float (&dk)[D / 2],
                               float (&part)[D / 2], uint32_t (&pfrag)[kTileSteps][4],
                               uint32_t (&dsfrag)[kTileSteps][4]) {
    if constexpr (SPLIT == 2) {
      float(&h)[D / 4] = reinterpret_cast<float(&)[D / 4]>(part);  // the first 32 registers only
      if (!diag_skips(1)) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          issue_channel_part<64>(h, pfrag, s.dot[t.stage], c);
          wgmma_wait<0>();
          finish_part<64>(dv, h, c);
        }
      }
      if (diag_skips(2)) {
        if (releaser) mbar_arrive(&s.empty[t.stage]);
        return;
      }
      issue_channel_part<64>(h, dsfrag, s.qt[t.stage], 0);
      wgmma_wait<0>();
      finish_part<64>(dk, h, 0);
      issue_channel_part<64>(h, dsfrag, s.qt[t.stage], 1);
      wgmma_wait<0>();
      if (releaser) mbar_arrive(&s.empty[t.stage]);
      finish_part<64>(dk, h, 1);
    } else if constexpr (SPLIT == 4) {
      // quarters i = 0..7: dV's 0-3, then dK's 0-3, quarter i into buffer i % 2 (the first 32 registers of part)
      float(&pa)[D / 8] = reinterpret_cast<float(&)[D / 8]>(part[0]);
      float(&pb)[D / 8] = reinterpret_cast<float(&)[D / 8]>(part[D / 8]);
      auto issue = [&](float(&buf)[D / 8], int i) {
        if (i < 4) {
          issue_channel_part<32>(buf, pfrag, s.dot[t.stage], i);
        } else {
          issue_channel_part<32>(buf, dsfrag, s.qt[t.stage], i - 4);
        }
      };
      auto finish = [&](float(&buf)[D / 8], int i) {
        if (i < 4) {
          finish_part<32>(dv, buf, i);
        } else {
          finish_part<32>(dk, buf, i - 4);
        }
      };
      issue(pa, 0);
      issue(pb, 1);
#pragma unroll
      for (int i = 0; i < 6; i += 2) {
        wgmma_wait<1>();
        finish(pa, i);
        issue(pa, i + 2);
        wgmma_wait<1>();
        finish(pb, i + 1);
        issue(pb, i + 3);
      }
      wgmma_wait<1>();
      finish(pa, 6);
      wgmma_wait<0>();
      if (releaser) mbar_arrive(&s.empty[t.stage]);
      finish(pb, 7);
    } else {
      issue_channel_product<true>(dv, part, pfrag, s.dot[t.stage]);
      wgmma_wait<0>();
      finish_acc<true>(dv, part);
      issue_channel_product<true>(dk, part, dsfrag, s.qt[t.stage]);
      wgmma_wait<0>();
      if (releaser) mbar_arrive(&s.empty[t.stage]);
      finish_acc<true>(dk, part);
    }
  };

  auto epilogue = [&](const float (&dv)[D / 2], const float (&dk)[D / 2], int64_t bh, KvBlock at) {
    const float* sdoc = p.sdoc + bh * D;
    const float* sqc = p.sqc + bh * D;
    const float scale = p.softmax_scale;
    // both finished before either is stored: the loads of both tensors' channel scales overlap (store_rows)
    float yv[D / 2], yk[D / 2];
    finish_rows(dv, [&](float x, int, int col) { return __fmul_rn(x, __fmul_rn(sdoc[col], 1.0f / 448.0f)); }, yv);
    finish_rows(dk, [&](float x, int, int col) { return __fmul_rn(__fmul_rn(x, sqc[col]), scale); }, yk);
    if constexpr (TMA_OUT) {
      uint8_t* const box0 = s.k[half];
      uint8_t* const box1 = s.v[half];
      group_sync(half);  // every warp of this half is past its last product, which read box0 and box1
      store_rows_tma<D>(yv, p.out_fp16, box0, box1, &out->dv, at.b, at.h_kv, at.start_n, half);
      group_sync(half);  // dV's boxes have been read (the issuer waited)
      store_rows_tma<D>(yk, p.out_fp16, box0, box1, &out->dk, at.b, at.h_kv, at.start_n, half);
      return;
    }
    store_finished_pairs(yv, p.dv, p.out_fp16, p.stride_b, p.stride_n, p.stride_h, at.b, at.h_kv, at.start_n, p.n);
    store_finished_pairs(yk, p.dk, p.out_fp16, p.stride_b, p.stride_n, p.stride_h, at.b, at.h_kv, at.start_n, p.n);
  };

  if constexpr (DQ) {
    static_assert(PROMOTE && !PIPELINED, "dQ is built into the promoted form, each tile in turn");
    DqSmem<D>& x = dq_smem(s);
    const int t_in_group = threadIdx.x % kThreads;
    const uint8_t* kt = x.kt + half * (D / 2) * kCtaRows;  // this half's 64 channels x 128 keys
    mbar_wait(&s.kv_full, kv_phase);
    float dv[D / 2] = {}, dk[D / 2] = {};
    int64_t head = -1;
    Tile t;
    bool use;
    unsigned empty_clk = 0, peer_clk = 0, stage_clk = 0;  // DqClock's counts
    const auto loop_start = DqClock::now();
    uint32_t j = j0;
    for (;; ++j) {
      const auto c = DqClock::now();
      if (!ring.next(s.info, s.full, half, t, use)) break;
      stage_clk += unsigned(DqClock::now() - c);
      const int buf = j % 2;
      const uint32_t turn = (j / 2) & 1;  // ds[buf]'s phase for tile j
      uint8_t* ds = x.ds[buf];
      if constexpr (DQ_GROUP) {  // the dQ warpgroup is done with tile j - 2's dŜ (DqClock: peer_clk counts the wait)
        const auto c2 = DqClock::now();
        if (j >= 2) mbar_wait(&x.ds_empty[buf], turn ^ 1);
        peer_clk += unsigned(DqClock::now() - c2);
      } else if (j >= 2) {
        mbar_wait(&x.ds_empty[buf], turn ^ 1);  // both consumers are done with tile j - 2's dŜ
      }
      uint32_t pfrag[kTileSteps][4], dsfrag[kTileSteps][4];
      if (use) {
        const Scales sc = scales_of(t);
        if (head >= 0 && t.bh != head) new_head(dv, dk, head, t.bh);
        head = t.bh;
        float st[kBlockM / 2], dpt[kBlockM / 2];
        s_dp_formed(t, sc, st, dpt);
        to_fragments<true>(st, pfrag);
        if constexpr (EXCHANGE) {
          to_fragments_exchanged(dpt, dsfrag, ds, kBlockN * half);
        } else {
          to_fragments_transposed(dpt, dsfrag, ds, kBlockN * half);
        }
      } else {
        zero_ds_half(ds, half);
      }
      fence_async_shared();
      mbar_arrive(&x.ds_full[buf]);
      if (use) {
        float part[D / 2];
        promoted_products(t, dv, dk, part, pfrag, dsfrag);
      } else if (releaser) {
        mbar_arrive(&s.empty[t.stage]);
      }
      if constexpr (DQ_GROUP) continue;  // the dQ warpgroup's product
      auto c0 = DqClock::now();
      mbar_wait(&x.ds_full[buf], turn);  // the other half's dŜ of tile j
      peer_clk += unsigned(DqClock::now() - c0);
      float qa[kBlockN / 2], qb[kBlockN / 2];  // channels 64h.. over keys 0-63 and 64-127
      dq_product<kBlockN>(qa, qb, ds, kt);
      mbar_arrive(&x.ds_empty[buf]);
      auto c1 = DqClock::now();
      if (j >= 1) mbar_wait(&x.dq_empty[(j - 1) & 1], ((j - 1) >> 1) & 1);  // tile j - 1's product was read
      empty_clk += unsigned(DqClock::now() - c1);
      store_dq_sum<kBlockN>(x.dq, (kBlockN / 8) * half, t_in_group, qa, qb);
      fence_async_shared();
      mbar_arrive(&x.dq_full[j & 1]);
    }
    j0 = j;
    if (kv_empty && releaser) mbar_arrive(kv_empty);
    if (t_in_group == 0) {
      DqClock::put(kEmptyClk0 + half, empty_clk);
      DqClock::put(kPeerClk0 + half, peer_clk);
      DqClock::put(kStageClk0 + half, stage_clk);
      DqClock::put(kLoopClk0 + half, DqClock::now() - loop_start);
    }
    if (t_in_group == 0) DqClock::put(kEpilogueNs, DqClock::ns(), half);
    if (head >= 0) epilogue(dv, dk, head, where(b, h_kv, start_n));  // else no key of this half below N
    if (t_in_group == 0) DqClock::put(kExitNs, DqClock::ns(), half);
    return;
  }

  Tile cur;
  if (!take(cur)) return;  // no key of this half below N
  mbar_wait(&s.kv_full, 0);
  float dv[D / 2] = {}, dk[D / 2] = {};  // [64 keys, D]; in units of the current head's channel scales
  uint32_t pfrag[kTileSteps][4], dsfrag[kTileSteps][4];

  static_assert(!(PROMOTE && PIPELINED), "no registers for the next tile's Sᵀ and dP̂ᵀ beside the promotion's");
  if constexpr (!PIPELINED) {
    float part[PROMOTE ? D / 2 : 1];  // one tile's dV, then dK product (PROMOTE)
    int64_t head = cur.bh;
    Tile t = cur;
    do {
      const Scales sc = scales_of(t);
      if (t.bh != head) new_head(dv, dk, head, t.bh), head = t.bh;
      {
        float st[kBlockM / 2], dpt[kBlockM / 2];
        s_dp_formed(t, sc, st, dpt);
        to_fragments<true>(st, pfrag);
        to_fragments<true>(dpt, dsfrag);
      }
      if constexpr (PROMOTE) {
        promoted_products(t, dv, dk, part, pfrag, dsfrag);
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
      issue_s_dp<D>(st, dpt, k, v, s.q[cur.stage], s.dout[cur.stage]);
      wgmma_wait<0>();
      fence_operands(st);
      fence_operands(dpt);
      form(cur, sc, st, dpt);
      to_fragments<true>(st, pfrag);
      to_fragments<true>(dpt, dsfrag);
    }
    Tile next;
#pragma unroll 1
    while (take(next)) {
      const Scales sc = scales_of(next);
      float st[kBlockM / 2], dpt[kBlockM / 2];
      issue_s_dp<D>(st, dpt, k, v, s.q[next.stage], s.dout[next.stage]);
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
      to_fragments<true>(st, pfrag);
      to_fragments<true>(dpt, dsfrag);
      cur = next;
    }
    issue_channel_product<false>(dv, dv, pfrag, s.dot[cur.stage]);
    issue_channel_product<false>(dk, dk, dsfrag, s.qt[cur.stage]);
    wgmma_wait<0>();
    fence_operands(dv);
    fence_operands(dk);
  }
  epilogue(dv, dk, cur.bh, KvBlock{b, h_kv, start_n});
}

// The dQ warpgroup (`ws3xfd`): dQ's product of every tile the CTA walks, in the consumers' stead. Per tile j: wait for
// both consumers' dŜ (ds_full[j % 2]), then for each 32-channel chunk c the product over the 128 keys as two 64-key
// halves from zero (SS m64n32k32 over K̂ᶜᵀ's rows 32c ..), added in FP32 — each element the sum the consumers' m64n64
// halves form — and stored where the consumers' values go (dq_order(4c + i, t): the same layout, one float4 per four
// registers); dŜ is released (ds_empty, 128 arrivals) after the last chunk's products, dq_full
// (128 arrivals) after the stores. The walk is the producer's (its tile count); K̂ᶜᵀ arrives with kv_full. Registers:
// at 56 (consumers at 216) ptxas serialised every wgmma of the kernel (C7512), at 64 or more with the consumers at 208
// it spills nothing.
constexpr int kDqChunk = 32;  // channels a product of the dQ warpgroup
template <int STAGES, int D, typename Sched>
__device__ __forceinline__ void dq_group(Smem<STAGES, D>& s, Walk<STAGES, Sched> w) {
  DqSmem<D>& x = dq_smem(s);
  const int t = threadIdx.x % kThreads;
  constexpr int kChunks = D / kDqChunk;
  mbar_wait(&s.kv_full, 0);
  unsigned full_clk = 0, empty_clk = 0;  // DqClock's counts
  const auto loop_start = DqClock::now();
  for (uint32_t j = 0; !w.done(); ++j, w.advance()) {
    const int buf = j % 2;
    const auto c0 = DqClock::now();
    mbar_wait(&x.ds_full[buf], (j / 2) & 1);
    full_clk += unsigned(DqClock::now() - c0);
    const uint8_t* ds = x.ds[buf];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const uint8_t* kt = x.kt + c * kDqChunk * kCtaRows;  // channels kDqChunk·c .. over the 128 keys
      float qa[kDqChunk / 2], qb[kDqChunk / 2];  // keys 0-63 and 64-127
      dq_product<kDqChunk>(qa, qb, ds, kt);
      if (c == kChunks - 1) mbar_arrive(&x.ds_empty[buf]);  // every product of this tile has read its dŜ
      if (c == 0 && j >= 1) {  // tile j - 1's product was read
        const auto c1 = DqClock::now();
        mbar_wait(&x.dq_empty[(j - 1) & 1], ((j - 1) >> 1) & 1);
        empty_clk += unsigned(DqClock::now() - c1);
      }
      store_dq_sum<kDqChunk>(x.dq, (kDqChunk / 8) * c, t, qa, qb);
    }
    fence_async_shared();
    mbar_arrive(&x.dq_full[j & 1]);
  }
  if (t == 0) {
    DqClock::put(kPeerClk0, full_clk, 1);
    DqClock::put(kEmptyClk0, empty_clk, 1);
    DqClock::put(kLoopClk0, DqClock::now() - loop_start, 1);
  }
}

template <bool PROMOTE, bool PIPELINED, int STAGES, bool DQ, bool ORDERED = false, bool EXCHANGE = false,
          bool FOLDED = false, int SPLIT = 0, bool DQ_GROUP = false, bool TMA_OUT = false, int D = kHeadDim>
__device__ __forceinline__ void dkdv_block(uint8_t* raw, const DkdvFactoredParams& p, const Maps& maps) {
  static_assert(DQ || !ORDERED, "the order is that of the adds into dQ");
  static_assert(DQ || !EXCHANGE, "the exchange writes the dŜ tile of dQ's product");
  using Sched = std::conditional_t<ORDERED, IncreasingSchedule, Schedule>;
  // the arrivals dŜ's release and dQ's product count: the dQ warpgroup's threads, or both consumers'
  constexpr int kDqArrivals = DQ_GROUP ? kThreads : kConsumers * kThreads;
  Smem<STAGES, D>& s = aligned_smem<Smem<STAGES, D>>(raw);
  auto coords = [&] { return ORDERED ? cta_coords(p) : CtaCoords{blockIdx.x, blockIdx.y}; };
  if (threadIdx.x == 0) {
    DqClock::put(kCtaNs, DqClock::ns());
    const CtaCoords cta = coords();
    init_stage_barriers<STAGES>(s.full, s.empty, &s.kv_full, kConsumers * kThreads / 32);
    const int row = int(int64_t(cta.bh_kv) * p.n_pad + cta.block * kCtaRows);
    mbar_arrive_expect_tx(&s.kv_full, (DQ ? 3 : 2) * kCtaRows * D);
#pragma unroll
    for (int i = 0; i < kConsumers; ++i) {
      tma_load_2d(s.k[i], &maps.k, 0, row + kBlockN * i, &s.kv_full);
      tma_load_2d(s.v[i], &maps.v, 0, row + kBlockN * i, &s.kv_full);
    }
    if constexpr (DQ) {
      DqSmem<D>& x = dq_smem(s);
      for (int i = 0; i < 2; ++i) {
        mbar_init(&x.ds_full[i], kConsumers * kThreads);
        mbar_init(&x.ds_empty[i], kDqArrivals);
      }
      for (int i = 0; i < 2; ++i) {
        mbar_init(&x.dq_full[i], kDqArrivals);
        mbar_init(&x.dq_empty[i], 1);
      }
      fence_mbar_init();
      tma_load_2d(x.kt, &maps.kt, cta.block * kCtaRows, cta.bh_kv * D, &s.kv_full);
    }
  }
  __syncthreads();  // the barriers are initialised; no block-wide barrier after this point
  // what each role needs (coords() too) is computed after the register split: a value live across it would be spilled
  const int role = warpgroup_role();  // 0: producer; 1, 2: the consumer of keys start_n + 64 (role − 1) ..; 3: dQ
  if constexpr (DQ_GROUP) {
    if (role == kConsumers + 1) {
      release_registers<kDqGroupRegs>();
      // the producer's walk, for its tile count (written out as the producer's is: one lambda for both re-named the
      // uniform registers of every other form's consumer loop)
      const CtaCoords cta = coords();
      const int group = p.h / p.h_kv, b = cta.bh_kv / p.h_kv, h_kv = cta.bh_kv % p.h_kv;
      const int start_n = cta.block * kCtaRows;
      Sched second(start_n + kBlockN, p.n, p.causal);
      if (start_n + kBlockN >= p.n) second.tiles = 0;
      dq_group(s, Walk<STAGES, Sched>(Sched(start_n, p.n, p.causal), second,
                                      int64_t(b) * p.h + int64_t(h_kv) * group, group));
      return;
    }
  }
  if (role == 0) {
    release_registers<kProducerRegs>();
    // the loads' issuer; the two reducers, a thread of each of two other warps
    if (threadIdx.x == 0 || (DQ && (threadIdx.x == 32 || threadIdx.x == 64))) {
      const CtaCoords cta = coords();
      const int group = p.h / p.h_kv, b = cta.bh_kv / p.h_kv, h_kv = cta.bh_kv % p.h_kv;
      const int64_t bh0 = int64_t(b) * p.h + int64_t(h_kv) * group;
      const int start_n = cta.block * kCtaRows;
      Sched second(start_n + kBlockN, p.n, p.causal);
      if (start_n + kBlockN >= p.n) second.tiles = 0;  // no key of the second half exists
      const Walk<STAGES, Sched> walk(Sched(start_n, p.n, p.causal), second, bh0, group);
      if constexpr (DQ) {
        if (threadIdx.x != 0) {
          reduce_dq<ORDERED>(dq_smem(s), p, walk, cta.block, threadIdx.x / 32 - 1);
          return;
        }
      }
      produce(s, p, maps, walk);
    }
    return;
  }
  claim_registers<DQ_GROUP ? kDqGroupConsumerRegs : kConsumerRegs>();
  const CtaCoords cta = coords();
  Ring<STAGES> ring;
  uint32_t j0 = 0;
  consume<PROMOTE, PIPELINED, STAGES, DQ, EXCHANGE, SameBlock, FOLDED, SPLIT, DQ_GROUP, TMA_OUT>(
      s, p, role - 1, cta.bh_kv / p.h_kv, cta.bh_kv % p.h_kv, cta.block * kCtaRows + kBlockN * (role - 1), ring, j0,
      0, nullptr, {}, &maps);
}

// ws3xp: ws3x ordered, persistent (FlashAttention-3's persistent tile scheduler, as the δ pass's w4pd). One CTA an SM;
// its producer thread takes key blocks from `taken` (zeroed before the launch), each the linear index of tile_from_last
// in the ordered launch's order (the shortest first, kv heads interleaved by dq_section_heads), the next one once it
// has issued the last one's loads (the consumers still have up to three tiles of it to run): taken a block earlier, as
// w4pd takes its tiles, a block would wait for a whole block of its CTA before it starts, and the blocks taken after it
// that add into the same query tiles with it (15.5 ms against ws3x's 4.1 on the H200, session 27). For each block: its
// index into the item ring (item_full, item_empty: two slots, read by the consumer warps and the reducers), then, once
// the consumers are done with the last block's K̂, V̂ and K̂ᶜᵀ (kv_empty), this block's (kv_full, one phase a block),
// then its query tiles into the ring, whose stages and phases run on across the blocks as the dŜ and dQ buffers' turns
// do; past the last block it puts −1 into the item ring. So a block's K̂, V̂ and first tiles load while the last
// block's dK and dV are scaled and stored and its last adds land, and no CTA launch falls between blocks. Every block
// is taken from the counter, the first one too: a block's adds wait only for blocks taken before it, each held by a CTA
// that runs (however few of the grid's CTAs are resident), so no wait can deadlock. The dQ adds and dK, dV are ws3x's
// ordered bits.
template <int STAGES>
__device__ __forceinline__ void dkdv_persistent(uint8_t* raw, const DkdvFactoredParams& p, const Maps& maps,
                                                int* taken) {
  using Sched = IncreasingSchedule;
  Smem<STAGES>& s = aligned_smem<Smem<STAGES>>(raw);
  DqSmem<>& x = dq_smem(s);
  constexpr int kConsumerWarps = kConsumers * kThreads / 32;
  if (threadIdx.x == 0) {
    init_stage_barriers<STAGES>(s.full, s.empty, &s.kv_full, kConsumerWarps);
    mbar_init(&s.kv_empty, kConsumerWarps);
    for (int i = 0; i < 2; ++i) {
      mbar_init(&s.item_full[i], 1);
      mbar_init(&s.item_empty[i], kConsumerWarps + 2);
      mbar_init(&x.ds_full[i], kConsumers * kThreads);
      mbar_init(&x.ds_empty[i], kConsumers * kThreads);
      mbar_init(&x.dq_full[i], kConsumers * kThreads);
      mbar_init(&x.dq_empty[i], 1);
    }
    fence_mbar_init();
  }
  __syncthreads();  // the barriers are initialised; no block-wide barrier after this point
  // the key block of item slot `it` % 2, once filled: its linear index, or −1 (none left)
  auto item = [&](uint32_t it) {
    mbar_wait(&s.item_full[it & 1], (it >> 1) & 1);
    return *reinterpret_cast<volatile int*>(&s.item[it & 1]);
  };
  // the key block and kv head of linear index `linear`, computed where a role uses them (after the register split:
  // a value live across it would be spilled)
  auto block_of = [&](unsigned linear) {
    const unsigned blocks = unsigned(p.n + kCtaRows - 1) / kCtaRows, heads = unsigned(p.b * p.h_kv);
    return tile_from_last(linear, blocks, heads, unsigned(p.dq_section_heads));
  };
  auto walk_of = [&](unsigned linear, unsigned& block, int64_t& bh_kv) {
    const CtaTile t = block_of(linear);
    block = t.block;
    bh_kv = t.bh;
    const int group = p.h / p.h_kv, b = int(t.bh) / p.h_kv, h_kv = int(t.bh) % p.h_kv;
    const int start_n = int(t.block) * kCtaRows;
    Sched second(start_n + kBlockN, p.n, p.causal);
    if (start_n + kBlockN >= p.n) second.tiles = 0;  // no key of the second half exists
    return Walk<STAGES, Sched>(Sched(start_n, p.n, p.causal), second, int64_t(b) * p.h + int64_t(h_kv) * group,
                               group);
  };
  const int role = warpgroup_role();  // 0: producer; 1, 2: the consumer of keys start_n + 64 (role − 1) ..
  if (role == 0) {
    release_registers<kProducerRegs>();
    // Warps 0 (the loads' issuer), 1 and 2 (the reducers) run the loop over blocks whole, their lane 0 the work, so
    // that each block's index is warp-uniform (a shuffle from lane 0), as ws3x's blockIdx is: 96 bytes of spills at
    // 24 registers where a value of lane 0's alone took 112 (the walk's state still does not fit).
    const int warp = threadIdx.x / 32;
    const bool lead = threadIdx.x % 32 == 0;
    if (warp == 0) {
      uint32_t j0 = 0;
      auto take = [&] { return __shfl_sync(0xffffffffu, lead ? unsigned(atomicAdd(taken, 1)) : 0u, 0); };
      unsigned linear = take();
      for (uint32_t it = 0;; ++it) {
        const bool more = linear < unsigned((p.n + kCtaRows - 1) / kCtaRows) * unsigned(p.b * p.h_kv);
        if (lead) {
          if (it >= 2) mbar_wait(&s.item_empty[it & 1], ((it >> 1) & 1) ^ 1);
          s.item[it & 1] = more ? int(linear) : -1;
          mbar_arrive(&s.item_full[it & 1]);
        }
        if (!more) break;
        unsigned block;
        int64_t bh_kv;
        const Walk<STAGES, Sched> walk = walk_of(linear, block, bh_kv);
        if (lead) {
          const int row = int(bh_kv * p.n_pad + block * kCtaRows);
          if (it > 0) mbar_wait(&s.kv_empty, (it - 1) & 1);
          mbar_arrive_expect_tx(&s.kv_full, 3 * kCtaRows * kHeadDim);
#pragma unroll
          for (int i = 0; i < kConsumers; ++i) {
            tma_load_2d(s.k[i], &maps.k, 0, row + kBlockN * i, &s.kv_full);
            tma_load_2d(s.v[i], &maps.v, 0, row + kBlockN * i, &s.kv_full);
          }
          tma_load_2d(x.kt, &maps.kt, int(block * kCtaRows), int(bh_kv * kHeadDim), &s.kv_full);
          j0 = produce(s, p, maps, walk, j0);
        }
        __syncwarp();
        linear = take();  // not before: blocks taken after it may wait for this one's adds
      }
    } else if (warp == 1 || warp == 2) {  // the two reducers
      const int r = warp - 1;
      uint32_t j0 = 0;
      for (uint32_t it = 0;; ++it) {
        const int linear = __shfl_sync(0xffffffffu, item(it), 0);
        if (lead) mbar_arrive(&s.item_empty[it & 1]);
        if (linear < 0) break;
        unsigned block;
        int64_t bh_kv;
        const Walk<STAGES, Sched> walk = walk_of(unsigned(linear), block, bh_kv);
        if (lead) j0 = reduce_dq<true>(x, p, walk, int(block), r, j0, false, linear);
        __syncwarp();
      }
      if (lead) bulk_wait<0>();
    }
    return;
  }
  claim_registers<kConsumerRegs>();
  const bool releaser = threadIdx.x % 32 == 0;
  Ring<STAGES> ring;
  uint32_t j0 = 0;
  // the blocks this thread has taken, kept in local memory: one load and store a block, where a register live through
  // the tile loop cost 15 of the accumulators' registers spilled inside it (the SASS)
  volatile uint32_t taken_here = 0;
  for (;;) {
    const uint32_t it = taken_here;
    taken_here = it + 1;
    const int linear = item(it);
    if (linear < 0) break;
    const int half = role - 1;
    const CtaTile t = block_of(unsigned(linear));
    // the epilogue's block from the item slot again, which the producer refills only after this warp's arrival below
    auto where = [&](int, int, int) {
      const CtaTile again = block_of(unsigned(*reinterpret_cast<volatile int*>(&s.item[(taken_here - 1) & 1])));
      return KvBlock{int(again.bh) / p.h_kv, int(again.bh) % p.h_kv, int(again.block) * kCtaRows + kBlockN * half};
    };
    ring.done = false;
    consume<true, false, STAGES, true, true>(s, p, half, int(t.bh) / p.h_kv, int(t.bh) % p.h_kv,
                                             int(t.block) * kCtaRows + kBlockN * half, ring, j0, it & 1,
                                             &s.kv_empty, where);
    __syncwarp();
    if (releaser) mbar_arrive(&s.item_empty[it & 1]);
  }
}

}  // namespace dkdv
}  // namespace dm

#define DM_DKDV_KERNEL_FORM(NAME, THREADS, PROMOTE, PIPELINED, STAGES, DQ, ORDERED, EXCHANGE, FOLDED, SPLIT, GROUP, \
                            TMA_OUT)                                                                                 \
  extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                          \
      NAME(const DkdvFactoredParams p, const __grid_constant__ dm::dkdv::Maps maps) {                               \
    extern __shared__ uint8_t smem[];                                                                             \
    dm::dkdv::dkdv_block<PROMOTE, PIPELINED, STAGES, DQ, ORDERED, EXCHANGE, FOLDED, SPLIT, GROUP, TMA_OUT>(smem, p,  \
                                                                                                        maps);     \
  }
#define DM_DKDV_KERNEL(NAME, PROMOTE, PIPELINED, STAGES, DQ, ORDERED, EXCHANGE, FOLDED) \
  DM_DKDV_KERNEL_FORM(NAME, dm::factored::kCtaThreads, PROMOTE, PIPELINED, STAGES, DQ, ORDERED, EXCHANGE, FOLDED, 0, \
                      false, false)
// wsN: N stages; unpromoted, the next tile's Sᵀ and dP̂ᵀ are issued with this tile's dV and dK (PIPELINED).
// ws3s: unpromoted without that overlap, each consumer's tile in turn (as promoted runs).
DM_DKDV_KERNEL(dm_dkdv_factored_ws3_promoted, true, false, 3, false, false, false, false)
DM_DKDV_KERNEL(dm_dkdv_factored_ws3_unpromoted, false, true, 3, false, false, false, false)
DM_DKDV_KERNEL(dm_dkdv_factored_ws4_promoted, true, false, 4, false, false, false, false)
DM_DKDV_KERNEL(dm_dkdv_factored_ws4_unpromoted, false, true, 4, false, false, false, false)
DM_DKDV_KERNEL(dm_dkdv_factored_ws3s_unpromoted, false, false, 3, false, false, false, false)
// D = 64: rows of 64 codes (Q̂, K̂, V̂, dÔ in the 64-byte swizzle, two k = 32 steps of Sᵀ and dP̂ᵀ), dV and dK
// [64 keys, 64 channels] by m64n64k32 into 32 accumulators a thread; without dQ (Triton's dQ launch forms it)
#define DM_DKDV_D64_KERNEL(NAME, PROMOTE, PIPELINED, STAGES)                                                 \
  extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)                                 \
      NAME(const DkdvFactoredParams p, const __grid_constant__ dm::dkdv::Maps maps) {                        \
    extern __shared__ uint8_t smem[];                                                                      \
    dm::dkdv::dkdv_block<PROMOTE, PIPELINED, STAGES, false, false, false, false, 0, false, false, 64>(smem, p, \
                                                                                                 maps);    \
  }
DM_DKDV_D64_KERNEL(dm_dkdv_factored_ws3_promoted_d64, true, false, 3)
DM_DKDV_D64_KERNEL(dm_dkdv_factored_ws3_unpromoted_d64, false, true, 3)
DM_DKDV_D64_KERNEL(dm_dkdv_factored_ws4_promoted_d64, true, false, 4)
DM_DKDV_D64_KERNEL(dm_dkdv_factored_ws4_unpromoted_d64, false, true, 4)
#undef DM_DKDV_D64_KERNEL
// D = 64 with dQ: ws3xfd's form (the dQ warpgroup, 448 folded, the dŜ tile by lane exchange; promoted, 3 stages), its
// promotion whole (32 registers at D = 64), dK and dV stored directly; dQ's product in two 32-channel chunks.
// ws3xfdt at D = 64: dK and dV through this half's K̂ and V̂ buffers (4 KB each) as two 32-row boxes, by the TMA
#define DM_DKDV_D64_DQ_KERNEL(NAME, ORDERED, TMA_OUT)                                                           \
  extern "C" __global__ void __launch_bounds__(dm::factored::kDqGroupThreads, 1)                              \
      NAME(const DkdvFactoredParams p, const __grid_constant__ dm::dkdv::Maps maps) {                         \
    extern __shared__ uint8_t smem[];                                                                       \
    dm::dkdv::dkdv_block<true, false, 3, true, ORDERED, true, true, 0, true, TMA_OUT, 64>(smem, p, maps);   \
  }
DM_DKDV_D64_DQ_KERNEL(dm_dkdv_factored_ws3xfd_promoted_dq_d64, false, false)
DM_DKDV_D64_DQ_KERNEL(dm_dkdv_factored_ws3xfd_promoted_dq_ordered_d64, true, false)
DM_DKDV_D64_DQ_KERNEL(dm_dkdv_factored_ws3xfdt_promoted_dq_d64, false, true)
DM_DKDV_D64_DQ_KERNEL(dm_dkdv_factored_ws3xfdt_promoted_dq_ordered_d64, true, true)
#undef DM_DKDV_D64_DQ_KERNEL
// with dQ (promoted, 3 stages: with 4 its 64 KB of DqSmem would not fit), its adds in any order or ordered; ws3x:
// the dŜ tile written by lane exchange (to_fragments_exchanged), the same bits
DM_DKDV_KERNEL(dm_dkdv_factored_ws3_promoted_dq, true, false, 3, true, false, false, false)
DM_DKDV_KERNEL(dm_dkdv_factored_ws3_promoted_dq_ordered, true, false, 3, true, true, false, false)
DM_DKDV_KERNEL(dm_dkdv_factored_ws3x_promoted_dq, true, false, 3, true, false, true, false)
DM_DKDV_KERNEL(dm_dkdv_factored_ws3x_promoted_dq_ordered, true, false, 3, true, true, true, false)
// ws3xf: ws3x with 448 folded into the row terms the host passes (ds_tile's FOLDED): one FMUL an element fewer
DM_DKDV_KERNEL(dm_dkdv_factored_ws3xf_promoted_dq, true, false, 3, true, false, true, true)
DM_DKDV_KERNEL(dm_dkdv_factored_ws3xf_promoted_dq_ordered, true, false, 3, true, true, true, true)
// ws3xfs: ws3xf with its promotion split into 64-channel halves (a 32-register temporary: four waits a tile, not two);
// ws3xfd: ws3xfs with dQ's product in a fourth warpgroup (dq_group), the consumers at 208 registers, it at 72;
// ws3xfdp: ws3xfd with the promotion in quarters, one in flight while the last is added (SPLIT 4);
// ws3xfdt: ws3xfd with its epilogue through shared memory and tensor stores (TMA_OUT)
#define DM_DKDV_SPLIT_KERNELS(NAME, THREADS, SPLIT, GROUP, TMA_OUT)                                                    \
  DM_DKDV_KERNEL_FORM(NAME##_promoted_dq, THREADS, true, false, 3, true, false, true, true, SPLIT, GROUP, TMA_OUT)   \
  DM_DKDV_KERNEL_FORM(NAME##_promoted_dq_ordered, THREADS, true, false, 3, true, true, true, true, SPLIT, GROUP,     \
                      TMA_OUT)
DM_DKDV_SPLIT_KERNELS(dm_dkdv_factored_ws3xfs, dm::factored::kCtaThreads, 2, false, false)
DM_DKDV_SPLIT_KERNELS(dm_dkdv_factored_ws3xfd, dm::factored::kDqGroupThreads, 2, true, false)
DM_DKDV_SPLIT_KERNELS(dm_dkdv_factored_ws3xfdp, dm::factored::kDqGroupThreads, 4, true, false)
DM_DKDV_SPLIT_KERNELS(dm_dkdv_factored_ws3xfdt, dm::factored::kDqGroupThreads, 2, true, true)
#undef DM_DKDV_SPLIT_KERNELS
#undef DM_DKDV_KERNEL
#undef DM_DKDV_KERNEL_FORM
extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)
    dm_dkdv_factored_ws3xp_promoted_dq_ordered(const DkdvFactoredParams p, const __grid_constant__ dm::dkdv::Maps maps,
                                               int* taken) {
  extern __shared__ uint8_t smem[];
  dm::dkdv::dkdv_persistent<3>(smem, p, maps, taken);
}

// dQ from dq_acc with dq_factored.cu's epilogue arithmetic, ((x · s) · s_Kᶜ[d]) · softmax_scale, queries < N: one
// block of 128 threads per 64 queries and query head; each thread reads the float4s a consumer thread wrote (dq_order),
// the block stages the cast rows in shared memory (rows padded by 8 elements: conflict-free) and writes them whole.
namespace dm {
namespace dkdv {
template <int D>
__device__ __forceinline__ void dq_epilogue(const DkdvFactoredParams& p) {
  using namespace dm::factored;
  constexpr int kPitch = D + 8;  // elements per staged row
  __shared__ __align__(16) uint16_t rows[kBlockM * kPitch];
  const int t = threadIdx.x, warp = t / 32, g = (t % 32) / 4, q = t % 4;
  const int64_t bh = blockIdx.y;
  const int b = int(bh / p.h), h = int(bh % p.h), start = blockIdx.x * kBlockM;
  const int64_t bh_kv = int64_t(b) * p.h_kv + h / (p.h / p.h_kv);
  const float* acc = p.dq_acc + (bh * (p.n_pad / kBlockM) + blockIdx.x) * dm::dkdv::kDqBlockFloatsOf<D>;
  const float* skc = p.skc + bh_kv * D;
  float s_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = start + 16 * warp + g + 8 * r;
    s_row[r] = row < p.n ? p.rs[bh * p.n_pad + row] : 1.0f;
  }
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    const float4 x = *reinterpret_cast<const float4*>(acc + dm::dkdv::dq_order(i, t));
    const float vals[4] = {x.x, x.y, x.z, x.w};
    const int col = 8 * i + 2 * q;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float y[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        y[c] = __fmul_rn(__fmul_rn(__fmul_rn(vals[2 * r + c], s_row[r]), skc[col + c]), p.softmax_scale);
      }
      uint32_t pair;
      if (p.out_fp16) {
        const __half2 v2 = __floats2half2_rn(y[0], y[1]);
        pair = *reinterpret_cast<const uint32_t*>(&v2);
      } else {
        const __nv_bfloat162 v2 = __floats2bfloat162_rn(y[0], y[1]);
        pair = *reinterpret_cast<const uint32_t*>(&v2);
      }
      *reinterpret_cast<uint32_t*>(rows + (16 * warp + g + 8 * r) * kPitch + col) = pair;
    }
  }
  __syncthreads();
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int j = 0; j < kBlockM * kChunks / kThreads; ++j) {
    const int at = t + kThreads * j, row = at / kChunks, chunk = at % kChunks;
    if (start + row >= p.n) continue;
    const int64_t out = int64_t(b) * p.dq_stride_b + int64_t(start + row) * p.dq_stride_n + int64_t(h) * p.dq_stride_h;
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.dq) + out + 8 * chunk) =
        *reinterpret_cast<const uint4*>(rows + row * kPitch + 8 * chunk);
  }
}
}  // namespace dkdv
}  // namespace dm
extern "C" __global__ void __launch_bounds__(dm::factored::kThreads) dm_dkdv_dq_epilogue(const DkdvFactoredParams p) {
  dm::dkdv::dq_epilogue<dm::factored::kHeadDim>(p);
}
extern "C" __global__ void __launch_bounds__(dm::factored::kThreads) dm_dkdv_dq_epilogue_d64(const DkdvFactoredParams p) {
  dm::dkdv::dq_epilogue<64>(p);
}

namespace {

using DkdvKernel = void (*)(DkdvFactoredParams, dm::dkdv::Maps);

// The kernel of each (variant, promote), in cuda_lib.DKDV_VARIANTS' numbering, its dynamic shared memory and threads,
// and whether it stores dK and dV by the TMA (Maps::dk, dv encoded for it).
struct DkdvLaunch {
  DkdvKernel kernel;
  int smem;
  int threads = dm::factored::kCtaThreads;
  bool tma_out = false;
};
// The maps of the operands every form reads, rows of D codes: Q̂, K̂, V̂, dÔ token-major (boxes of 64 rows),
// Q̂'ᶜ and dÔᶜ channel-major (boxes of D channels x 64 queries). False where the TMA cannot describe one.
template <int D>
bool encode_operands(dm::dkdv::Maps& maps, const DkdvFactoredParams& p) {
  using namespace dm::factored;
  const uint64_t n_pad = p.n_pad, q_rows = uint64_t(p.b) * p.h * n_pad, kv_rows = uint64_t(p.b) * p.h_kv * n_pad;
  const uint64_t channel_rows = uint64_t(p.b) * p.h * D;
  return encode_rows<D>(&maps.q, p.q8, q_rows, kBlockM) && encode_rows<D>(&maps.k, p.k8, kv_rows, kBlockN) &&
         encode_rows<D>(&maps.v, p.v8, kv_rows, kBlockN) && encode_rows<D>(&maps.dout, p.do8, q_rows, kBlockM) &&
         encode_channels<D>(&maps.qt, p.q8t, n_pad, channel_rows, kBlockM) &&
         encode_channels<D>(&maps.dot, p.do8t, n_pad, channel_rows, kBlockM);
}

DkdvLaunch dkdv_launch(int variant, bool promote, bool dq, bool ordered) {
  using namespace dm::dkdv;
  if (dq) {  // promoted only
    switch (variant) {
      case 0: return {!promote ? nullptr : ordered ? dm_dkdv_factored_ws3_promoted_dq_ordered
                                                   : dm_dkdv_factored_ws3_promoted_dq, smem_bytes<3, true>()};
      case 3: return {!promote ? nullptr : ordered ? dm_dkdv_factored_ws3x_promoted_dq_ordered
                                                   : dm_dkdv_factored_ws3x_promoted_dq, smem_bytes<3, true>()};
      case 5: return {!promote ? nullptr : ordered ? dm_dkdv_factored_ws3xf_promoted_dq_ordered
                                                   : dm_dkdv_factored_ws3xf_promoted_dq, smem_bytes<3, true>()};
      case 6: return {!promote ? nullptr : ordered ? dm_dkdv_factored_ws3xfs_promoted_dq_ordered
                                                   : dm_dkdv_factored_ws3xfs_promoted_dq, smem_bytes<3, true>()};
      case 7: return {!promote ? nullptr : ordered ? dm_dkdv_factored_ws3xfd_promoted_dq_ordered
                                                   : dm_dkdv_factored_ws3xfd_promoted_dq, smem_bytes<3, true>(),
                      dm::factored::kDqGroupThreads};
      case 8: return {!promote ? nullptr : ordered ? dm_dkdv_factored_ws3xfdp_promoted_dq_ordered
                                                   : dm_dkdv_factored_ws3xfdp_promoted_dq, smem_bytes<3, true>(),
                      dm::factored::kDqGroupThreads};
      case 9: return {!promote ? nullptr : ordered ? dm_dkdv_factored_ws3xfdt_promoted_dq_ordered
                                                   : dm_dkdv_factored_ws3xfdt_promoted_dq, smem_bytes<3, true>(),
                      dm::factored::kDqGroupThreads, true};
      default: return {nullptr, 0};
    }
  }
  switch (variant) {
    case 0: return {promote ? dm_dkdv_factored_ws3_promoted : dm_dkdv_factored_ws3_unpromoted, smem_bytes<3>()};
    case 1: return {promote ? dm_dkdv_factored_ws4_promoted : dm_dkdv_factored_ws4_unpromoted, smem_bytes<4>()};
    case 2: return {promote ? nullptr : dm_dkdv_factored_ws3s_unpromoted, smem_bytes<3>()};
    default: return {nullptr, 0};
  }
}

// The launch of `launch` (or of the persistent form, D = 128 only) on rows of D codes: the operand maps, dQ's FP32
// scratch and the ordered adds' counters zeroed where the launch needs it, the kernel, then with dQ the epilogue.
template <int D>
int run_dkdv(const DkdvFactoredParams* p, const DkdvLaunch& launch, bool persistent, int device,
             cudaStream_t stream) {
  using namespace dm::factored;
  const bool dq = p->dq_acc != nullptr;
  const void* kernel = persistent ? reinterpret_cast<const void*>(dm_dkdv_factored_ws3xp_promoted_dq_ordered)
                                  : reinterpret_cast<const void*>(launch.kernel);
  if (!kernel || (dq && p->dq_sem != nullptr && p->dq_section_heads < 1)) return cudaErrorInvalidValue;
  if (cudaError_t err = prepare_launch(kernel, launch.smem, device); err != cudaSuccess) return err;
  dm::dkdv::Maps maps;
  const uint64_t n_pad = p->n_pad;
  if (!encode_operands<D>(maps, *p) ||
      (dq && !encode_codes(&maps.kt, p->k8t, n_pad, uint64_t(p->b) * p->h_kv * D, kCtaRows, D,
                           CU_TENSOR_MAP_SWIZZLE_128B)) ||
      (launch.tma_out &&
       (!encode_out_rows<D>(&maps.dk, p->dk, p->b, p->n, p->h_kv, p->stride_b, p->stride_n, p->stride_h) ||
        !encode_out_rows<D>(&maps.dv, p->dv, p->b, p->n, p->h_kv, p->stride_b, p->stride_n, p->stride_h)))) {
    return cudaErrorInvalidValue;  // no driver entry point, or a layout the TMA cannot describe
  }
  if (dq) {
    const size_t bytes = size_t(p->b) * p->h * n_pad * D * sizeof(float);
    if (p->dq_sem == nullptr || !dm::dkdv::stores_first(p->dq_sync)) {
      if (cudaError_t err = cudaMemsetAsync(p->dq_acc, 0, bytes, stream); err != cudaSuccess) return err;
    }
    if (p->dq_sem != nullptr) {  // and the int after them (ws3xp's count of key blocks taken)
      const size_t counters = (size_t(p->b) * p->h * (n_pad / kBlockM) + 1) * sizeof(int);
      if (cudaError_t err = cudaMemsetAsync(p->dq_sem, 0, counters, stream); err != cudaSuccess) return err;
    }
  }
  const dim3 grid = cta_grid(p->n, p->b * p->h_kv);
  if (persistent) {
    int sms = 0;
    if (cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); err != cudaSuccess) {
      return err;
    }
    // $DELTAMATCH_DKDV_PERSISTENT_CTAS: fewer CTAs than SMs (a benchmark's control: how the kernel's time follows
    // the CTAs that run at once, kernels/NOTES.md session 27)
    if (const char* cap = std::getenv("DELTAMATCH_DKDV_PERSISTENT_CTAS"); cap && std::atoi(cap) > 0) {
      sms = std::min(sms, std::atoi(cap));
    }
    const int64_t blocks = int64_t(grid.x) * grid.y;
    int* taken = p->dq_sem + size_t(p->b) * p->h * (n_pad / kBlockM);
    dm_dkdv_factored_ws3xp_promoted_dq_ordered<<<unsigned(blocks < sms ? blocks : sms), kCtaThreads, launch.smem,
                                                 stream>>>(*p, maps, taken);
  } else {
    launch.kernel<<<grid, launch.threads, launch.smem, stream>>>(*p, maps);
  }
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess || !dq) return err;
  const auto epilogue = D == kHeadDim ? dm_dkdv_dq_epilogue : dm_dkdv_dq_epilogue_d64;
  epilogue<<<dim3(p->n_pad / kBlockM, p->b * p->h), kThreads, 0, stream>>>(*p);
  return cudaGetLastError();
}

}  // namespace

// variant (cuda_lib.DKDV_VARIANTS): 0 ws3, 1 ws4, 2 ws3s, 3 ws3x, 4 ws3xp (ws3x persistent: dQ, ordered and promoted
// only; its count of key blocks taken is the int after dq_sem's counters, zeroed with them), 5 ws3xf (ws3x with 448
// folded into the row terms: p->lse2 holds lse2 − log2(448) and p->irs div.full(1, s) / 448; dQ and promoted only),
// 6 ws3xfs (ws3xf, its promotion in 64-channel halves), 7 ws3xfd (ws3xfs, dQ's product in a fourth warpgroup),
// 8 ws3xfdp (ws3xfd, its promotion in quarters, pipelined), 9 ws3xfdt (ws3xfd, dK and dV stored by the TMA).
extern "C" int dm_dkdv_factored(const DkdvFactoredParams* p, int promote, int variant, int device,
                                cudaStream_t stream) {
  using namespace dm::factored;
  if (!valid_shape(*p)) return cudaErrorInvalidValue;
  const bool dq = p->dq_acc != nullptr, persistent = variant == 4;
  const DkdvLaunch launch = persistent ? DkdvLaunch{nullptr, dm::dkdv::smem_bytes<3, true>()}
                                       : dkdv_launch(variant, promote != 0, dq, p->dq_sem != nullptr);
  if (persistent && (!dq || p->dq_sem == nullptr || promote == 0)) return cudaErrorInvalidValue;
  return run_dkdv<dm::factored::kHeadDim>(p, launch, persistent, device, stream);
}

// dK and dV at D = 64 (promote, variant as dm_dkdv_factored's: 0 ws3, 1 ws4 without dQ, p->dq_acc null; 7 ws3xfd
// and 9 ws3xfdt with dQ, promoted, its adds ordered where p->dq_sem is set). Operands as dm_dkdv_factored's with
// D = 64: Q̂, K̂, V̂, dÔ token-major, Q̂'ᶜ and dÔᶜ channel-major in fragment order, and with dQ K̂ᶜ channel-major in
// fragment order.
extern "C" int dm_dkdv_factored_d64(const DkdvFactoredParams* p, int promote, int variant, int device,
                                    cudaStream_t stream) {
  using namespace dm::dkdv;
  if (!dm::factored::valid_shape(*p)) return cudaErrorInvalidValue;
  const bool dq = p->dq_acc != nullptr, ordered = p->dq_sem != nullptr;
  DkdvLaunch launch{nullptr, 0};
  if (!dq && (variant == 0 || variant == 1)) {
    const DkdvKernel kernels[2][2] = {{dm_dkdv_factored_ws3_unpromoted_d64, dm_dkdv_factored_ws3_promoted_d64},
                                      {dm_dkdv_factored_ws4_unpromoted_d64, dm_dkdv_factored_ws4_promoted_d64}};
    launch = {kernels[variant][promote ? 1 : 0],
              variant == 0 ? smem_bytes<3, false, 64>() : smem_bytes<4, false, 64>()};
  } else if (dq && variant == 7 && promote) {
    launch = {ordered ? dm_dkdv_factored_ws3xfd_promoted_dq_ordered_d64 : dm_dkdv_factored_ws3xfd_promoted_dq_d64,
              smem_bytes<3, true, 64>(), dm::factored::kDqGroupThreads};
  } else if (dq && variant == 9 && promote) {
    launch = {ordered ? dm_dkdv_factored_ws3xfdt_promoted_dq_ordered_d64 : dm_dkdv_factored_ws3xfdt_promoted_dq_d64,
              smem_bytes<3, true, 64>(), dm::factored::kDqGroupThreads, true};
  }
  return run_dkdv<64>(p, launch, false, device, stream);
}

// sizeof(DkdvFactoredParams), for the loader's check that its ctypes mirror has the same layout.
#ifdef DM_DQ_CLOCK
// DqClock's counters: copied into `dst` (at most kClockSlots * kClockCtas values), or zeroed.
extern "C" int dm_dq_clock_read(unsigned long long* dst, int values) {
  return cudaMemcpyFromSymbol(dst, dm::dkdv::dm_dq_clock, sizeof(unsigned long long) *
                              min(values, dm::dkdv::kClockSlots * dm::dkdv::kClockCtas));
}
extern "C" int dm_dq_clock_clear(void) {
  void* at;
  const cudaError_t err = cudaGetSymbolAddress(&at, dm::dkdv::dm_dq_clock);
  return err ? err : cudaMemset(at, 0, sizeof(dm::dkdv::dm_dq_clock));
}
extern "C" int dm_dq_clock_slots(void) { return dm::dkdv::kClockSlots; }
extern "C" int dm_dq_diag_set(int bits) {
  return cudaMemcpyToSymbol(dm::dkdv::dm_dq_diag, &bits, sizeof(bits));
}
#endif
extern "C" int dm_dkdv_factored_params_size(void) { return static_cast<int>(sizeof(DkdvFactoredParams)); }
