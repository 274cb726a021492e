// HiSparse hot-buffer kernels: raw pointers, no framework types.
//
// The exact semantics of every kernel are defined by the NumPy reference in
// hisparse_kernels/reference/; comments here explain how the parallel version reaches the same
// answer deterministically.
#pragma once

#include <cub/block/block_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "device_common.cuh"

namespace hisparse {

constexpr int kResolveThreads = 1024;
constexpr int kBatch = 4;  // positions per thread per trip of resolve's load loop
constexpr int kCopyThreads = 256;
constexpr int kCopyUnroll = 4;
// Per-chunk copy of a capped (prefetch) grid: 512 threads x 8 loads = 64 KiB in flight per block, so
// 8 blocks copy about 42 GB/s (H200) and leave the other SMs to the compute the prefetch overlaps.
constexpr int kWideCopyThreads = 512;
constexpr int kWideCopyUnroll = 8;
constexpr int kDeepCopyThreads = 1024;  // the deep copy: 128 KiB in flight per block
constexpr int kCopyBlocksPerSM = 8;  // default plan-copy grid: SMs x this, split over the rows
constexpr int kInvalidateThreads = 256;
constexpr int kBackupWarpsPerBlock = 8;

// Phase clocks of the fast resolve, for benchmarks/resolve_phases.cu only (compiled out otherwise).
#ifdef HISPARSE_PHASE_CLOCKS
__device__ long long g_phase_clock[1024][12];
#define HISPARSE_PHASE_MARK(n) \
  do { if (threadIdx.x == 0 && blockIdx.x < 1024) g_phase_clock[blockIdx.x][n] = clock64(); } while (0)
#else
#define HISPARSE_PHASE_MARK(n) do { } while (0)
#endif

// One bitonic step (k2, j) with j <= 32 on a warp's 64 keys held in registers: key h of lane l is
// element base + 32 h + l. j == 32 pairs a lane's two keys; smaller j pairs lanes l and l ^ j.
__device__ __forceinline__ void bitonic_warp_step(unsigned long long& x0, unsigned long long& x1, int base,
                                                  int k2, int j, int lane) {
  if (j == 32) {
    const bool asc = ((base + lane) & k2) == 0;
    if ((x0 > x1) == asc) {
      const unsigned long long t = x0;
      x0 = x1;
      x1 = t;
    }
    return;
  }
  const bool lower = (lane & j) == 0;
  const unsigned long long y0 = __shfl_xor_sync(0xffffffffu, x0, j);
  const unsigned long long y1 = __shfl_xor_sync(0xffffffffu, x1, j);
  const bool asc0 = ((base + lane) & k2) == 0;
  const bool asc1 = ((base + 32 + lane) & k2) == 0;
  x0 = (lower == asc0) ? min(x0, y0) : max(x0, y0);
  x1 = (lower == asc1) ? min(x1, y1) : max(x1, y1);
}

// Sorts keys[0, size) ascending (size a power of two, >= 2) with the whole block. Steps whose pairs
// lie within 64 keys (j <= 32: 51 of the 66 steps at 2048 keys) run in registers, a warp per 64 keys;
// only the wider steps go through shared memory.
__device__ __forceinline__ void bitonic_sort_block(unsigned long long* keys, int size) {
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warps = blockDim.x >> 5;
  for (int k2 = 2; k2 <= size; k2 <<= 1) {
    for (int j = k2 >> 1; j >= 64; j >>= 1) {
      for (int q = tid; q < (size >> 1); q += blockDim.x) {
        const int x = ((q & ~(j - 1)) << 1) | (q & (j - 1));
        const int y = x | j;
        const unsigned long long a = keys[x];
        const unsigned long long b = keys[y];
        if ((a > b) == ((x & k2) == 0)) {
          keys[x] = b;
          keys[y] = a;
        }
      }
      __syncthreads();
    }
    // The steps j = min(k2 / 2, 32) .. 1 on each 64-key block; for k2 <= 64 all of them at once.
    const int k2_last = k2 <= 64 ? min(64, size) : k2;
    if (size < 64) {  // fewer keys than one warp's block: lanes beyond size hold +inf
      if (warp == 0) {
        unsigned long long x0 = lane < size ? keys[lane] : ~0ull;
        unsigned long long x1 = ~0ull;
        for (int kk = k2; kk <= k2_last; kk <<= 1)
          for (int j = kk >> 1; j > 0; j >>= 1) bitonic_warp_step(x0, x1, 0, kk, j, lane);
        if (lane < size) keys[lane] = x0;
      }
    } else {
      for (int b = warp * 64; b < size; b += warps * 64) {
        unsigned long long x0 = keys[b + lane];
        unsigned long long x1 = keys[b + 32 + lane];
        for (int kk = k2; kk <= k2_last; kk <<= 1)
          for (int j = min(kk >> 1, 32); j > 0; j >>= 1) bitonic_warp_step(x0, x1, b, kk, j, lane);
        keys[b + lane] = x0;
        keys[b + 32 + lane] = x1;
      }
    }
    __syncthreads();
    if (k2 <= 64) k2 = k2_last;  // the loop's next step is the first wider one
  }
}

// ---------------------------------------------------------------------------------------------
// Resolve: one block per request row.
// ---------------------------------------------------------------------------------------------
struct ResolveParams {
  const int32_t* topk;           // [B, K] global slots, -1 = padding
  const int32_t* newest;         // [B] this step's slot per row
  const int32_t* num_real_reqs;  // [1] rows at or beyond it are skipped
  int32_t* dgi;                  // [B, H] global slot held by each hot slot, -1 empty
  int16_t* lru;                  // [B, H] hot slot ids, least recent first
  int32_t* hot_rows;             // [B, K] absolute hot row per column, or -1
  int32_t* plan_src;             // [B, K] global slot of the m-th filled miss
  int32_t* plan_dst;             // [B, K] hot row of the m-th filled miss, or -1 (tripwire)
  int32_t* plan_count;           // [B]
  unsigned long long* counters;  // [2] hits, misses
  uint8_t* miss_mask;            // [B, K] or nullptr
  int num_rows;                  // B
  int k;
  int h;
  int region_stride;
  int64_t pool_rows;
  int table_bits;                // table size = 1 << table_bits >= 2K
  int bitonic_max;               // fast resolve: plans of at most this many misses are bitonic-sorted
};

// Dynamic shared memory of resolve, in bytes (int32 words, then the int16 LRU copy).
inline size_t resolve_smem_bytes(int k, int h, int table_bits) {
  const size_t table = size_t(1) << table_bits;
  const size_t words = 3 * table + 4 * size_t(h) + size_t(k) + 64 + 8;
  return words * sizeof(int32_t) + size_t(h) * sizeof(int16_t);
}

inline int resolve_table_bits(int k) {
  int bits = 1;
  while ((1 << bits) < 2 * k) ++bits;
  return bits;
}

// Position states kept per LRU position.
constexpr int kPosInvalid = -2;  // out of range or a repeated slot: never hits, tripwire if evicted
constexpr int kPosNoEntry = -1;  // valid, but its dgi is not wanted this step

__global__ void __launch_bounds__(kResolveThreads)
hisparse_resolve_kernel(ResolveParams p) {
  const int r = blockIdx.x;
  if (r >= p.num_rows || r >= *p.num_real_reqs) return;  // uniform per block
  const int K = p.k;
  const int H = p.h;
  const int T = 1 << p.table_bits;
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;

  extern __shared__ int32_t smem[];
  int32_t* t_key = smem;                 // [T] global slot
  int32_t* t_col = t_key + T;            // [T] first column holding the key
  int32_t* t_pos = t_col + T;            // [T] most recent valid LRU position holding the key
  int32_t* slot_first = t_pos + T;       // [H] first LRU position of each slot; later: hit list
  int32_t* pos_state = slot_first + H;   // [H] kPosInvalid / kPosNoEntry / table index
  int32_t* evict_pos = pos_state + H;    // [H] evictable positions, oldest first
  int32_t* topk_s = evict_pos + H;       // [K] the row's top-k, read once
  int32_t* dgi_s = topk_s + K;           // [H] the row's slot map as it was on entry
  int32_t* warp_counts = dgi_s + H;      // [32]
  int32_t* warp_offsets = warp_counts + 32;  // [32]
  int32_t* scalars = warp_offsets + 32;  // [8]: hit total, miss total
  int16_t* lru_s = reinterpret_cast<int16_t*>(scalars + 8);  // [H] copy of the row's LRU

  const int32_t* topk = p.topk + int64_t(r) * K;
  const int32_t newest = p.newest[r];
  int32_t* dgi = p.dgi + int64_t(r) * H;
  int16_t* lru = p.lru + int64_t(r) * H;
  int32_t* out = p.hot_rows + int64_t(r) * K;
  uint8_t* mask = p.miss_mask ? p.miss_mask + int64_t(r) * K : nullptr;
  const int32_t base = r * p.region_stride;

  // Phase 0: read the row's LRU, slot map and top-k once into shared memory, with every load of a
  // thread in flight together (one memory latency, not one per array or loop trip); clear the table.
  for (int first = 0; first < H; first += nthreads * kBatch) {
    int16_t lv[kBatch];
    int32_t dv[kBatch];
    int32_t gv[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = first + u * nthreads + tid;
      lv[u] = i < H ? lru[i] : int16_t(0);
      dv[u] = i < H ? dgi[i] : -1;
      gv[u] = i < K ? topk[i] : -1;  // K <= H
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = first + u * nthreads + tid;
      if (i < H) {
        slot_first[i] = INT_MAX;
        lru_s[i] = lv[u];
        dgi_s[i] = dv[u];
      }
      if (i < K) topk_s[i] = gv[u];
    }
  }
  for (int i = tid; i < T; i += nthreads) {
    t_key[i] = kEmptyKey;
    t_col[i] = INT_MAX;
    t_pos[i] = -1;
  }
  if (tid < 8) scalars[tid] = 0;
  __syncthreads();

  // Phase 1: hash the wanted columns (first column wins by atomicMin, so duplicates are
  // deterministic); mark the first LRU position of each in-range slot.
  for (int c = tid; c < K; c += nthreads) {
    const int32_t g = topk_s[c];
    if (g >= 0 && g != newest) {
      const int idx = table_insert(t_key, p.table_bits, g);
      atomicMin(&t_col[idx], c);
    }
  }
  for (int i = tid; i < H; i += nthreads) {
    const int s = lru_s[i];
    if (s >= 0 && s < H) atomicMin(&slot_first[s], i);
  }
  __syncthreads();

  // Phase 2: walk the LRU; the most recent valid position holding a wanted key claims it.
  for (int i = tid; i < H; i += nthreads) {
    const int s = lru_s[i];
    int state = kPosInvalid;
    if (s >= 0 && s < H && slot_first[s] == i) {
      state = kPosNoEntry;
      const int32_t g = dgi_s[s];
      if (g >= 0) {
        const int idx = table_find(t_key, p.table_bits, g);
        if (idx >= 0) {
          state = idx;
          atomicMax(&t_pos[idx], i);
        }
      }
    }
    pos_state[i] = state;
  }
  __syncthreads();

  // Compact hits and evictables (each in LRU order) into their lists. Each thread owns a contiguous
  // run of positions, so one block-wide sum gives every thread its place in both lists. slot_first
  // is free now and holds the hit list.
  int32_t* hit_list = slot_first;
  const int per_pos = (H + nthreads - 1) / nthreads;
  const int i_begin = min(tid * per_pos, H);
  const int i_end = min(i_begin + per_pos, H);
  int my_hits = 0;
  for (int i = i_begin; i < i_end; ++i) {
    const int state = pos_state[i];
    my_hits += (state >= 0 && t_pos[state] == i) ? 1 : 0;
  }
  int hit_at = block_exclusive_sum(my_hits, warp_counts, warp_offsets, &scalars[0]);
  const int n_hit = scalars[0];
  const int n_evict = H - n_hit;
  int evict_at = i_begin - hit_at;  // positions before my run minus the hits among them
  for (int i = i_begin; i < i_end; ++i) {
    const int state = pos_state[i];
    if (state >= 0 && t_pos[state] == i) {
      hit_list[hit_at++] = i;
    } else {
      evict_pos[evict_at++] = i;
    }
  }
  __syncthreads();

  // Phase 3: resolve columns in order; the m-th miss takes the m-th oldest evictable. Each thread
  // owns a contiguous run of columns; a block-wide sum of its misses gives its first miss rank.
  const int per_col = (K + nthreads - 1) / nthreads;
  const int c_begin = min(tid * per_col, K);
  const int c_end = min(c_begin + per_col, K);
  int my_misses = 0;
  for (int c = c_begin; c < c_end; ++c) {
    const int32_t g = topk_s[c];
    if (g >= 0 && g != newest) {
      const int idx = table_find(t_key, p.table_bits, g);
      my_misses += (t_col[idx] == c && t_pos[idx] >= 0) ? 0 : 1;
    }
  }
  int m = block_exclusive_sum(my_misses, warp_counts, warp_offsets, &scalars[1]);
  const int n_miss = scalars[1];
  for (int c = c_begin; c < c_end; ++c) {
    const int32_t g = topk_s[c];
    int32_t row = -1;
    uint8_t filled = 0;
    if (g >= 0 && g == newest) {
      row = base + H;
    } else if (g >= 0) {
      const int idx = table_find(t_key, p.table_bits, g);
      if (t_col[idx] == c && t_pos[idx] >= 0) {
        row = base + lru_s[t_pos[idx]];
      } else {
        if (m < n_evict) {
          const int i = evict_pos[m];
          p.plan_src[int64_t(r) * K + m] = g;
          if (pos_state[i] != kPosInvalid) {
            const int s = lru_s[i];
            dgi[s] = (int64_t(g) < p.pool_rows) ? g : -1;
            row = base + s;
            filled = 1;
          }
          p.plan_dst[int64_t(r) * K + m] = row;
        }
        ++m;
      }
    }
    out[c] = row;
    if (mask) mask[c] = filled;
  }
  __syncthreads();
  const int n_fill = min(n_miss, n_evict);

  // Phase 5 (before the LRU rewrite, which needs no table): order the plan by source slot, ties by
  // miss order. Adjacent host rows then sit next to each other in the copy, which turns them into
  // longer contiguous reads. The table region is free now and holds 64-bit (src, m) keys.
  if (n_fill > 1) {
    int size = 2;
    while (size < n_fill) size <<= 1;  // size <= 2K <= T
    unsigned long long* keys = reinterpret_cast<unsigned long long*>(t_key);  // [T] fits 2T words
    int32_t* dst_by_m = t_pos;                                               // [T]
    int32_t* plan_src_row = p.plan_src + int64_t(r) * K;
    int32_t* plan_dst_row = p.plan_dst + int64_t(r) * K;
    for (int m = tid; m < size; m += nthreads) {
      if (m < n_fill) {
        keys[m] = (static_cast<unsigned long long>(static_cast<uint32_t>(plan_src_row[m])) << 32) |
                  static_cast<uint32_t>(m);
        dst_by_m[m] = plan_dst_row[m];
      } else {
        keys[m] = ~0ull;
      }
    }
    __syncthreads();
    bitonic_sort_block(keys, size);
    for (int m = tid; m < n_fill; m += nthreads) {
      const unsigned long long key = keys[m];
      plan_src_row[m] = static_cast<int32_t>(key >> 32);
      plan_dst_row[m] = dst_by_m[static_cast<uint32_t>(key & 0xffffffffu)];
    }
  }

  // Phase 4: rewrite the LRU: [unused evictables][just filled][hits].
  const int n_unused = n_evict - n_fill;
  for (int j = tid; j < H; j += nthreads) {
    int pos;
    if (j < n_unused) {
      pos = evict_pos[n_fill + j];
    } else if (j < n_evict) {
      pos = evict_pos[j - n_unused];
    } else {
      pos = hit_list[j - n_evict];
    }
    lru[j] = lru_s[pos];
  }
  if (tid == 0) {
    p.plan_count[r] = n_fill;
    atomicAdd(&p.counters[0], static_cast<unsigned long long>(n_hit));
    atomicAdd(&p.counters[1], static_cast<unsigned long long>(n_miss));
  }
}

// ---------------------------------------------------------------------------------------------
// Resolve, fast form (H <= kFastThreads * kFastMaxPos, K <= kFastThreads * kFastMaxCols): the same
// answer as hisparse_resolve_kernel with far fewer instructions and barriers. Each thread owns a
// contiguous run of LRU positions and of columns and keeps their values in registers, so
//   - a column's table index is found once (at insert) and reused,
//   - hits are counted per position and misses per column in ONE block-wide scan (packed 16+16 bits),
//   - a position's new LRU index follows from its hit or evictable rank: no hit / evict lists, and
//     the new LRU goes straight from registers to memory,
//   - a plan of more than kFastBitonicMax misses is ordered by a stable radix sort (CUB) of the
//     sources over only the bits they use, carrying each miss's hot row (no round trip through the
//     plan in HBM); a smaller one by a bitonic sort of (source, rank) keys, which costs less there.
// Four barriers when nothing misses (the steady decode step).
// ---------------------------------------------------------------------------------------------
constexpr int kFastThreads = 1024;
constexpr int kFastMaxPos = 8;   // H <= 8192
constexpr int kFastMaxCols = 4;  // K <= 4096

inline bool resolve_fast_fits(int k, int h) {
  return h <= kFastThreads * kFastMaxPos && k <= kFastThreads * kFastMaxCols;
}

// LRU positions or columns per thread of the fast kernel: a power of two (a compile-time trip count
// per instance).
inline int fast_per_thread(int n) {
  int per = 1;
  while (per * kFastThreads < n) per <<= 1;
  return per;
}

// The plan sort: sources (uint32) with their hot rows, PC per thread in a blocked arrangement.
template <int PC>
using FastPlanSort = cub::BlockRadixSort<uint32_t, kFastThreads, PC, int32_t>;

// Plans of at most this many misses are ordered by a bitonic sort of 64-bit (source, rank) keys
// instead: on an H200 at 256 misses it took 7.6 K cycles against 18.0 K for the radix passes, whose
// cost hardly depends on the count (20.7 K at 2048). Its keys reuse the radix sort's storage.
constexpr int kFastBitonicMax = 1024;

inline size_t fast_plan_sort_bytes(int k) {
  size_t radix = 0;
  switch (fast_per_thread(k)) {
    case 1: radix = sizeof(typename FastPlanSort<1>::TempStorage); break;
    case 2: radix = sizeof(typename FastPlanSort<2>::TempStorage); break;
    default: radix = sizeof(typename FastPlanSort<4>::TempStorage); break;
  }
  return std::max(radix, size_t(kFastBitonicMax) * sizeof(unsigned long long));
}

// int32 words: table [3T], slot_first [H], dgi copy / evict slots [H], scan [40]; then the int16 LRU
// copy [H]; then, 16-byte aligned, the plan sort's storage. The sources and hot rows to sort
// ([K] each) reuse the table once it is dead (K <= T / 2).
__host__ __device__ inline size_t fast_plan_sort_offset(int h, int table_bits) {
  const size_t table = size_t(1) << table_bits;
  const size_t words = 3 * table + 2 * size_t(h) + 40;
  return (words * sizeof(int32_t) + size_t(h) * sizeof(int16_t) + 15) / 16 * 16;
}

inline size_t resolve_fast_smem_bytes(int k, int h, int table_bits) {
  return fast_plan_sort_offset(h, table_bits) + fast_plan_sort_bytes(k);
}

// The fast kernel's hash table: 4K entries where shared memory allows, else 2K. At a quarter load the
// probes are short: an all-hit row (K=2048, H=4096) took 13.1K cycles instead of 19.0K on an H200
// (benchmarks/resolve_phases.cu measures both).
inline int resolve_fast_table_bits(int k, int h, size_t max_smem) {
  const int bits = resolve_table_bits(k) + 1;
  return resolve_fast_smem_bytes(k, h, bits) <= max_smem ? bits : bits - 1;
}

// Column states kept in registers.
constexpr int kColNone = -3;    // beyond K
constexpr int kColNewest = -2;  // g == newest: the reserved slot H
constexpr int kColPad = -1;     // g < 0

template <int PP, int PC>
__global__ void __launch_bounds__(kFastThreads)
hisparse_resolve_fast_kernel(ResolveParams p) {
  const int r = blockIdx.x;
  if (r >= p.num_rows) return;
  HISPARSE_PHASE_MARK(0);
  const int K = p.k;
  const int H = p.h;
  const int T = 1 << p.table_bits;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;

  extern __shared__ __align__(16) int32_t smem[];
  int32_t* t_key = smem;                 // [T] global slot
  int32_t* t_col = t_key + T;            // [T] first column holding the key
  int32_t* t_pos = t_col + T;            // [T] most recent valid LRU position holding the key
  int32_t* slot_first = t_pos + T;       // [H] first LRU position of each slot (phases 1-2)
  int32_t* dgi_s = slot_first + H;       // [H] the row's slot map on entry (phases 0-2)
  int32_t* evict_slot = dgi_s;           // [n_fill] slot of the m-th evictable, -1 if invalid (after 2)
  int32_t* warp_sums = dgi_s + H;        // [32] warp sums; word 32 is max_src
  int16_t* lru_s = reinterpret_cast<int16_t*>(warp_sums + 40);  // [H] the row's LRU on entry
  uint32_t* src_by_m = reinterpret_cast<uint32_t*>(t_key);  // [K] plan source by miss rank (table dead)
  int32_t* dst_by_m = t_key + K;                             // [K] plan hot row by miss rank
  uint32_t* max_src = reinterpret_cast<uint32_t*>(warp_sums + 32);  // the largest source to sort

  const int32_t* topk = p.topk + int64_t(r) * K;
  int32_t* dgi = p.dgi + int64_t(r) * H;
  int16_t* lru = p.lru + int64_t(r) * H;
  const int32_t base = r * p.region_stride;
  constexpr int pp = PP;
  constexpr int pc = PC;
  const int i0 = min(tid * pp, H);
  const int c0 = min(tid * pc, K);

  // Phase 0: every global load of the thread in flight at once (the batch size too: a padding row
  // returns only after its loads, which stay inside the tensors).
  int s_[PP];
  int32_t d_[PP];
  int32_t g_[PC];
#pragma unroll
  for (int j = 0; j < PP; ++j) {
    const int i = i0 + j;
    s_[j] = (j < pp && i < H) ? int(lru[i]) : 0;
    const int q = tid + j * kFastThreads;
    d_[j] = q < H ? dgi[q] : -1;
  }
#pragma unroll
  for (int j = 0; j < PC; ++j) {
    const int c = c0 + j;
    g_[j] = (j < pc && c < K) ? topk[c] : -1;
  }
  const int32_t newest = p.newest[r];
  if (r >= *p.num_real_reqs) return;  // uniform per block, before any barrier
  HISPARSE_PHASE_MARK(1);
  for (int i = tid; i < T; i += kFastThreads) {
    t_key[i] = kEmptyKey;
    t_col[i] = INT_MAX;
    t_pos[i] = -1;
  }
#pragma unroll
  for (int j = 0; j < PP; ++j) {
    const int q = tid + j * kFastThreads;
    if (q < H) {
      slot_first[q] = INT_MAX;
      dgi_s[q] = d_[j];
    }
    if (j < pp && i0 + j < H) lru_s[i0 + j] = static_cast<int16_t>(s_[j]);
  }
  if (tid == 0) *max_src = 0;
  __syncthreads();  // 1
  HISPARSE_PHASE_MARK(2);

  // Phase 1: hash the wanted columns (first column wins by atomicMin); first position of each slot.
  int cidx[PC];
#pragma unroll
  for (int j = 0; j < PC; ++j) {
    const int c = c0 + j;
    const int32_t g = g_[j];
    int state = kColNone;
    if (j < pc && c < K) {
      state = g < 0 ? kColPad : (g == newest ? kColNewest : table_insert(t_key, p.table_bits, g));
      if (state >= 0) atomicMin(&t_col[state], c);
    }
    cidx[j] = state;
  }
#pragma unroll
  for (int j = 0; j < PP; ++j) {
    const int s = s_[j];
    if (j < pp && i0 + j < H && s >= 0 && s < H) atomicMin(&slot_first[s], i0 + j);
  }
  __syncthreads();  // 2
  HISPARSE_PHASE_MARK(3);

  // Phase 2: a valid position whose slot holds a wanted key bids for it; the most recent one wins.
  int pstate[PP];
#pragma unroll
  for (int j = 0; j < PP; ++j) {
    const int i = i0 + j;
    const int s = s_[j];
    int state = kPosInvalid;
    if (j < pp && i < H && s >= 0 && s < H && slot_first[s] == i) {
      state = kPosNoEntry;
      const int32_t g = dgi_s[s];
      if (g >= 0) {
        const int idx = table_find(t_key, p.table_bits, g);
        if (idx >= 0) {
          state = idx;
          atomicMax(&t_pos[idx], i);
        }
      }
    }
    pstate[j] = state;
  }
  __syncthreads();  // 3
  HISPARSE_PHASE_MARK(4);

  // Hits among my positions; hit rows and misses among my columns.
  unsigned hit_bits = 0;
#pragma unroll
  for (int j = 0; j < PP; ++j) {
    if (pstate[j] >= 0 && t_pos[pstate[j]] == i0 + j) hit_bits |= 1u << j;
  }
  unsigned miss_bits = 0;
  int32_t row_[PC];
#pragma unroll
  for (int j = 0; j < PC; ++j) {
    const int state = cidx[j];
    row_[j] = -1;
    if (state == kColNewest) {
      row_[j] = base + H;
    } else if (state >= 0) {
      const int tp = t_pos[state];
      if (t_col[state] == c0 + j && tp >= 0) {
        row_[j] = base + lru_s[tp];
      } else {
        miss_bits |= 1u << j;
      }
    }
  }

  // One block-wide exclusive scan of (hits, misses) packed in 16 + 16 bits (totals < 2^16), in
  // thread order = position order and column order. One barrier: every warp scans the warp sums.
  const int packed = __popc(hit_bits) | (__popc(miss_bits) << 16);
  int inclusive = packed;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();  // 4
  HISPARSE_PHASE_MARK(5);
  const int wv = warp_sums[lane];
  int wacc = wv;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, wacc, d);
    if (lane >= d) wacc += up;
  }
  const int total = __shfl_sync(0xffffffffu, wacc, 31);
  const int before = __shfl_sync(0xffffffffu, wacc - wv, warp) + inclusive - packed;
  int hit_at = before & 0xffff;
  int miss_at = before >> 16;
  const int n_hit = total & 0xffff;
  const int n_miss = total >> 16;
  const int n_evict = H - n_hit;
  const int n_fill = min(n_miss, n_evict);
  const int n_unused = n_evict - n_fill;

  // New LRU: [unused evictables][evictables just filled][hits]; the m-th miss takes the m-th
  // evictable, whose slot (or -1 for an invalid position: tripwire) goes to evict_slot[m].
  int evict_at = i0 - hit_at;  // positions before mine minus the hits among them
