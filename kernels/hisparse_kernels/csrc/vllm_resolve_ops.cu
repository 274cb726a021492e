// vLLM 0.33's hisparse_resolve_residency schema on our resolve (vllm_resolve.cuh): checks every
// tensor as the op is called by vLLM's runtime.py, naming the argument, then launches one block per
// launch row on the current stream.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>

#include "vllm_resolve.cuh"

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// Messages carry numbers as strings (see hot_buffer_ops.cu: int64_t in TORCH_CHECK crashed there).
std::string num(int64_t v) { return std::to_string(v); }
std::string dims(at::IntArrayRef a) {
  std::string out = "[";
  for (size_t i = 0; i < a.size(); ++i) out += (i ? ", " : "") + std::to_string(a[i]);
  return out + "]";
}

void check(const Tensor& t, const char* name, at::ScalarType dtype, int64_t dim, const at::Device& device,
           bool contiguous = true) {
  TORCH_CHECK(t.is_cuda() && t.device() == device, name, " must be on ", device.str().c_str(), ", got ",
              t.device().str().c_str());
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, name, " must have ", num(dim).c_str(), " dims, got ", dims(t.sizes()).c_str());
  TORCH_CHECK(!contiguous || t.is_contiguous(), name, " must be contiguous, got strides ", dims(t.strides()).c_str());
}

void check_nk(const Tensor& t, const char* name, int64_t n, int64_t k, const at::Device& device) {
  check(t, name, at::kInt, 2, device);
  TORCH_CHECK(t.size(0) == n && t.size(1) == k, name, " has shape ", dims(t.sizes()).c_str(), ", expected [",
              num(n).c_str(), ", ", num(k).c_str(), "] like global_indices");
}

void check_rows(const Tensor& t, const char* name, int64_t n, const at::Device& device) {
  check(t, name, at::kInt, 1, device);
  TORCH_CHECK(t.numel() >= n, name, " holds ", num(t.numel()).c_str(), " entries for ", num(n).c_str(), " rows");
}

