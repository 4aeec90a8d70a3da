// Hopper's bulk-copy engine (TMA) and the shared-memory barriers that count its bytes, through inline PTX (PTX ISA
// "cp.async.bulk.tensor", "cp.async.bulk", "mbarrier"). One thread issues a tile's copies and announces their bytes on
// the stage's `full` barrier; the consumers wait on that barrier's phase, and each consumer warp arrives on the
// stage's `empty` barrier once its reads of the stage are done, which the issuing thread waits for before it refills
// the stage. A barrier's phase flips each time its count of arrivals (and, for `full`, of bytes) completes.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace dm {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}
// Makes initialised barriers visible to the async proxy and the other threads (with a barrier after it).
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also announces `bytes` still to come from the bulk copies completing on this barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Spins until the barrier's phase with this parity has completed. No suspend-time hint: with CUTLASS's (0x989680 ns,
// a sleep until the phase completes) the δ pass took 5.7% longer and the dK/dV kernel, whose producer and reducers'
// retries are 6.6% of its issued instructions, did not move (kernels/NOTES.md, "the barrier waits sleep").
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nDM_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra DM_MBAR_WAIT;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// A 2D box of a tensor map (`map`: the address of a __grid_constant__ CUtensorMap) at coordinates (c0 innermost, c1)
// into shared memory, its bytes counted on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) of contiguous global memory into shared memory.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) of FP32 in shared memory added element-wise into global
// memory by the bulk-copy engine (a reduction at L2, atomic per element), as one bulk group of the issuing thread.
// The shared memory must have been written before a fence_async_shared() and a barrier; its reads are done once
// bulk_wait_read<N>() returns with at most N younger groups pending.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(smem_addr(src)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// The same bytes copied (not added) into global memory: the first of a tile's ordered adds, so that no memset of the
// destination precedes the launch.
__device__ __forceinline__ void bulk_store_f32(float* dst, const float* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_addr(src)),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// A 4D box of shared memory written into the tensor of `map` at coordinates (c0 innermost .. c3), as one bulk group
// of the issuing thread; the box's elements outside the tensor's dimensions are not written (a ragged last tile).
// The shared memory as for bulk_reduce_add_f32: written, fence_async_shared(), a barrier, then this.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Until at most N of this thread's younger bulk groups are pending, the older ones' writes complete (N = 0: every
// group of this thread has completed, writes included).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// A counter in global memory that orders work across CTAs (a semaphore): one thread spins until it reaches `value`
// (returns how many reads it took), or adds 1 to it (release). ACQUIRE: each read an acquire (ptxas: a strong load and
// CCTL.IVALL, an invalidation of the SM's whole L1 per read); else relaxed strong reads, enough where what follows the
// wait is the bulk-copy engine's work on data whose writes completed before the count (no generic load of it through
// L1). FENCE: a proxy fence orders the bulk-copy engine's accesses (the async proxy) with these generic ones.
template <bool FENCE, bool ACQUIRE = true>
__device__ __forceinline__ int wait_count(const int* counter, int value) {
  int seen, reads = 0;
  do {
    if (ACQUIRE) {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
    } else {
      asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
    }
    ++reads;
  } while (seen < value);
  if (FENCE) asm volatile("fence.proxy.async.global;\n" ::: "memory");
  return reads;
}
template <bool FENCE>
__device__ __forceinline__ void release_count(int* counter) {
  if (FENCE) asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}
// The same add without release semantics (no fence: ptxas emits MEMBAR.GPU for a release), for work whose writes are
// known complete already (a bulk group waited for).
__device__ __forceinline__ void count_relaxed(int* counter) {
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// Warpgroup register reallocation (PTX "setmaxnreg"): a producer warpgroup gives registers back to the CTA's pool
// and the consumer warpgroups take them, so that the consumers can hold more than the launch's even share. Every
// thread of the warpgroup executes it; the counts are multiples of 8 in [24, 256].
template <int REGS>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

}  // namespace dm