#pragma unroll
  for (int j = 0; j < PP; ++j) {
    if (j < pp && i0 + j < H) {
      int pos;
      if (hit_bits & (1u << j)) {
        pos = n_evict + hit_at++;
      } else {
        const int e = evict_at++;
        if (e < n_fill) {
          evict_slot[e] = pstate[j] == kPosInvalid ? -1 : s_[j];
          pos = n_unused + e;
        } else {
          pos = e - n_fill;
        }
      }
      lru[pos] = static_cast<int16_t>(s_[j]);  // every old LRU load was consumed before barrier 1
    }
  }
  if (n_fill > 0) __syncthreads();  // 5 (uniform): evict_slot
  HISPARSE_PHASE_MARK(6);

  // Misses take their slots (the table is dead: src_by_m and dst_by_m may overwrite it).
  int32_t* plan_src_row = p.plan_src + int64_t(r) * K;
  int32_t* plan_dst_row = p.plan_dst + int64_t(r) * K;
  unsigned filled_bits = 0;
  uint32_t my_max_src = 0;
  int m = miss_at;
#pragma unroll
  for (int j = 0; j < PC; ++j) {
    if (miss_bits & (1u << j)) {
      if (m < n_fill) {
        const int32_t g = g_[j];
        const int32_t slot = evict_slot[m];
        int32_t row = -1;
        if (slot >= 0) {
          dgi[slot] = (int64_t(g) < p.pool_rows) ? g : -1;
          row = base + slot;
          filled_bits |= 1u << j;
        }
        row_[j] = row;
        if (n_fill > 1) {
          src_by_m[m] = static_cast<uint32_t>(g);  // g >= 0: a miss is a wanted key
          dst_by_m[m] = row;
          my_max_src = max(my_max_src, static_cast<uint32_t>(g));
        } else {
          plan_src_row[m] = g;
          plan_dst_row[m] = row;
        }
      }
      ++m;
    }
  }
  if (n_fill > 1) {  // uniform
    my_max_src = __reduce_max_sync(0xffffffffu, my_max_src);
    if (lane == 0 && my_max_src > 0) atomicMax(max_src, my_max_src);
  }
  HISPARSE_PHASE_MARK(7);
  int32_t* out = p.hot_rows + int64_t(r) * K;
  uint8_t* mask = p.miss_mask ? p.miss_mask + int64_t(r) * K : nullptr;