template <typename T>
T* ptr_or_null(const OptTensor& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

void vllm_resolve_residency(const Tensor& host_cache, const Tensor& hot_cache, const Tensor& hot_block_table,
                            const Tensor& global_indices, const Tensor& hot_indices, const Tensor& device_global_indices,
                            const Tensor& lru_slots, const OptTensor& request_state_indices, int64_t region_stride,
                            int64_t max_union_rows, const OptTensor& miss_mask, const OptTensor& stats,
                            const OptTensor& attention_indices, int64_t attention_block_stride,
                            const OptTensor& request_ids, const OptTensor& source_block_table,
                            int64_t source_block_size, const OptTensor& resolved_global_indices,
                            const OptTensor& valid_counts, const OptTensor& swap_host_physical_rows,
                            const OptTensor& swap_device_physical_rows, const OptTensor& swap_counts,
                            const OptTensor& resident_block_table, int64_t resident_block_size,
                            int64_t resident_null_block) {
  TORCH_CHECK(global_indices.is_cuda(), "global_indices must be a CUDA tensor, got ",
              global_indices.device().str().c_str());
  const at::Device device = global_indices.device();
  const c10::cuda::CUDAGuard guard(device);
  check(global_indices, "global_indices", at::kInt, 2, device);
  const int64_t n = global_indices.size(0);
  const int64_t k = global_indices.size(1);
  check_nk(hot_indices, "hot_indices", n, k, device);
  TORCH_CHECK(host_cache.dim() >= 1, "host_cache must have a row dimension, got ", dims(host_cache.sizes()).c_str());
  TORCH_CHECK(hot_cache.dim() == 2 || hot_cache.dim() == 3,
              "hot_cache must be [num_blocks, block_size, row_width] (or 2D, block size 1), got ",
              dims(hot_cache.sizes()).c_str());
  const int64_t hot_bs = hot_cache.dim() == 3 ? hot_cache.size(1) : 1;
  TORCH_CHECK(hot_bs > 0, "hot_cache block size must be positive, got ", dims(hot_cache.sizes()).c_str());
  check(hot_block_table, "hot_block_table", at::kInt, 2, device);
  check(device_global_indices, "device_global_indices", at::kInt, 2, device);
  check(lru_slots, "lru_slots", at::kShort, 2, device);
  const int64_t states = device_global_indices.size(0);
  const int64_t h = device_global_indices.size(1);
  TORCH_CHECK(lru_slots.sizes().equals(device_global_indices.sizes()), "lru_slots has shape ",
              dims(lru_slots.sizes()).c_str(), ", expected ", dims(device_global_indices.sizes()).c_str(),
              " like device_global_indices");
  TORCH_CHECK(region_stride == h, "region_stride must match the LRU size ", num(h).c_str(), ", got ",
              num(region_stride).c_str());
  TORCH_CHECK(h <= 32768, "the LRU holds int16 slot ids: at most 32768 hot slots, got ", num(h).c_str());
  TORCH_CHECK(max_union_rows > 0 && max_union_rows <= h, "max_union_rows must be in [1, ", num(h).c_str(),
              "], got ", num(max_union_rows).c_str());
  if (request_state_indices) check(*request_state_indices, "request_state_indices", at::kInt, 1, device);
  if (miss_mask) check_nk(*miss_mask, "miss_mask", n, k, device);
  if (stats) {
    check(*stats, "stats", at::kUInt64, 1, device);
    TORCH_CHECK(stats->numel() == 2, "stats must hold [hits, misses], got ", dims(stats->sizes()).c_str());
  }
  if (attention_indices) {
    check(*attention_indices, "attention_indices", at::kInt, 2, device, false);
    TORCH_CHECK(attention_indices->size(0) == n && attention_indices->size(1) == k, "attention_indices has shape ",
                dims(attention_indices->sizes()).c_str(), ", expected [", num(n).c_str(), ", ", num(k).c_str(), "]");
    TORCH_CHECK(attention_indices->stride(1) == 1 || k <= 1, "attention_indices columns must be contiguous, got strides ",
                dims(attention_indices->strides()).c_str());
  }
  if (request_ids) check_rows(*request_ids, "request_ids", n, device);
  if (source_block_table) {
    check(*source_block_table, "source_block_table", at::kInt, 2, device);
    TORCH_CHECK(source_block_size > 0, "source_block_size must be positive with a source_block_table, got ",
                num(source_block_size).c_str());
  }
  if (resolved_global_indices) check_nk(*resolved_global_indices, "resolved_global_indices", n, k, device);
  if (valid_counts) check_rows(*valid_counts, "valid_counts", n, device);
  if (swap_host_physical_rows) check_nk(*swap_host_physical_rows, "swap_host_physical_rows", n, k, device);
  if (swap_device_physical_rows) check_nk(*swap_device_physical_rows, "swap_device_physical_rows", n, k, device);
  if (swap_counts) check_rows(*swap_counts, "swap_counts", n, device);
  const bool resident = resident_block_table.has_value() && source_block_table.has_value();
  if (resident) {
    check(*resident_block_table, "resident_block_table", at::kInt, 2, device);
    TORCH_CHECK(resident_block_size > 0, "resident_block_size must be positive with a resident_block_table, got ",
                num(resident_block_size).c_str());
  }
  if (n == 0 || k == 0) return;
  TORCH_CHECK(n <= INT32_MAX && n * k < INT32_MAX, "global_indices ", dims(global_indices.sizes()).c_str(),
              " overflows int32 positions");

  const int optin = at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin;
  int bits = hisparse::vllm_resolve_table_bits(static_cast<int>(max_union_rows));
  while (hisparse::vllm_resolve_smem_bytes(static_cast<int>(h), bits) > size_t(optin) &&
         (1 << (bits - 1)) > max_union_rows)
    --bits;  // a fuller table (load <= 1) rather than no resolve
  const size_t smem = hisparse::vllm_resolve_smem_bytes(static_cast<int>(h), bits);
  TORCH_CHECK(smem <= size_t(optin), "the resolve needs ", num(static_cast<int64_t>(smem)).c_str(),
              " B of shared memory per block for ", num(h).c_str(), " hot slots and max_union_rows ",
              num(max_union_rows).c_str(), ", the device allows ", num(optin).c_str(),
              " B: lower device_buffer_size or num_speculative_tokens");

  hisparse::VllmResolveParams p{};
  p.hot_block_table = hot_block_table.data_ptr<int32_t>();
  p.hbt_rows = static_cast<int>(hot_block_table.size(0));
  p.hbt_cols = static_cast<int>(hot_block_table.size(1));
  p.global_indices = global_indices.data_ptr<int32_t>();
  p.hot_indices = hot_indices.data_ptr<int32_t>();
  p.dgi = device_global_indices.data_ptr<int32_t>();
  p.lru = lru_slots.data_ptr<int16_t>();
  p.num_states = static_cast<int>(states);
  p.rsi = ptr_or_null<int32_t>(request_state_indices);
  p.rsi_len = request_state_indices ? static_cast<int>(request_state_indices->numel()) : 0;
  p.miss_mask = ptr_or_null<int32_t>(miss_mask);
  p.stats = stats ? reinterpret_cast<unsigned long long*>(stats->data_ptr()) : nullptr;
  p.attention = ptr_or_null<int32_t>(attention_indices);
  p.att_row_stride = attention_indices ? attention_indices->stride(0) : 0;
  p.attention_block_stride = static_cast<int>(attention_block_stride);
  p.request_ids = ptr_or_null<int32_t>(request_ids);
  p.sbt = ptr_or_null<int32_t>(source_block_table);
  p.sbt_rows = source_block_table ? static_cast<int>(source_block_table->size(0)) : 0;
  p.sbt_cols = source_block_table ? static_cast<int>(source_block_table->size(1)) : 0;
  p.sbs = static_cast<int>(source_block_size);
  p.resolved = ptr_or_null<int32_t>(resolved_global_indices);
  p.valid_counts = ptr_or_null<int32_t>(valid_counts);
  p.swap_host = ptr_or_null<int32_t>(swap_host_physical_rows);
  p.swap_device = ptr_or_null<int32_t>(swap_device_physical_rows);
  p.swap_counts = ptr_or_null<int32_t>(swap_counts);
  p.rbt = resident ? resident_block_table->data_ptr<int32_t>() : nullptr;
  p.rbt_rows = resident ? static_cast<int>(resident_block_table->size(0)) : 0;
  p.rbt_cols = resident ? static_cast<int>(resident_block_table->size(1)) : 0;
  p.rbs = static_cast<int>(resident_block_size);
  p.rnull = static_cast<int>(resident_null_block);
  p.host_rows = host_cache.size(0);
  p.hot_block_size = static_cast<int>(hot_bs);
  p.num_rows = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.h = static_cast<int>(h);
  p.max_union = static_cast<int>(max_union_rows);
  p.table_bits = bits;

  static size_t configured[256] = {};
  const int dev = device.index();
  if (dev < 0 || dev >= 256 || configured[dev] < smem) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(hisparse::hisparse_vllm_resolve_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    if (dev >= 0 && dev < 256) configured[dev] = smem;
  }
  hisparse::hisparse_vllm_resolve_kernel<<<static_cast<unsigned>(n), hisparse::kVllmResolveThreads, smem,
                                           at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// vLLM 0.33's hisparse_invalidate_written_slots schema and checks (its dtypes: int32 request ids,
// int64 slots, as runtime.py passes them), on our invalidation kernel.
void vllm_invalidate_written_slots(const Tensor& device_global_indices, const Tensor& request_state_indices,
                                   const Tensor& req_id_per_token, const Tensor& written_slots) {
  TORCH_CHECK(device_global_indices.is_cuda(), "device_global_indices must be a CUDA tensor, got ",
              device_global_indices.device().str().c_str());
  const at::Device device = device_global_indices.device();
  const c10::cuda::CUDAGuard guard(device);
  check(device_global_indices, "device_global_indices", at::kInt, 2, device);
  check(request_state_indices, "request_state_indices", at::kInt, 1, device);
  check(req_id_per_token, "req_id_per_token", at::kInt, 1, device);
  check(written_slots, "written_slots", at::kLong, 1, device);
  TORCH_CHECK(req_id_per_token.numel() == written_slots.numel(), "req_id_per_token holds ",
              num(req_id_per_token.numel()).c_str(), " tokens, written_slots ", num(written_slots.numel()).c_str(),
              ": one request id per written slot");
  const int64_t tokens = written_slots.numel();
  const int64_t states = device_global_indices.size(0);
  const int64_t h = device_global_indices.size(1);
  if (tokens == 0 || states == 0 || h == 0) return;
  TORCH_CHECK(tokens <= INT32_MAX && states <= INT32_MAX && h <= INT32_MAX, "too many tokens or states for one launch");
  hisparse::hisparse_vllm_invalidate_written_kernel<<<static_cast<unsigned>(tokens), hisparse::kInvalidateWrittenThreads,
                                                      0, at::cuda::getCurrentCUDAStream()>>>(
      device_global_indices.data_ptr<int32_t>(), static_cast<int>(states), static_cast<int>(h),
      request_state_indices.data_ptr<int32_t>(), static_cast<int>(request_state_indices.numel()),
      req_id_per_token.data_ptr<int32_t>(), written_slots.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(hisparse, CUDA, m) {
  m.impl("vllm_resolve_residency", &vllm_resolve_residency);
  m.impl("vllm_invalidate_written_slots", &vllm_invalidate_written_slots);
}
