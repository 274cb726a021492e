// vLLM 0.33's hisparse_resolve_residency on the project's resolve building blocks (shared-memory
// hash table, block-wide scans). The semantics, rule by rule, are reference/vllm_ops.py's
// resolve_residency_ref; comments here say how the parallel version reaches the same answer.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "device_common.cuh"

namespace hisparse {

constexpr int kVllmResolveThreads = 1024;

struct VllmResolveParams {
  const int32_t* hot_block_table;  // [R, hbt_cols]
  int hbt_rows, hbt_cols;
  const int32_t* global_indices;  // [N, K]
  int32_t* hot_indices;           // [N, K]
  int32_t* dgi;                   // [S, H]
  int16_t* lru;                   // [S, H]
  int num_states;
  const int32_t* rsi;             // [rsi_len] or nullptr
  int rsi_len;
  int32_t* miss_mask;             // [N, K] or nullptr
  unsigned long long* stats;      // [2] or nullptr
  int32_t* attention;             // [N, att_row_stride] or nullptr
  int64_t att_row_stride;
  int attention_block_stride;
  const int32_t* request_ids;     // [>= N] or nullptr
  const int32_t* sbt;             // [sbt_rows, sbt_cols] or nullptr
  int sbt_rows, sbt_cols, sbs;
  int32_t* resolved;              // [N, K] or nullptr
  int32_t* valid_counts;          // [N] or nullptr
  int32_t* swap_host;             // [N * K] or nullptr
  int32_t* swap_device;           // [N * K] or nullptr
  int32_t* swap_counts;           // [>= N] or nullptr
  const int32_t* rbt;             // [rbt_rows, rbt_cols] or nullptr
  int rbt_rows, rbt_cols, rbs, rnull;
  int64_t host_rows;
  int hot_block_size;
  int num_rows, k, h;
  int max_union;
  int table_bits;
};

// Shared memory: the union table (key, first reference, slot), the LRU copy, the evictable slots
// by rank and a hit flag per LRU position, then the scan scratch.
inline size_t vllm_resolve_smem_bytes(int h, int table_bits) {
  const size_t table = size_t(1) << table_bits;
  return 3 * table * sizeof(int32_t) + 72 * sizeof(int32_t) + 2 * size_t(h) * sizeof(int16_t) + size_t(h);
}

inline int vllm_resolve_table_bits(int max_union) {
  int bits = 1;
  while ((1 << bits) < 2 * max_union) ++bits;
  return bits;
}

// Hot index still to be decided: union positions carry -2 - (table index) in hot_indices between
// phases, so later phases neither translate again nor probe the table.
// The first reference of an entry no slot holds is re-marked INT_MIN + idx by the thread owning it,
// which alone fills the entry: no thread reads another's shared-memory entry between barriers.
__device__ __forceinline__ int32_t vllm_pending(int idx) { return -2 - idx; }
__device__ __forceinline__ int32_t vllm_first_miss(int idx) { return INT_MIN + idx; }
__device__ __forceinline__ bool vllm_is_first_miss(int32_t v) { return v < INT_MIN + (1 << 24); }
__device__ __forceinline__ bool vllm_is_pending(int32_t v) { return v <= -2 && !vllm_is_first_miss(v); }

__device__ __forceinline__ int32_t vllm_physical(const VllmResolveParams& p, int q, int s) {
  const int b = s / p.hot_block_size;
  if (q < 0 || q >= p.hbt_rows || b >= p.hbt_cols) return -1;  // guarded; runtime.py's tables cover every slot
  return p.hot_block_table[int64_t(q) * p.hbt_cols + b] * p.hot_block_size + s % p.hot_block_size;
}

__device__ __forceinline__ void vllm_store(const VllmResolveParams& p, int row, int col, int32_t v) {
  p.hot_indices[int64_t(row) * p.k + col] = v;
  if (p.attention) {
    p.attention[int64_t(row) * p.att_row_stride + col] =
        v < 0 ? -1 : (v / p.hot_block_size) * p.attention_block_stride + v % p.hot_block_size;
  }
}

// Insert (or find) key; sets *fresh when this call placed it. A full table traps: it holds more than
// twice max_union keys, so the union overflowed anyway.
__device__ __forceinline__ int vllm_table_insert(int32_t* keys, int bits, int32_t key, bool* fresh) {
  const uint32_t mask = (1u << bits) - 1u;
  uint32_t idx = hash_slot(key, bits);
  for (uint32_t probe = 0; probe <= mask; ++probe) {
    const int32_t old = atomicCAS(&keys[idx], kEmptyKey, key);
    if (old == kEmptyKey || old == key) {
      *fresh = old == kEmptyKey;
      return static_cast<int>(idx);
    }
    idx = (idx + 1u) & mask;
  }
  __trap();
  return -1;
}

// One block per launch row; only the first row of a run of equal request ids works, for the run.
__global__ void __launch_bounds__(kVllmResolveThreads) hisparse_vllm_resolve_kernel(VllmResolveParams p) {
  const int first = blockIdx.x;
  const int K = p.k;
  const int H = p.h;
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;
  const int q = p.request_ids ? p.request_ids[first] : first;
  if (p.request_ids && first > 0 && p.request_ids[first - 1] == q) return;  // uniform per block
  int end = first + 1;
  if (p.request_ids) {
    while (end < p.num_rows && p.request_ids[end] == q) ++end;
  }
  int state = q;
  if (p.rsi) state = (q >= 0 && q < p.rsi_len) ? p.rsi[q] : -1;
  if (state >= p.num_states) state = -1;  // guarded: outside the state tables (runtime.py never passes one)

  if (state < 0) {  // padding rows: outputs cleared, miss_mask, swap lists and the state untouched
    for (int row = first; row < end; ++row) {
      for (int c = tid; c < K; c += nthreads) {
        vllm_store(p, row, c, -1);
        if (p.resolved) p.resolved[int64_t(row) * K + c] = -1;
      }
      if (tid == 0) {
        if (p.valid_counts) p.valid_counts[row] = 0;
        if (p.swap_counts) p.swap_counts[row] = 0;
      }
    }
    return;
  }

  const int T = 1 << p.table_bits;
  extern __shared__ int32_t smem[];
  int32_t* t_key = smem;           // [T] host row g
  int32_t* t_first = t_key + T;    // [T] position (row - first) * K + col of its first reference
  int32_t* t_slot = t_first + T;   // [T] hot slot holding it: -1 none yet, -2 an invalid miss
  int32_t* warp_counts = t_slot + T;
  int32_t* warp_offsets = warp_counts + 32;
  int32_t* scalars = warp_offsets + 32;  // [8]: union size, scan totals
  int16_t* lru_s = reinterpret_cast<int16_t*>(scalars + 8);  // [H]
  int16_t* evict_slot = lru_s + H;                           // [H] evictable slots, oldest first
  uint8_t* hit_flag = reinterpret_cast<uint8_t*>(evict_slot + H);  // [H]

  for (int i = tid; i < T; i += nthreads) {
    t_key[i] = kEmptyKey;
    t_first[i] = INT_MAX;
    t_slot[i] = -1;
  }
  if (tid < 8) scalars[tid] = 0;
  int32_t* dgi = p.dgi + int64_t(state) * H;
  int16_t* lru = p.lru + int64_t(state) * H;
  for (int i = tid; i < H; i += nthreads) lru_s[i] = lru[i];
  __syncthreads();

  // Phase 1: translate every position; resident and invalid ones resolve now, the rest join the
  // union (first reference by atomicMin of the position, so duplicates are deterministic).
  const int rows = end - first;
  for (int row = first; row < end; ++row) {
    int valid_total = 0;
    for (int c0 = 0; c0 < K; c0 += nthreads) {
      const int c = c0 + tid;
      bool valid = false;
      if (c < K) {
        const int64_t at = int64_t(row) * K + c;
        const int32_t t = p.global_indices[at];
        int64_t g = t;
        int32_t resident = -1;
        if (p.sbt) {
          const int block = t >= 0 ? t / p.sbs : -1;
          g = -1;
          if (q >= 0 && q < p.sbt_rows && block >= 0 && block < p.sbt_cols) {
            const int32_t phys = p.sbt[int64_t(q) * p.sbt_cols + block];
            if (phys > 0) g = int64_t(phys) * p.sbs + t % p.sbs;
          }
          if (p.rbt) {
            const int rblock = t >= 0 ? t / p.rbs : -1;
            if (state < p.rbt_rows && rblock >= 0 && rblock < p.rbt_cols) {
              const int32_t phys = p.rbt[int64_t(state) * p.rbt_cols + rblock];
              if (phys != p.rnull && phys >= 0) resident = phys * p.rbs + t % p.rbs;
            }
          }
        }
        if (g >= p.host_rows) g = -1;
        const int32_t g32 = static_cast<int32_t>(g);
        if (p.resolved) p.resolved[at] = g32;
        if (p.miss_mask) p.miss_mask[at] = 0;
        valid = resident >= 0 || g32 >= 0;
        if (resident >= 0) {
          vllm_store(p, row, c, resident);
        } else if (g32 < 0) {
          vllm_store(p, row, c, -1);
        } else {
          bool fresh = false;
          const int idx = vllm_table_insert(t_key, p.table_bits, g32, &fresh);
          if (fresh) atomicAdd(&scalars[0], 1);
          atomicMin(&t_first[idx], (row - first) * K + c);
          p.hot_indices[at] = vllm_pending(idx);
        }
      }
      valid_total += __syncthreads_count(valid);
    }
    if (tid == 0 && p.valid_counts) p.valid_counts[row] = valid_total;
  }
  __syncthreads();
  const int n_union = scalars[0];
  if (n_union > p.max_union) __trap();  // vLLM's kernel traps too: the bound is a sizing contract
  if (n_union == 0) {
    for (int row = first + tid; row < end; row += nthreads)
      if (p.swap_counts) p.swap_counts[row] = 0;
    return;
  }

  // Phase 2: walk the LRU; a position whose slot caches a union entry is a hit. Each thread owns a
  // contiguous run of positions, so one scan ranks the hits and the evictables in LRU order.
  const int per_pos = (H + nthreads - 1) / nthreads;
  const int i_begin = min(tid * per_pos, H);
  const int i_end = min(i_begin + per_pos, H);
  int my_hits = 0;
  for (int i = i_begin; i < i_end; ++i) {
    const int s = lru_s[i];
    bool hit = false;
    if (s >= 0 && s < H) {
      const int32_t cached = dgi[s];
      if (cached >= 0) {
        const int idx = table_find(t_key, p.table_bits, cached);
        if (idx >= 0) {
          t_slot[idx] = s;  // two slots caching one entry race in vLLM as here (never generated)
          hit = true;
        }
      }
    }
    hit_flag[i] = hit ? 1 : 0;
    my_hits += hit ? 1 : 0;
  }
  const int hit_base = block_exclusive_sum(my_hits, warp_counts, warp_offsets, &scalars[1]);
  const int n_hit = scalars[1];
  const int n_evict = H - n_hit;
  const int evict_base = i_begin - hit_base;
  {
    int e = evict_base;
    for (int i = i_begin; i < i_end; ++i)
      if (!hit_flag[i]) evict_slot[e++] = lru_s[i];
  }
  __syncthreads();

  // Phase 3: misses in order of first reference: each thread owns a contiguous run of positions;
  // a scan of its first references of entries no slot holds gives its first miss rank.
  const int npos = rows * K;
  const int per_ref = (npos + nthreads - 1) / nthreads;
  const int p_begin = min(tid * per_ref, npos);
  const int p_end = min(p_begin + per_ref, npos);
  int my_misses = 0;
  for (int x = p_begin; x < p_end; ++x) {
    const int64_t at = int64_t(first) * K + x;
    const int32_t v = p.hot_indices[at];
    if (vllm_is_pending(v)) {
      const int idx = -2 - v;
      if (t_first[idx] == x && t_slot[idx] == -1) {
        p.hot_indices[at] = vllm_first_miss(idx);  // this thread alone handles the entry from here on
        ++my_misses;
      }
    }
  }
  int m = block_exclusive_sum(my_misses, warp_counts, warp_offsets, &scalars[2]);
  const int n_miss = scalars[2];  // invalid misses included
  for (int x = p_begin; x < p_end; ++x) {
    const int32_t v = p.hot_indices[int64_t(first) * K + x];
    if (!vllm_is_first_miss(v)) continue;
    const int idx = v - INT_MIN;
    if (m < n_evict) {  // always: the union fits H and every hit holds one position
      const int s = evict_slot[m];
      const int64_t flat = int64_t(first) * K + m;
      const int32_t g = t_key[idx];
      if (p.swap_host) p.swap_host[flat] = g;
      if (s >= 0 && s < H) {
        t_slot[idx] = s;
        dgi[s] = g;
        if (p.swap_device) p.swap_device[flat] = vllm_physical(p, q, s);
        if (p.miss_mask) p.miss_mask[int64_t(first) * K + x] = 1;
      } else {
        t_slot[idx] = -2;
        if (p.swap_device) p.swap_device[flat] = -1;
      }
    }
    ++m;
  }
  __syncthreads();

  // Every union reference: its hot index; the first reference of a filled miss counts a miss, every
  // other reference of a valid entry a hit.
  int my_entry_hits = 0;
  int my_entry_misses = 0;
  for (int x = p_begin; x < p_end; ++x) {
    const int32_t v = p.hot_indices[int64_t(first) * K + x];
    const bool first_miss = vllm_is_first_miss(v);
    if (!first_miss && !vllm_is_pending(v)) continue;
    const int idx = first_miss ? v - INT_MIN : -2 - v;
    const int s = t_slot[idx];
    const int row = first + x / K;
    const int col = x % K;
    if (s < 0) {  // an invalid miss (-2)
      vllm_store(p, row, col, -1);
      continue;
    }
    vllm_store(p, row, col, vllm_physical(p, q, s));
    if (first_miss) {
      ++my_entry_misses;
    } else {
      ++my_entry_hits;
    }
  }
  block_exclusive_sum(my_entry_hits, warp_counts, warp_offsets, &scalars[3]);
  block_exclusive_sum(my_entry_misses, warp_counts, warp_offsets, &scalars[4]);
  if (tid == 0 && p.stats) {
    atomicAdd(&p.stats[0], static_cast<unsigned long long>(scalars[3]));
    atomicAdd(&p.stats[1], static_cast<unsigned long long>(scalars[4]));
  }

  // Swap counts split over the run's rows (invalid misses included, as vLLM's copy skips them).
  if (p.swap_counts) {
    for (int row = first + tid; row < end; row += nthreads)
      p.swap_counts[row] = max(0, min(K, n_miss - (row - first) * K));
  }

  // New LRU: [evictables not taken][evictables taken, in miss order][hits], each from its rank.
  const int taken = min(n_miss, n_evict);
  int e = evict_base;
  int hr = hit_base;
  for (int i = i_begin; i < i_end; ++i) {
    int j;
    if (hit_flag[i]) {
      j = n_evict + hr++;
    } else {
      j = e >= taken ? e - taken : n_evict - taken + e;
      ++e;
    }
    lru[j] = lru_s[i];
  }
}

// ---------------------------------------------------------------------------------------------
// vLLM 0.33's hisparse_invalidate_written_slots (reference/vllm_ops.py invalidate_written_slots_ref):
// token t wrote global row written_slots[t] of request q = req_id_per_token[t]; every entry of
// device_global_indices[request_state_indices[q]] equal to it becomes -1 (q or the state out of
// range, or a negative slot: nothing). One block per token scans its state's row, 16 B at a time
// when the row allows, and writes only the entries that match: blocks of one state never write
// each other's entries with stale values.
// ---------------------------------------------------------------------------------------------
constexpr int kInvalidateWrittenThreads = 256;

__global__ void __launch_bounds__(kInvalidateWrittenThreads)
hisparse_vllm_invalidate_written_kernel(int32_t* dgi, int num_states, int h, const int32_t* rsi, int rsi_len,
                                        const int32_t* req_id_per_token, const int64_t* written_slots) {
  const int t = blockIdx.x;
  const int q = req_id_per_token[t];
  if (q < 0 || q >= rsi_len) return;
  const int state = rsi[q];
  const int64_t slot = written_slots[t];
  if (state < 0 || state >= num_states || slot < 0 || slot > INT32_MAX) return;
  const int32_t key = static_cast<int32_t>(slot);
  int32_t* row = dgi + int64_t(state) * h;
  if ((h & 3) == 0) {  // rows start 16 B aligned (contiguous int32 rows of a multiple of 4)
    const int4* row4 = reinterpret_cast<const int4*>(row);
    for (int i = threadIdx.x; i < (h >> 2); i += kInvalidateWrittenThreads) {
      const int4 v = row4[i];
      if (v.x == key) row[4 * i] = -1;
      if (v.y == key) row[4 * i + 1] = -1;
      if (v.z == key) row[4 * i + 2] = -1;
      if (v.w == key) row[4 * i + 3] = -1;
    }
  } else {
    for (int i = threadIdx.x; i < h; i += kInvalidateWrittenThreads)
      if (row[i] == key) row[i] = -1;
  }
}

}  // namespace hisparse