#pragma unroll
  for (int j = 0; j < PC; ++j) {
    if (j < pc && c0 + j < K) {
      out[c0 + j] = row_[j];
      if (mask) mask[c0 + j] = (filled_bits >> j) & 1u;
    }
  }
  HISPARSE_PHASE_MARK(8);
  HISPARSE_PHASE_MARK(9);
  // Plan order: by source slot, ties in miss order. A stable sort of a blocked arrangement (thread t
  // holds ranks t * PC ...) keeps equal sources in rank order; only the bits up to the largest source
  // are sorted, and padding (all ones in those bits) stays behind any equal source by stability.
  if (n_fill > 1 && n_fill <= min(p.bitonic_max, kFastBitonicMax)) {  // uniform
    // Few misses: a bitonic sort of (source, rank) keys; ranks are unique, so ties keep miss order.
    __syncthreads();  // 6: src_by_m, dst_by_m
    int size = 2;
    while (size < n_fill) size <<= 1;
    auto* keys = reinterpret_cast<unsigned long long*>(reinterpret_cast<uint8_t*>(smem) +
                                                       fast_plan_sort_offset(H, p.table_bits));
    for (int q = tid; q < size; q += kFastThreads) {
      keys[q] = q < n_fill ? (static_cast<unsigned long long>(src_by_m[q]) << 32) | static_cast<uint32_t>(q) : ~0ull;
    }
    __syncthreads();
    bitonic_sort_block(keys, size);  // ends with a barrier
    for (int q = tid; q < n_fill; q += kFastThreads) {
      const unsigned long long key = keys[q];
      plan_src_row[q] = static_cast<int32_t>(key >> 32);
      plan_dst_row[q] = dst_by_m[static_cast<uint32_t>(key & 0xffffffffu)];
    }
  } else if (n_fill > 1) {
    __syncthreads();  // 6: src_by_m, dst_by_m, max_src
    const int end_bit = max(1, 32 - __clz(static_cast<int>(*max_src)));
    const uint32_t pad = end_bit >= 32 ? ~0u : (1u << end_bit) - 1u;
    uint32_t src[PC];
    int32_t dst[PC];
#pragma unroll
    for (int j = 0; j < PC; ++j) {
      const int q = tid * PC + j;
      src[j] = q < n_fill ? src_by_m[q] : pad;
      dst[j] = q < n_fill ? dst_by_m[q] : -1;
    }
    auto* sort_storage = reinterpret_cast<typename FastPlanSort<PC>::TempStorage*>(
        reinterpret_cast<uint8_t*>(smem) + fast_plan_sort_offset(H, p.table_bits));
    FastPlanSort<PC>(*sort_storage).Sort(src, dst, 0, end_bit);
#pragma unroll
    for (int j = 0; j < PC; ++j) {
      const int q = tid * PC + j;
      if (q < n_fill) {
        plan_src_row[q] = static_cast<int32_t>(src[j]);
        plan_dst_row[q] = dst[j];
      }
    }
  }
  HISPARSE_PHASE_MARK(10);
  if (tid == 0) {
    p.plan_count[r] = n_fill;
    atomicAdd(&p.counters[0], static_cast<unsigned long long>(n_hit));
    atomicAdd(&p.counters[1], static_cast<unsigned long long>(n_miss));
  }
}

// The fast resolve's instances: PP positions and PC columns per thread (powers of two, PC <= PP), so
// every per-thread loop has a compile-time trip count.
using ResolveKernelFn = void (*)(ResolveParams);
constexpr int kFastInstances = 9;

inline int resolve_fast_instance(int k, int h) {
  const int pp = fast_per_thread(h);
  const int pc = fast_per_thread(k);
  if (pp == 1) return 0;
  if (pp == 2) return pc == 1 ? 1 : 2;
  if (pp == 4) return pc == 1 ? 3 : (pc == 2 ? 4 : 5);
  return pc == 1 ? 6 : (pc == 2 ? 7 : 8);
}

inline ResolveKernelFn resolve_fast_kernel_for(int k, int h) {
  switch (resolve_fast_instance(k, h)) {
    case 0: return hisparse_resolve_fast_kernel<1, 1>;
    case 1: return hisparse_resolve_fast_kernel<2, 1>;
    case 2: return hisparse_resolve_fast_kernel<2, 2>;
    case 3: return hisparse_resolve_fast_kernel<4, 1>;
    case 4: return hisparse_resolve_fast_kernel<4, 2>;
    case 5: return hisparse_resolve_fast_kernel<4, 4>;
    case 6: return hisparse_resolve_fast_kernel<8, 1>;
    case 7: return hisparse_resolve_fast_kernel<8, 2>;
    default: return hisparse_resolve_fast_kernel<8, 4>;
  }
}

// ---------------------------------------------------------------------------------------------
// Plan copy: every thread moves 16-byte chunks; consecutive threads read consecutive chunks of a
// row, so each row is one coalesced run of PCIe reads. Grid: (blocks per row, row groups); a block
// walks rows blockIdx.y, blockIdx.y + gridDim.y, ...
// ---------------------------------------------------------------------------------------------
struct GatherParams {
  const uint8_t* host_pool;  // [P, W] pinned host memory, read through UVA
  int64_t pool_rows;
  uint8_t* hot;              // [N, W] device
  int64_t hot_rows;
  int row_bytes;             // W, multiple of 16
  const int32_t* plan_src;   // [B, K]
  const int32_t* plan_dst;   // [B, K]
  const int32_t* plan_count; // [B]
  const int32_t* num_real_reqs;
  int num_rows;
  int k;
  int batch_rows;  // the deep copy: rows flattened per pass (1..kDeepBatchRows)
  // vLLM's compact copy (the lines kernel's kVllm form) only: a paged hot cache, block b at
  // b * block_stride bytes; the other copies address a flat hot buffer (row r at r * row_bytes).
  int block_size = 1;
  int64_t block_stride = 0;
  // vLLM's hisparse_gather_plan only (kVllm, plan_count null): all K entries of a row, an entry copied
  // only where mask != 0, rows whose state (rsi, per launch row) is negative skipped, and the
  // attention row of each entry written by the row's first block.
  const int32_t* mask = nullptr;
  const int32_t* rsi = nullptr;
  int32_t* attention = nullptr;
  int64_t att_row_stride = 0;
  int attention_block_stride = 0;
};

// Byte offset of hot row d: flat, or paged as vLLM's caches are.
template <bool kPaged>
__device__ __forceinline__ int64_t hot_row_offset(const GatherParams& p, int32_t d) {
  if (kPaged) return int64_t(d / p.block_size) * p.block_stride + int64_t(d % p.block_size) * p.row_bytes;
  return int64_t(d) * p.row_bytes;
}

// Chunk ch (16 B) of plan entry (src, dst): loads it into v (zeros for a source outside the pool)
// and returns its byte offset in the hot buffer, or -1 for a tripwire or out-of-range destination.
__device__ __forceinline__ int64_t load_plan_chunk(const GatherParams& p, int32_t src, int32_t dst, int ch, uint4& v) {
  if (dst < 0 || dst >= p.hot_rows) return -1;
  if (src >= 0 && src < p.pool_rows) v = load_nc_16(p.host_pool + int64_t(src) * p.row_bytes + ch * 16);
  return int64_t(dst) * p.row_bytes + ch * 16;
}

template <int kThreads, int kUnroll>
__device__ __forceinline__ void gather_plan_chunks(const GatherParams& p) {
  const int rows = min(p.num_rows, *p.num_real_reqs);
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
  const int n = min(max(p.plan_count[r], 0), p.k);
  // Per-row chunk indices fit int32 (K * W / 16 < 2^31), which keeps the index math cheap.
  const int chunks = p.row_bytes >> 4;
  const int total = n * chunks;
  const int32_t* src_list = p.plan_src + int64_t(r) * p.k;
  const int32_t* dst_list = p.plan_dst + int64_t(r) * p.k;
  const int step = gridDim.x * kThreads * kUnroll;
  for (int first = blockIdx.x * kThreads * kUnroll + threadIdx.x; first < total; first += step) {
    uint4 v[kUnroll];
    int64_t dst_off[kUnroll];
    // Issue every load before the first store: several PCIe reads in flight per thread.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = first + u * kThreads;
      dst_off[u] = -1;
      v[u] = make_uint4(0, 0, 0, 0);
      if (j < total) {
        const int m = j / chunks;
        dst_off[u] = load_plan_chunk(p, src_list[m], dst_list[m], j - m * chunks, v[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (dst_off[u] >= 0) store_16(p.hot + dst_off[u], v[u]);
    }
  }
  }  // rows of this block
}

template <int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) hisparse_gather_plan_kernel(GatherParams p) {
  gather_plan_chunks<kThreads, kUnroll>(p);
}

// The deep copy of a capped grid: each block treats the plan entries of its rows (up to
// kDeepBatchRows at a time) as one flat list of 16 B chunks, so every pass of the block keeps
// kThreads x kUnroll loads in flight instead of running short at the end of each row. Under HBM
// load the PCIe reads wait longer, and a prefetch needs about 1 MiB in flight to keep its rate.
constexpr int kDeepBatchRows = 32;

template <int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) hisparse_gather_plan_deep_kernel(GatherParams p) {
  __shared__ int start[kDeepBatchRows + 1];  // chunk offset of each batch row in the flat list
  const int rows = min(p.num_rows, *p.num_real_reqs);
  const int chunks = p.row_bytes >> 4;
  const int batch = p.batch_rows;  // <= kDeepBatchRows; batch x K x chunks < 2^31 (host-checked)
  for (int base = blockIdx.y; base < rows; base += batch * gridDim.y) {
    if (threadIdx.x < 32) {
      const int i = threadIdx.x;
      const int r = base + i * gridDim.y;
      int c = (i < batch && r < rows) ? min(max(p.plan_count[r], 0), p.k) * chunks : 0;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, c, d);
        if (i >= d) c += o;
      }
      start[i + 1] = c;
      if (i == 0) start[0] = 0;
    }
    __syncthreads();
    const int total = start[kDeepBatchRows];
    const int step = gridDim.x * kThreads * kUnroll;
    for (int first = blockIdx.x * kThreads * kUnroll + threadIdx.x; first < total; first += step) {
      uint4 v[kUnroll];
      int64_t dst_off[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = first + u * kThreads;
        dst_off[u] = -1;
        v[u] = make_uint4(0, 0, 0, 0);
        if (j < total) {
          int i = 0;  // the batch row holding flat chunk j: start[i] <= j < start[i + 1]
#pragma unroll
          for (int half = kDeepBatchRows / 2; half > 0; half >>= 1)
            if (start[i + half] <= j) i += half;
          const int r = base + i * gridDim.y;
          const int local = j - start[i];
          const int m = local / chunks;
          dst_off[u] = load_plan_chunk(p, p.plan_src[int64_t(r) * p.k + m], p.plan_dst[int64_t(r) * p.k + m],
                                       local - m * chunks, v[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (dst_off[u] >= 0) store_16(p.hot + dst_off[u], v[u]);
      }
    }
    __syncthreads();  // start[] is rewritten for the next batch
  }
}

// ---------------------------------------------------------------------------------------------
// The per-chunk copy of vLLM 0.33's hisparse_gather_compact and hisparse_gather_plan, with their
// semantics (reference/vllm_ops.py gather_compact_ref, gather_plan_ref). Per row r:
// - gather_compact (counts given): entries [0, clamp(counts[r], 0, K));
// - gather_plan (counts null): all K entries, an entry only where mask != 0, a row whose state
//   (rsi, per launch row) is negative skipped, and attention[r, c] (when given) written by the row's
//   first block: -1 for a padding row or d < 0, else d's row in the attention view.
// An entry copies host row g into physical hot row d of a paged cache (block b at b * block_stride
// bytes, rows contiguous inside it: an HMA slab's view), zeros for g >= host_rows; g < 0 or d outside
// the cache is skipped. A thread per 16 B chunk, kUnroll loads in flight before the first store,
// consecutive threads on consecutive chunks of a row (one coalesced run of PCIe reads per row).
// ---------------------------------------------------------------------------------------------
struct VllmCopyParams {
  const uint8_t* host;  // [host_rows, row_bytes] pinned, read through UVA
  int64_t host_rows;
  uint8_t* hot;         // paged: [blocks, block_size, row_bytes] with any block stride
  int64_t hot_rows;     // blocks * block_size
  int64_t block_stride; // bytes
  int block_size;
  int row_bytes;        // multiple of 16
  const int32_t* src;   // [N, K]
  const int32_t* dst;   // [N, K]
  const int32_t* counts = nullptr;  // gather_compact: [>= N]; null: every entry (gather_plan)
  const int32_t* mask = nullptr;    // gather_plan: [N, K]
  const int32_t* rsi = nullptr;     // gather_plan: [>= N]
  int32_t* attention = nullptr;     // gather_plan: rows att_row_stride apart
  int64_t att_row_stride = 0;
  int attention_block_stride = 0;
  int num_rows;
  int k;
};

template <int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) hisparse_vllm_copy_kernel(VllmCopyParams p) {
  const int chunks = p.row_bytes >> 4;
  const int step = gridDim.x * kThreads * kUnroll;
  for (int r = blockIdx.y; r < p.num_rows; r += gridDim.y) {
    const int32_t* src_list = p.src + int64_t(r) * p.k;
    const int32_t* dst_list = p.dst + int64_t(r) * p.k;
    const int32_t* mask = p.mask != nullptr ? p.mask + int64_t(r) * p.k : nullptr;
    const bool padding = p.rsi != nullptr && p.rsi[r] < 0;
    if (p.attention != nullptr && blockIdx.x == 0) {
      int32_t* att = p.attention + int64_t(r) * p.att_row_stride;
      for (int c = threadIdx.x; c < p.k; c += kThreads) {
        const int32_t d = dst_list[c];
        att[c] = (padding || d < 0) ? -1 : (d / p.block_size) * p.attention_block_stride + d % p.block_size;
      }
    }
    if (padding) continue;
    const int n = p.counts != nullptr ? min(max(p.counts[r], 0), p.k) : p.k;
    const int total = n * chunks;  // < 2^31 (host-checked)
    for (int first = blockIdx.x * kThreads * kUnroll + threadIdx.x; first < total; first += step) {
      uint4 v[kUnroll];
      int64_t off[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = first + u * kThreads;
        off[u] = -1;
        v[u] = make_uint4(0, 0, 0, 0);
        if (j < total) {
          const int m = j / chunks;
          const int ch = j - m * chunks;
          const int32_t g = src_list[m];
          const int32_t d = dst_list[m];
          if ((mask == nullptr || mask[m] != 0) && g >= 0 && d >= 0 && d < p.hot_rows) {
            off[u] = int64_t(d / p.block_size) * p.block_stride + int64_t(d % p.block_size) * p.row_bytes + ch * 16;
            if (g < p.host_rows) v[u] = load_nc_16(p.host + int64_t(g) * p.row_bytes + ch * 16);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (off[u] >= 0) store_16(p.hot + off[u], v[u]);
      }
    }
  }
}

// The wide copy launched with the SM's whole shared memory (unused), so it runs alone on its SMs.
__global__ void __launch_bounds__(kWideCopyThreads) hisparse_gather_plan_exclusive_kernel(GatherParams p) {
  gather_plan_chunks<kWideCopyThreads, kWideCopyUnroll>(p);
}

// ---------------------------------------------------------------------------------------------
// Plan copy aligned to host cache lines (rows of at least 8 chunks, 128 B): one warp per plan entry,
// kLineEntries entries per warp at a time. Each 32-lane load covers 512 B that start on a 128 B line
// of the host pool, so no line is split between two load instructions. An entry whose source row
// directly follows the previous entry's (the plan is sorted by source slot) starts at its first
// whole line; the previous entry's warp takes the line the two rows share and writes its tail into
// this entry's destination. Adjacent miss rows therefore travel as one run of whole lines. Every
// chunk is still written by exactly one lane: bit-exact with the per-chunk copy for any plan.
// ---------------------------------------------------------------------------------------------
constexpr int kLineEntries = 2;  // plan entries per warp per trip
constexpr int kLineUnroll = 4;   // 512 B windows per entry per trip (2 KiB)

// kVllm: vLLM's hisparse_gather_compact semantics (reference/vllm_ops.py gather_compact_ref): every
// row (no num_real_reqs), a negative source skips its entry instead of writing zeros, and the hot
// cache is paged. A source at or beyond the pool still writes zeros, as in the plan copy.
template <bool kVllm>
__global__ void __launch_bounds__(kCopyThreads)
hisparse_gather_plan_lines_kernel(GatherParams p) {
  const int rows = kVllm ? p.num_rows : min(p.num_rows, *p.num_real_reqs);
  const int lane = threadIdx.x & 31;
  const int warps_per_block = kCopyThreads / 32;
  const int warp = blockIdx.x * warps_per_block + (threadIdx.x >> 5);
  const int warp_step = gridDim.x * warps_per_block * kLineEntries;
  const int64_t chunks = p.row_bytes >> 4;  // >= 8: a line spans at most two rows
  // Lines are 128 B of the absolute address: chunk c of the pool starts a line when (c + ph) % 8 == 0.
  const int64_t ph = static_cast<int64_t>((reinterpret_cast<uintptr_t>(p.host_pool) >> 4) & 7u);
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    const int32_t* src_list = p.plan_src + int64_t(r) * p.k;
    const int32_t* dst_list = p.plan_dst + int64_t(r) * p.k;
    const int32_t* mask = (kVllm && p.mask != nullptr) ? p.mask + int64_t(r) * p.k : nullptr;
    const bool padding = kVllm && p.rsi != nullptr && p.rsi[r] < 0;
    if (kVllm && p.attention != nullptr && blockIdx.x == 0) {
      int32_t* att = p.attention + int64_t(r) * p.att_row_stride;
      for (int c = threadIdx.x; c < p.k; c += kCopyThreads) {
        const int32_t d = dst_list[c];
        att[c] = (padding || d < 0) ? -1 : (d / p.block_size) * p.attention_block_stride + d % p.block_size;
      }
    }
    if (padding) continue;
    const int n = p.plan_count != nullptr ? min(max(p.plan_count[r], 0), p.k) : p.k;
    // An entry copies (or writes zeros) unless vLLM's rules skip it: a negative source, a zero mask.
    const auto copies = [&](int m, int32_t src) { return !kVllm || (src >= 0 && (mask == nullptr || mask[m] != 0)); };
    for (int m0 = warp * kLineEntries; m0 < n; m0 += warp_step) {
      // Per entry (warp-uniform): host chunk range [lo, hi) this warp copies, the row boundary, and
      // the two destinations (own row, next row for the shared line).
      int64_t lo[kLineEntries], hi[kLineEntries], row_begin[kLineEntries], base[kLineEntries];
      int32_t dst_own[kLineEntries], dst_next[kLineEntries];
      bool valid[kLineEntries];
      int trips = 0;
#pragma unroll
      for (int e = 0; e < kLineEntries; ++e) {
        const int m = m0 + e;
        lo[e] = hi[e] = row_begin[e] = base[e] = 0;
        dst_own[e] = dst_next[e] = -1;
        valid[e] = false;
        const int32_t src = m < n ? src_list[m] : -1;
        if (m < n && copies(m, src)) {  // a skipped entry takes no trips and shares no line
          dst_own[e] = dst_list[m];
          valid[e] = src >= 0 && src < p.pool_rows;
          const bool prev_adj = valid[e] && src > 0 && m > 0 && src_list[m - 1] == src - 1 && copies(m - 1, src - 1);
          const bool next_adj = valid[e] && int64_t(src) + 1 < p.pool_rows && m + 1 < n && src_list[m + 1] == src + 1 &&
                                copies(m + 1, src + 1);
          if (next_adj) dst_next[e] = dst_list[m + 1];
          // An invalid source writes zeros: chunk addresses then only index the destination row.
          row_begin[e] = valid[e] ? int64_t(src) * chunks : 0;
          const int64_t row_end = row_begin[e] + chunks;
          lo[e] = prev_adj ? ((row_begin[e] + ph + 7) & ~int64_t(7)) - ph : row_begin[e];
          hi[e] = next_adj ? ((row_end + ph + 7) & ~int64_t(7)) - ph : row_end;
          base[e] = ((lo[e] + ph) & ~int64_t(7)) - ph;  // may be negative: lanes below lo stay idle
          const int span = static_cast<int>(hi[e] - base[e]);
          trips = max(trips, (span + 32 * kLineUnroll - 1) / (32 * kLineUnroll));
        }
      }
      for (int t = 0; t < trips; ++t) {
        uint4 v[kLineEntries][kLineUnroll];
        int64_t dst_off[kLineEntries][kLineUnroll];
#pragma unroll
        for (int e = 0; e < kLineEntries; ++e) {
#pragma unroll
          for (int u = 0; u < kLineUnroll; ++u) {
            const int64_t c = base[e] + (t * kLineUnroll + u) * 32 + lane;
            dst_off[e][u] = -1;
            v[e][u] = make_uint4(0, 0, 0, 0);
            if (c >= lo[e] && c < hi[e]) {
              const bool own = c < row_begin[e] + chunks;
              const int32_t d = own ? dst_own[e] : dst_next[e];
              if (d >= 0 && d < p.hot_rows) {
                const int64_t ch = own ? c - row_begin[e] : c - row_begin[e] - chunks;
                dst_off[e][u] = hot_row_offset<kVllm>(p, d) + ch * 16;
                if (valid[e]) v[e][u] = load_nc_16(p.host_pool + c * 16);
              }
            }
          }
        }
#pragma unroll
        for (int e = 0; e < kLineEntries; ++e) {
#pragma unroll
          for (int u = 0; u < kLineUnroll; ++u) {
            if (dst_off[e][u] >= 0) store_16(p.hot + dst_off[e][u], v[e][u]);
          }
        }
      }
    }
  }  // rows of this block
}

// ---------------------------------------------------------------------------------------------
// Plan copy through the bulk-copy (TMA) engine: one warp per block. A group of up to 32 plan
// entries lands in a shared-memory stage by `cp.async.bulk` (host pool -> shared, one copy per
// run of adjacent source rows, completing on the stage's mbarrier); each entry then leaves by a
// bulk store (shared -> hot row). Several stages are in flight per block while the warp itself holds
// almost nothing: PCIe is kept busy by the copy engine, not by registers, which leaves the SM to
// whatever compute it shares it with (the index-sharing prefetch). An invalid source writes zeros
// with plain stores; an invalid destination is skipped. Bit-exact with the other plan copies.
// ---------------------------------------------------------------------------------------------
constexpr int kBulkThreads = 32;
constexpr int kBulkMaxStages = 4;

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void bulk_load(uint32_t dst_smem, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst_smem), "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

__device__ __forceinline__ void bulk_store(void* dst, uint32_t src_smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src_smem), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Bytes of one stage: rows_per_stage whole rows, rounded to 128.
inline int bulk_stage_bytes(int row_bytes, int rows_per_stage) {
  return (row_bytes * rows_per_stage + 127) & ~127;
}

inline size_t bulk_smem_bytes(int stage_bytes, int stages) {
  return size_t(stage_bytes) * stages + size_t(stages) * 8;
}

// Walks this block's groups: group gi of row r covers plan entries [gi * R, gi * R + R).
struct BulkCursor {
  int r;
  int gi;
  int n;  // entries in row r
};

__device__ __forceinline__ int clamp_count(const GatherParams& p, int r) { return min(max(p.plan_count[r], 0), p.k); }

__device__ __forceinline__ void bulk_normalize(BulkCursor& c, const GatherParams& p, int rows, int R) {
  while (c.r < rows) {
    const int groups = (c.n + R - 1) / R;
    if (c.gi < groups) return;
    c.gi -= groups;
    ++c.r;
    if (c.r < rows) c.n = clamp_count(p, c.r);
  }
}

template <int kStages>
__global__ void __launch_bounds__(kBulkThreads)
hisparse_gather_plan_bulk_kernel(GatherParams p, int rows_per_stage, int stage_bytes) {
  extern __shared__ __align__(128) uint8_t bulk_smem[];
  const int lane = threadIdx.x;
  const int rows = min(p.num_rows, *p.num_real_reqs);
  const int R = rows_per_stage;  // <= 32
  const uint32_t W = static_cast<uint32_t>(p.row_bytes);
  const uint32_t stage0 = smem_u32(bulk_smem);
  const uint32_t bar0 = stage0 + uint32_t(stage_bytes) * kStages;
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) mbar_init(bar0 + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();

  BulkCursor cur{0, static_cast<int>(blockIdx.x), rows > 0 ? clamp_count(p, 0) : 0};
  bulk_normalize(cur, p, rows, R);

  bool has[kStages];
  int64_t dst_off[kStages];  // this lane's destination byte offset, -1 none
  bool zero[kStages];        // destination valid, source outside the pool
  uint32_t parity[kStages];

  // Issues the loads of the cursor's group into stage s and advances the cursor.
  auto issue = [&](int s) {
    has[s] = cur.r < rows;
    dst_off[s] = -1;
    zero[s] = false;
    if (!has[s]) return;
    const int m0 = cur.gi * R;
    const int cnt = min(R, cur.n - m0);
    const int m = m0 + lane;
    const bool mine = lane < cnt;
    const int64_t at = int64_t(cur.r) * p.k + m;
    const int32_t src = mine ? p.plan_src[at] : -1;
    const int32_t dst = mine ? p.plan_dst[at] : -1;
    const bool sv = mine && src >= 0 && src < p.pool_rows;
    const bool dv = mine && dst >= 0 && dst < p.hot_rows;
    const int32_t prev_src = __shfl_up_sync(0xffffffffu, src, 1);
    const unsigned sv_bits = __ballot_sync(0xffffffffu, sv);
    const bool cont = sv && lane > 0 && ((sv_bits >> (lane - 1)) & 1u) && prev_src == src - 1;
    const unsigned cont_bits = __ballot_sync(0xffffffffu, cont);
    const uint32_t stage = stage0 + uint32_t(s) * stage_bytes;
    if (lane == 0) mbar_arrive_expect_tx(bar0 + 8 * s, uint32_t(__popc(sv_bits)) * W);
    __syncwarp();
    if (sv && !cont) {
      // a run: this lane and the lanes right after it that continue it
      const unsigned long long after = static_cast<unsigned long long>(cont_bits) >> (lane + 1);
      const int len = __ffsll(static_cast<long long>(~after)) ;  // first lane that does not continue
      bulk_load(stage + uint32_t(lane) * W, p.host_pool + int64_t(src) * W, uint32_t(len) * W, bar0 + 8 * s);
    }
    if (dv) {
      dst_off[s] = int64_t(dst) * W;
      zero[s] = !sv;
    }
    cur.gi += gridDim.x;
    bulk_normalize(cur, p, rows, R);
  };

#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    parity[s] = 0;
    issue(s);
  }
  bool any = true;
  while (any) {
    any = false;
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      if (!has[s]) continue;
      mbar_wait(bar0 + 8 * s, parity[s]);
      parity[s] ^= 1u;
      if (dst_off[s] >= 0) {
        if (zero[s]) {
          for (uint32_t off = 0; off < W; off += 16) store_16(p.hot + dst_off[s] + off, make_uint4(0, 0, 0, 0));
        } else {
          bulk_store(p.hot + dst_off[s], stage0 + uint32_t(s) * stage_bytes + uint32_t(lane) * W, W);
        }
      }
      bulk_commit();
      bulk_wait_read_all();  // the stage's bytes have left shared memory: it may be refilled
      __syncwarp();
      issue(s);
      any = true;
    }
  }
  bulk_wait_all();
}

// ---------------------------------------------------------------------------------------------
// Plan copy with asynchronous loads into shared memory (`cp.async`, 16 B per lane): one warp per
// block keeps several stages of host rows in flight while holding almost no registers, then writes
// each landed stage to its hot rows. Meant for the capped grid of the index-sharing prefetch, whose
// blocks should fit beside the compute they overlap. A source outside the pool lands as zeros (the
// load's source size is 0); an invalid destination is skipped. Bit-exact with the other copies.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async_16(uint32_t dst_smem, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst_smem), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// 32 registers per thread: one warp then needs 1 K registers, what a GEMM block that takes 64.5 K of
// the SM's 64 K leaves.
template <int kStages>
__global__ void __maxnreg__(32)
hisparse_gather_plan_async_kernel(GatherParams p, int rows_per_stage, int stage_bytes) {
  extern __shared__ __align__(128) uint8_t async_smem[];
  const int lane = threadIdx.x;
  const int rows = min(p.num_rows, *p.num_real_reqs);
  const int R = rows_per_stage;  // <= 32
  const int W = p.row_bytes;
  const int chunks = W >> 4;
  BulkCursor cur{0, static_cast<int>(blockIdx.x), rows > 0 ? clamp_count(p, 0) : 0};
  bulk_normalize(cur, p, rows, R);

  int cnt[kStages];     // rows in the stage (0: none)
  int32_t dst[kStages];  // this lane's row: destination hot row, -1 none

  // Starts the loads of the cursor's group into stage s (always commits one group, maybe empty).
  auto issue = [&](int s) {
    cnt[s] = 0;
    dst[s] = -1;
    if (cur.r < rows) {
      const int m0 = cur.gi * R;
      cnt[s] = min(R, cur.n - m0);
      const int64_t at = int64_t(cur.r) * p.k + m0 + lane;
      const int32_t src = lane < cnt[s] ? p.plan_src[at] : -1;
      const int32_t d = lane < cnt[s] ? p.plan_dst[at] : -1;
      dst[s] = (d >= 0 && d < p.hot_rows) ? d : -1;
      const bool sv = src >= 0 && src < p.pool_rows;
      const uint32_t stage = static_cast<uint32_t>(__cvta_generic_to_shared(async_smem)) + uint32_t(s) * stage_bytes;
      const int total = cnt[s] * chunks;
      for (int c0 = 0; c0 < total; c0 += 32) {  // warp-uniform trips: every lane takes part in the shuffles
        const int c = c0 + lane;
        const int row = min(c, total - 1) / chunks;
        const int ch = c - row * chunks;
        const int32_t row_src = __shfl_sync(0xffffffffu, src, row);
        const bool row_sv = __shfl_sync(0xffffffffu, sv ? 1 : 0, row) != 0;
        if (c < total) {
          const uint8_t* from = p.host_pool + (row_sv ? int64_t(row_src) * W : 0) + ch * 16;
          cp_async_16(stage + uint32_t(c) * 16, from, row_sv);
        }
      }
      cur.gi += gridDim.x;
      bulk_normalize(cur, p, rows, R);
    }
    cp_async_commit();
  };

#pragma unroll
  for (int s = 0; s < kStages; ++s) issue(s);
  bool any = true;
  while (any) {
    any = false;
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      cp_async_wait<kStages - 1>();  // stage s's group (the oldest) has landed
      __syncwarp();
      if (cnt[s] > 0) {
        any = true;
        const uint8_t* stage = async_smem + s * stage_bytes;
        const int total = cnt[s] * chunks;
        for (int c0 = 0; c0 < total; c0 += 32) {
          const int c = c0 + lane;
          const int row = min(c, total - 1) / chunks;
          const int32_t d = __shfl_sync(0xffffffffu, dst[s], row);
          const int ch = c - row * chunks;
          if (c < total && d >= 0) {
            store_16(p.hot + int64_t(d) * W + ch * 16, *reinterpret_cast<const uint4*>(stage + c * 16));
          }
        }
      }
      __syncwarp();
      issue(s);
    }
  }
  cp_async_wait<0>();
}

// ---------------------------------------------------------------------------------------------
// Newest-row backup: one warp per row, hot row (r * region_stride + hot_slot) -> host_pool[newest[r]].
// ---------------------------------------------------------------------------------------------
struct BackupParams {
  const uint8_t* hot;
  uint8_t* host_pool;
  int64_t pool_rows;
  int row_bytes;
  const int32_t* newest;
  const int32_t* num_real_reqs;
  int num_rows;  // already clamped to min(B, N / region_stride)
  int region_stride;
  int hot_slot;
};

__global__ void __launch_bounds__(kBackupWarpsPerBlock * 32)
hisparse_backup_newest_kernel(BackupParams p) {
  const int r = blockIdx.x * kBackupWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= p.num_rows || r >= *p.num_real_reqs) return;
  const int32_t g = p.newest[r];
  if (g < 0 || g >= p.pool_rows) return;
  const uint8_t* src = p.hot + (int64_t(r) * p.region_stride + p.hot_slot) * p.row_bytes;
  uint8_t* dst = p.host_pool + int64_t(g) * p.row_bytes;
  for (int off = lane * 16; off < p.row_bytes; off += 32 * 16) {
    store_16(dst + off, *reinterpret_cast<const uint4*>(src + off));
  }
}

// ---------------------------------------------------------------------------------------------
// Invalidate: one block per row; the block ids sit in a shared-memory table.
// ---------------------------------------------------------------------------------------------
struct InvalidateParams {
  int32_t* dgi;             // [B, H]
  const int32_t* block_ids; // [M]
  int num_blocks;           // M
  int block_size;
  int h;
  int table_bits;
};

inline size_t invalidate_smem_bytes(int table_bits) {
  return (size_t(1) << table_bits) * sizeof(int32_t);
}

__global__ void __launch_bounds__(kInvalidateThreads)
hisparse_invalidate_kernel(InvalidateParams p) {
  extern __shared__ int32_t keys[];
  const int T = 1 << p.table_bits;
  for (int i = threadIdx.x; i < T; i += blockDim.x) keys[i] = kEmptyKey;
  __syncthreads();
  for (int i = threadIdx.x; i < p.num_blocks; i += blockDim.x) {
    const int32_t b = p.block_ids[i];
    if (b >= 0) table_insert(keys, p.table_bits, b);
  }
  __syncthreads();
  int32_t* dgi = p.dgi + int64_t(blockIdx.x) * p.h;
  for (int s = threadIdx.x; s < p.h; s += blockDim.x) {
    const int32_t g = dgi[s];
    if (g >= 0 && table_find(keys, p.table_bits, g / p.block_size) >= 0) dgi[s] = -1;
  }
}

// ---------------------------------------------------------------------------------------------
// Benchmark-only kernels: the limits the real kernels are measured against.
// ---------------------------------------------------------------------------------------------

// Copy-only gather of a flat row list (thread per 16-byte chunk, same access pattern as the plan
// copy, no plan indirection per request).
__global__ void __launch_bounds__(kCopyThreads)
hisparse_bench_flat_gather_kernel(const uint8_t* host_pool, uint8_t* hot, int row_bytes,
                                  const int32_t* src, const int32_t* dst, int n) {
  const int chunks = row_bytes >> 4;
  const int total = n * chunks;  // the binding keeps n * chunks < 2^31
  const int step = gridDim.x * kCopyThreads * kCopyUnroll;
  for (int first = blockIdx.x * kCopyThreads * kCopyUnroll + threadIdx.x; first < total; first += step) {
    uint4 v[kCopyUnroll];
    int64_t dst_off[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int j = first + u * kCopyThreads;
      dst_off[u] = -1;
      if (j < total) {
        const int m = j / chunks;
        const int ch = j - m * chunks;
        v[u] = load_nc_16(host_pool + int64_t(src[m]) * row_bytes + ch * 16);
        dst_off[u] = int64_t(dst[m]) * row_bytes + ch * 16;
      }
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      if (dst_off[u] >= 0) store_16(hot + dst_off[u], v[u]);
    }
  }
}

// Naive gather: one warp per row, each lane loads and stores one 16-byte chunk at a time.
__global__ void hisparse_bench_warp_gather_kernel(const uint8_t* host_pool, uint8_t* hot, int row_bytes,
                                                  const int32_t* src, const int32_t* dst, int n) {
  const int w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= n) return;
  const uint8_t* s = host_pool + int64_t(src[w]) * row_bytes;
  uint8_t* d = hot + int64_t(dst[w]) * row_bytes;
  for (int off = lane * 16; off < row_bytes; off += 32 * 16) {
    store_16(d + off, load_nc_16(s + off));
  }
}

// Launch-only: the same grid as a plan copy, reading only the batch size.
__global__ void hisparse_bench_launch_only_kernel(const int32_t* num_real_reqs, int32_t* sink) {
  if (*num_real_reqs < 0 && threadIdx.x == 0) *sink = blockIdx.x;
}

}  // namespace hisparse
