// Torch binding of the hot-buffer kernels: checks every tensor, then launches on the current stream.
// The schemas live in registration.cpp; the kernels in hot_buffer.cuh.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "hot_buffer.cuh"

namespace {

using at::Tensor;

// Error messages format numbers and shapes themselves and hand c10 only strings: with torch 2.11
// and nvcc 13.0, a TORCH_CHECK message carrying an int64_t crashed the process instead of raising.
std::string num(int64_t v) { return std::to_string(v); }
std::string dims(at::IntArrayRef a) {
  std::string out = "[";
  for (size_t i = 0; i < a.size(); ++i) out += (i ? ", " : "") + std::to_string(a[i]);
  return out + "]";
}

void check_device_tensor(const Tensor& t, const char* name, at::ScalarType dtype, int64_t dim,
                         const at::Device& device) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got ", t.device().str().c_str());
  TORCH_CHECK(t.device() == device, name, " is on ", t.device().str().c_str(), " but the op runs on ",
              device.str().c_str());
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, name, " must have ", num(dim).c_str(), " dims, got ", num(t.dim()).c_str());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_shape(const Tensor& t, const char* name, std::initializer_list<int64_t> shape) {
  TORCH_CHECK(t.sizes().equals(shape), name, " has shape ", dims(t.sizes()).c_str(), ", expected ",
              dims(at::IntArrayRef(shape)).c_str());
}

void check_num_real(const Tensor& t, const at::Device& device) {
  check_device_tensor(t, "num_real_reqs", at::kInt, 1, device);
  TORCH_CHECK(t.numel() == 1, "num_real_reqs must hold one element, got ", num(t.numel()).c_str());
}

// Host ranges registered through host_register (HostPool): checking membership costs no CUDA call,
// so a launch never waits on the driver for its pointer check.
std::mutex g_ranges_mutex;
std::map<uintptr_t, uintptr_t> g_ranges;  // start -> end

bool in_registered_range(uintptr_t begin, uintptr_t end) {
  std::lock_guard<std::mutex> lock(g_ranges_mutex);
  auto it = g_ranges.upper_bound(begin);
  if (it == g_ranges.begin()) return false;
  --it;
  return begin >= it->first && end <= it->second;
}

void host_register(int64_t ptr, int64_t nbytes) {
  TORCH_CHECK(ptr != 0 && nbytes > 0, "host_register needs a pointer and a positive size");
  C10_CUDA_CHECK(cudaHostRegister(reinterpret_cast<void*>(ptr), static_cast<size_t>(nbytes),
                                  cudaHostRegisterPortable | cudaHostRegisterMapped));
  void* device_ptr = nullptr;
  C10_CUDA_CHECK(cudaHostGetDevicePointer(&device_ptr, reinterpret_cast<void*>(ptr), 0));
  if (device_ptr != reinterpret_cast<void*>(ptr)) {
    C10_CUDA_CHECK(cudaHostUnregister(reinterpret_cast<void*>(ptr)));
    TORCH_CHECK(false, "registered host memory has a different device address (no UVA): unsupported");
  }
  std::lock_guard<std::mutex> lock(g_ranges_mutex);
  g_ranges[static_cast<uintptr_t>(ptr)] = static_cast<uintptr_t>(ptr + nbytes);
}

void host_unregister(int64_t ptr) {
  {
    std::lock_guard<std::mutex> lock(g_ranges_mutex);
    TORCH_CHECK(g_ranges.erase(static_cast<uintptr_t>(ptr)) == 1, "host_unregister of an unknown pointer");
  }
  C10_CUDA_CHECK(cudaHostUnregister(reinterpret_cast<void*>(ptr)));
}

// The host pool is read and written by kernels through UVA: it must be page-locked host memory
// whose device address equals its host address.
void check_host_pool(const Tensor& pool, int64_t row_bytes, cudaStream_t stream) {
  TORCH_CHECK(pool.device().is_cpu(), "host_pool must be a CPU (pinned) tensor, got ",
              pool.device().str().c_str());
  TORCH_CHECK(pool.scalar_type() == at::kByte, "host_pool must be uint8, got ", pool.scalar_type());
  TORCH_CHECK(pool.dim() == 2, "host_pool must be [rows, row_bytes], got ", dims(pool.sizes()).c_str());
  TORCH_CHECK(pool.is_contiguous(), "host_pool must be contiguous");
  TORCH_CHECK(pool.size(1) == row_bytes, "host_pool rows are ", num(pool.size(1)).c_str(),
              " bytes, hot rows are ", num(row_bytes).c_str());
  TORCH_CHECK(pool.numel() > 0, "host_pool is empty");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(pool.data_ptr()) % 16 == 0, "host_pool must be 16-byte aligned");
  const auto begin = reinterpret_cast<uintptr_t>(pool.data_ptr());
  if (in_registered_range(begin, begin + static_cast<uintptr_t>(pool.numel()))) return;
  // Other pinned memory (pin_memory(), cudaHostAlloc): ask the driver, outside graph capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone) {
    cudaPointerAttributes attr{};
    C10_CUDA_CHECK(cudaPointerGetAttributes(&attr, pool.data_ptr()));
    TORCH_CHECK(attr.type == cudaMemoryTypeHost,
                "host_pool is not page-locked: allocate it with HostPool or pin_memory()");
    TORCH_CHECK(attr.devicePointer == pool.data_ptr(),
                "host_pool's device address differs from its host address (no UVA mapping)");
  }
}

void check_rows(const Tensor& hot, const at::Device& device) {
  check_device_tensor(hot, "hot", at::kByte, 2, device);
  TORCH_CHECK(hot.size(1) % 16 == 0 && hot.size(1) > 0, "hot row bytes must be a positive multiple of 16, got ",
              num(hot.size(1)).c_str());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(hot.data_ptr()) % 16 == 0, "hot must be 16-byte aligned");
  TORCH_CHECK(hot.size(0) <= INT32_MAX, "hot has more rows than int32 row ids can address");
}

// Kernel switches, read at every launch so tests and benchmarks can compare the variants in one
// process (defaults are the tuned choice):
//   HISPARSE_RESOLVE_KERNEL=general          the general resolve even where the fast form fits
//   HISPARSE_GATHER_KERNEL=lines|chunks|bulk  the plan copy of a full grid (rows >= 128 B)
//   HISPARSE_PREFETCH_KERNEL=wide|deep|async|exclusive|bulk|lines|chunks   the copy of a capped grid (max_blocks > 0)
//   HISPARSE_EXCLUSIVE_SMEM=bytes            shared memory the exclusive copy holds (default: all)
//   HISPARSE_BULK_STAGES=2|4                 shared-memory stages per bulk or async copy block
//   HISPARSE_COPY_GRID=per_row,row_groups    the full-grid plan copy's grid (probes)
enum class CopyKind { kLines, kChunks, kWide, kDeep, kBulk, kExclusive, kAsync };

std::string env_or(const char* name, const char* fallback) {
  const char* env = std::getenv(name);
  return env != nullptr ? std::string(env) : std::string(fallback);
}

CopyKind parse_copy_kind(const std::string& v, CopyKind fallback) {
  if (v == "chunks") return CopyKind::kChunks;
  if (v == "lines") return CopyKind::kLines;
  if (v == "wide") return CopyKind::kWide;
  if (v == "deep") return CopyKind::kDeep;
  if (v == "bulk") return CopyKind::kBulk;
  if (v == "exclusive") return CopyKind::kExclusive;
  if (v == "async") return CopyKind::kAsync;
  return fallback;
}

CopyKind gather_copy_kind() { return parse_copy_kind(env_or("HISPARSE_GATHER_KERNEL", "lines"), CopyKind::kLines); }

CopyKind prefetch_copy_kind() { return parse_copy_kind(env_or("HISPARSE_PREFETCH_KERNEL", "deep"), CopyKind::kDeep); }

int max_optin_smem() {
  return at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin;
}

// Shared memory the exclusive copy holds per block (HISPARSE_EXCLUSIVE_SMEM bytes; default: all of it).
size_t exclusive_smem() {
  const size_t max_smem = static_cast<size_t>(max_optin_smem());
  const long long v = std::atoll(env_or("HISPARSE_EXCLUSIVE_SMEM", "0").c_str());
  return v > 0 ? std::min(static_cast<size_t>(v), max_smem) : max_smem;
}

// HISPARSE_COPY_GRID="per_row,row_groups" (benchmarks and probes only): the full-grid plan copy's
// grid, to measure how the number of rows and entries in flight moves a copy from a large pool.
void copy_grid_override(int64_t rows, int64_t worst_blocks, int64_t* per_row, int64_t* row_groups) {
  const std::string v = env_or("HISPARSE_COPY_GRID", "");
  const size_t comma = v.find(',');
  if (comma == std::string::npos) return;
  const long long p = std::atoll(v.substr(0, comma).c_str());
  const long long g = std::atoll(v.substr(comma + 1).c_str());
  if (p > 0) *per_row = std::min<int64_t>(p, std::max<int64_t>(1, worst_blocks));
  if (g > 0) *row_groups = std::min<int64_t>(g, std::max<int64_t>(1, rows));
}

int bulk_stages() { return env_or("HISPARSE_BULK_STAGES", "4") == "2" ? 2 : 4; }

bool use_fast_resolve(int k, int h) {
  return hisparse::resolve_fast_fits(k, h) && env_or("HISPARSE_RESOLVE_KERNEL", "fast") != "general";
}

// The hash table size and dynamic shared memory of one resolve launch on the current device.
size_t resolve_launch_smem(int k, int h, bool fast, int* table_bits) {
  *table_bits = fast ? hisparse::resolve_fast_table_bits(k, h, static_cast<size_t>(max_optin_smem()))
                     : hisparse::resolve_table_bits(k);
  return fast ? hisparse::resolve_fast_smem_bytes(k, h, *table_bits) : hisparse::resolve_smem_bytes(k, h, *table_bits);
}

// Raises a kernel's dynamic shared-memory limit once per device and size (a host-side cost).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t smem, int dev_index, size_t (&configured)[256]) {
  if (dev_index < 0 || dev_index >= 256 || configured[dev_index] < smem) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    if (dev_index >= 0 && dev_index < 256) configured[dev_index] = smem;
  }
}

// Launches a copy grid and checks the launch.
template <typename... KArgs, typename... Args>
void launch_copy(void (*kernel)(KArgs...), dim3 grid, int threads, size_t smem, cudaStream_t stream, Args... args) {
  kernel<<<grid, threads, smem, stream>>>(args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}


// ------------------------------------------------------------------------------------------------
void launch_resolve(const Tensor& topk, const Tensor& newest, const Tensor& num_real_reqs, const Tensor& dgi,
                    const Tensor& lru, const Tensor& hot_rows, const Tensor& plan_src, const Tensor& plan_dst, const Tensor& plan_count,
                    const Tensor& counters, const std::optional<Tensor>& miss_mask, int64_t region_stride,
                    int64_t pool_rows, cudaStream_t stream) {
  const at::Device device = topk.device();
  check_device_tensor(topk, "topk", at::kInt, 2, device);
  const int64_t B = topk.size(0);
  const int64_t K = topk.size(1);
  check_device_tensor(newest, "newest", at::kInt, 1, device);
  check_shape(newest, "newest", {B});
  check_num_real(num_real_reqs, device);
  check_device_tensor(dgi, "dgi", at::kInt, 2, device);
  TORCH_CHECK(dgi.size(0) == B, "dgi has ", num(dgi.size(0)).c_str(), " rows, topk has ", num(B).c_str());
  const int64_t H = dgi.size(1);
  check_device_tensor(lru, "lru", at::kShort, 2, device);
  check_shape(lru, "lru", {B, H});
  check_device_tensor(hot_rows, "hot_rows", at::kInt, 2, device);
  check_shape(hot_rows, "hot_rows", {B, K});
  check_device_tensor(plan_src, "plan_src", at::kInt, 2, device);
  check_shape(plan_src, "plan_src", {B, K});
  check_device_tensor(plan_dst, "plan_dst", at::kInt, 2, device);
  check_shape(plan_dst, "plan_dst", {B, K});
  check_device_tensor(plan_count, "plan_count", at::kInt, 1, device);
  check_shape(plan_count, "plan_count", {B});
  check_device_tensor(counters, "counters", at::kLong, 1, device);
  check_shape(counters, "counters", {2});
  if (miss_mask.has_value()) {
    check_device_tensor(*miss_mask, "miss_mask", at::kByte, 2, device);
    check_shape(*miss_mask, "miss_mask", {B, K});
  }
  TORCH_CHECK(K >= 1, "top-k width must be positive");
  TORCH_CHECK(H >= K, "H=", num(H).c_str(), " must be >= K=", num(K).c_str());
  TORCH_CHECK(H < 32767, "H=", num(H).c_str(), " must be < 32767 (int16 slot ids)");
  TORCH_CHECK(region_stride >= H + 1, "region_stride=", num(region_stride).c_str(), " must be >= H + 1 = ", num(H + 1).c_str());
  TORCH_CHECK(B * region_stride <= INT32_MAX, "hot row ids overflow int32");
  TORCH_CHECK(pool_rows >= 0, "pool_rows must be >= 0");
  if (B == 0) return;

  hisparse::ResolveParams p;
  p.topk = topk.data_ptr<int32_t>();
  p.newest = newest.data_ptr<int32_t>();
  p.num_real_reqs = num_real_reqs.data_ptr<int32_t>();
  p.dgi = dgi.data_ptr<int32_t>();
  p.lru = lru.data_ptr<int16_t>();
  p.hot_rows = hot_rows.data_ptr<int32_t>();
  p.plan_src = plan_src.data_ptr<int32_t>();
  p.plan_dst = plan_dst.data_ptr<int32_t>();
  p.plan_count = plan_count.data_ptr<int32_t>();
  p.counters = reinterpret_cast<unsigned long long*>(counters.data_ptr<int64_t>());
  p.miss_mask = miss_mask.has_value() ? miss_mask->data_ptr<uint8_t>() : nullptr;
  p.num_rows = static_cast<int>(B);
  p.k = static_cast<int>(K);
  p.h = static_cast<int>(H);
  p.region_stride = static_cast<int>(region_stride);
  p.pool_rows = pool_rows;
  p.bitonic_max = hisparse::kFastBitonicMax;

  const bool fast = use_fast_resolve(p.k, p.h);
  const size_t smem = resolve_launch_smem(p.k, p.h, fast, &p.table_bits);
  TORCH_CHECK(smem <= static_cast<size_t>(max_optin_smem()), "resolve needs ", num(static_cast<int64_t>(smem)).c_str(),
              " bytes of shared memory for K=", num(K).c_str(), ", H=", num(H).c_str(), "; the device allows ",
              num(max_optin_smem()).c_str());
  static size_t configured_general[256] = {};
  static size_t configured_fast[hisparse::kFastInstances][256] = {};
  if (fast) {
    const hisparse::ResolveKernelFn kernel = hisparse::resolve_fast_kernel_for(p.k, p.h);
    allow_smem(kernel, smem, device.index(), configured_fast[hisparse::resolve_fast_instance(p.k, p.h)]);
    kernel<<<static_cast<unsigned>(B), hisparse::kFastThreads, smem, stream>>>(p);
  } else {
    allow_smem(hisparse::hisparse_resolve_kernel, smem, device.index(), configured_general);
    hisparse::hisparse_resolve_kernel<<<static_cast<unsigned>(B), hisparse::kResolveThreads, smem, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_gather(const Tensor& host_pool, const Tensor& hot, const Tensor& plan_src, const Tensor& plan_dst,
                   const Tensor& plan_count, const Tensor& num_real_reqs, int64_t max_blocks,
                   cudaStream_t stream) {
  const at::Device device = hot.device();
  check_rows(hot, device);
  check_host_pool(host_pool, hot.size(1), stream);
  check_device_tensor(plan_src, "plan_src", at::kInt, 2, device);
  const int64_t B = plan_src.size(0);
  const int64_t K = plan_src.size(1);
  check_device_tensor(plan_dst, "plan_dst", at::kInt, 2, device);
  check_shape(plan_dst, "plan_dst", {B, K});
  check_device_tensor(plan_count, "plan_count", at::kInt, 1, device);
  check_shape(plan_count, "plan_count", {B});
  check_num_real(num_real_reqs, device);
  TORCH_CHECK(B <= 65535, "at most 65535 request rows per launch, got ", num(B).c_str());
  TORCH_CHECK(max_blocks >= 0 && max_blocks <= (1 << 20), "max_blocks must be in [0, 2^20], got ",
              num(max_blocks).c_str());
  TORCH_CHECK(K * (hot.size(1) / 16) < INT32_MAX, "K x row chunks overflows int32");
  if (B == 0 || K == 0) return;

  hisparse::GatherParams p;
  p.host_pool = host_pool.data_ptr<uint8_t>();
  p.pool_rows = host_pool.size(0);
  p.hot = hot.data_ptr<uint8_t>();
  p.hot_rows = hot.size(0);
  p.row_bytes = static_cast<int>(hot.size(1));
  p.plan_src = plan_src.data_ptr<int32_t>();
  p.plan_dst = plan_dst.data_ptr<int32_t>();
  p.plan_count = plan_count.data_ptr<int32_t>();
  p.num_real_reqs = num_real_reqs.data_ptr<int32_t>();
  p.num_rows = static_cast<int>(B);
  p.k = static_cast<int>(K);
  p.batch_rows = static_cast<int>(std::clamp<int64_t>(INT32_MAX / std::max<int64_t>(1, K * (hot.size(1) / 16)), 1,
                                                      hisparse::kDeepBatchRows));

  // By default enough blocks to fill the chip when every row misses everything, but no more per row
  // than its worst case needs. A prefetch that overlaps compute passes a small max_blocks: then a
  // few blocks walk several rows each and leave the other SMs to the compute. Depends only on
  // shapes, so a captured graph stays valid for any batch.
  //
  // Which copy: rows of at least 128 B use the line-aligned copy (a warp per plan entry, adjacent
  // source rows merged into whole lines); smaller rows the per-chunk copy (a thread per 16 B chunk).
  // A capped grid (prefetch, max_blocks > 0) uses the deep copy: 1024 threads per block, each
  // block's rows flattened into one list, 128 KiB in flight per block. Alone, 8 blocks of the wide
  // copy (64 KiB each) already fill the link; beside an HBM-bound kernel the PCIe reads wait longer
  // and that copy slowed by half, while about 1 MiB in flight kept its rate (kernels/results/NOTES.md).
  // The wide, exclusive, bulk and async copies are measured beside it by the benchmark.
  const int64_t chunks = p.row_bytes / 16;
  CopyKind kind = chunks >= 8 ? gather_copy_kind() : CopyKind::kChunks;
  if (max_blocks > 0 && chunks >= 8) kind = prefetch_copy_kind();
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  if (kind == CopyKind::kBulk || kind == CopyKind::kAsync) {
    const int rows_per_stage = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(32, 8192 / p.row_bytes)));
    const int stage_bytes = hisparse::bulk_stage_bytes(p.row_bytes, rows_per_stage);
    const int stages = bulk_stages();
    const size_t smem = hisparse::bulk_smem_bytes(stage_bytes, stages);
    TORCH_CHECK(smem <= static_cast<size_t>(max_optin_smem()), "staged plan copy needs ",
                num(static_cast<int64_t>(smem)).c_str(), " bytes of shared memory for ", num(p.row_bytes).c_str(),
                " B rows; the device allows ", num(max_optin_smem()).c_str());
    // Worst case: every row's K entries, in groups of rows_per_stage.
    const int64_t groups = B * ((K + rows_per_stage - 1) / rows_per_stage);
    const int64_t target = max_blocks > 0 ? max_blocks : int64_t(sms) * 6;
    const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min(groups, target)));
    static size_t configured2[256] = {};
    static size_t configured4[256] = {};
    static size_t configured_async2[256] = {};
    static size_t configured_async4[256] = {};
    if (kind == CopyKind::kAsync && stages == 2) {
      allow_smem(hisparse::hisparse_gather_plan_async_kernel<2>, smem, device.index(), configured_async2);
      launch_copy(hisparse::hisparse_gather_plan_async_kernel<2>, dim3(blocks), hisparse::kBulkThreads, smem, stream, p,
                    rows_per_stage, stage_bytes);
    } else if (kind == CopyKind::kAsync) {
      allow_smem(hisparse::hisparse_gather_plan_async_kernel<4>, smem, device.index(), configured_async4);
      launch_copy(hisparse::hisparse_gather_plan_async_kernel<4>, dim3(blocks), hisparse::kBulkThreads, smem, stream, p,
                    rows_per_stage, stage_bytes);
    } else if (stages == 2) {
      allow_smem(hisparse::hisparse_gather_plan_bulk_kernel<2>, smem, device.index(), configured2);
      launch_copy(hisparse::hisparse_gather_plan_bulk_kernel<2>, dim3(blocks), hisparse::kBulkThreads, smem, stream, p,
                    rows_per_stage, stage_bytes);
    } else {
      allow_smem(hisparse::hisparse_gather_plan_bulk_kernel<4>, smem, device.index(), configured4);
      launch_copy(hisparse::hisparse_gather_plan_bulk_kernel<4>, dim3(blocks), hisparse::kBulkThreads, smem, stream, p,
                    rows_per_stage, stage_bytes);
    }
    return;
  }
  int threads = hisparse::kCopyThreads;
  int64_t per_block = 0;
  int64_t work = K * chunks;
  switch (kind) {
    case CopyKind::kLines:
      per_block = int64_t(hisparse::kCopyThreads / 32) * hisparse::kLineEntries;
      work = K;
      break;
    case CopyKind::kWide:
    case CopyKind::kExclusive:
      threads = hisparse::kWideCopyThreads;
      per_block = int64_t(hisparse::kWideCopyThreads) * hisparse::kWideCopyUnroll;
      break;
    case CopyKind::kDeep:
      threads = hisparse::kDeepCopyThreads;
      per_block = int64_t(hisparse::kDeepCopyThreads) * hisparse::kWideCopyUnroll;
      break;
    default:
      per_block = int64_t(hisparse::kCopyThreads) * hisparse::kCopyUnroll;
      break;
  }
  const int64_t worst_blocks = (work + per_block - 1) / per_block;
  const int64_t target = max_blocks > 0 ? max_blocks : int64_t(sms) * hisparse::kCopyBlocksPerSM;
  int64_t row_groups = std::min<int64_t>(B, target);
  int64_t per_row = std::max<int64_t>(1, std::min(worst_blocks, target / row_groups));
  if (max_blocks == 0) copy_grid_override(B, worst_blocks, &per_row, &row_groups);
  dim3 grid(static_cast<unsigned>(per_row), static_cast<unsigned>(row_groups));
  switch (kind) {
    case CopyKind::kLines:
      launch_copy(hisparse::hisparse_gather_plan_lines_kernel<false>, grid, threads, 0, stream, p);
      break;
    case CopyKind::kWide:
      launch_copy(hisparse::hisparse_gather_plan_kernel<hisparse::kWideCopyThreads, hisparse::kWideCopyUnroll>, grid,
                    threads, 0, stream, p);
      break;
    case CopyKind::kDeep:
      launch_copy(hisparse::hisparse_gather_plan_deep_kernel<hisparse::kDeepCopyThreads, hisparse::kWideCopyUnroll>,
                    grid, threads, 0, stream, p);
      break;
    case CopyKind::kExclusive: {
      // The wide copy holding all of an SM's shared memory (unused): no block that needs shared
      // memory (a GEMM's) is placed beside it, so the copy takes a few whole SMs instead of slowing
      // the compute's blocks on every SM it shares.
      const size_t smem = exclusive_smem();
      static size_t configured_excl[256] = {};
      allow_smem(hisparse::hisparse_gather_plan_exclusive_kernel, smem, device.index(), configured_excl);
      launch_copy(hisparse::hisparse_gather_plan_exclusive_kernel, grid, threads, smem, stream, p);
      break;
    }
    default:
      launch_copy(hisparse::hisparse_gather_plan_kernel<hisparse::kCopyThreads, hisparse::kCopyUnroll>, grid, threads, 0,
                    stream, p);
      break;
  }
}

// vLLM's host_cache argument: pinned CPU memory read through UVA (the check asks the driver outside
// graph capture unless host_register recorded the range), contiguous 2D rows of the hot cache's row
// width, 16-byte aligned. vLLM's ops refuse a device tensor here too.
void check_vllm_host_cache(const Tensor& host_cache, int64_t row_bytes, cudaStream_t stream) {
  TORCH_CHECK(host_cache.device().is_cpu(), "host_cache must be pinned CPU memory, got ",
              host_cache.device().str().c_str());
  TORCH_CHECK(host_cache.dim() == 2 && host_cache.is_contiguous(), "host_cache must be contiguous 2D, got ",
              dims(host_cache.sizes()).c_str());
  TORCH_CHECK(host_cache.size(1) * host_cache.element_size() == row_bytes, "host_cache row width mismatch: ",
              num(host_cache.size(1) * host_cache.element_size()).c_str(), " bytes against hot rows of ",
              num(row_bytes).c_str());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(host_cache.data_ptr()) % 16 == 0, "host_cache must be 16-byte aligned");
  const auto begin = reinterpret_cast<uintptr_t>(host_cache.data_ptr());
  if (host_cache.numel() > 0 && !in_registered_range(begin, begin + static_cast<uintptr_t>(host_cache.nbytes()))) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusNone) {
      cudaPointerAttributes attr{};
      const cudaError_t status = cudaPointerGetAttributes(&attr, host_cache.data_ptr());
      if (status != cudaSuccess) cudaGetLastError();
      TORCH_CHECK(status == cudaSuccess && attr.type == cudaMemoryTypeHost && attr.devicePointer == host_cache.data_ptr(),
                  "host_cache must be pinned CPU memory (page-locked, one address on host and device)");
    }
  }
}

// The copy behind vLLM's gather_compact and gather_plan (the plan copy's choice): rows of at least
// 128 B take the line-aligned copy (a warp per entry, adjacent source rows merged into whole host
// lines), smaller rows the per-chunk copy. HISPARSE_COMPACT_KERNEL=chunks|chunks8 (benchmarks) forces
// the per-chunk copy, 8 loads in flight per thread with chunks8. The grid is the plan copy's: the
// chip's SMs x kCopyBlocksPerSM blocks split over the rows, no more per row than K entries need;
// shape-only, so a captured graph serves any batch.
void launch_vllm_copy(const hisparse::VllmCopyParams& p, cudaStream_t stream) {
  const std::string kind = env_or("HISPARSE_COMPACT_KERNEL", "lines");
  const bool lines = p.row_bytes >= 128 && kind == "lines";
  const bool deep = kind == "chunks8";
  const int threads = deep ? 512 : hisparse::kCopyThreads;
  const int64_t per_block = lines ? int64_t(hisparse::kCopyThreads / 32) * hisparse::kLineEntries
                                  : int64_t(threads) * (deep ? 8 : hisparse::kCopyUnroll);
  const int64_t work = lines ? p.k : int64_t(p.k) * (p.row_bytes / 16);
  const int64_t worst_blocks = (work + per_block - 1) / per_block;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t target = int64_t(sms) * hisparse::kCopyBlocksPerSM;
  int64_t row_groups = std::min<int64_t>(p.num_rows, target);
  int64_t per_row = std::max<int64_t>(1, std::min(worst_blocks, target / row_groups));
  copy_grid_override(p.num_rows, worst_blocks, &per_row, &row_groups);
  const dim3 grid(static_cast<unsigned>(per_row), static_cast<unsigned>(row_groups));
  if (lines) {
    hisparse::GatherParams g;
    g.host_pool = p.host;
    g.pool_rows = p.host_rows;
    g.hot = p.hot;
    g.hot_rows = p.hot_rows;
    g.row_bytes = p.row_bytes;
    g.plan_src = p.src;
    g.plan_dst = p.dst;
    g.plan_count = p.counts;
    g.num_real_reqs = nullptr;  // every row
    g.num_rows = p.num_rows;
    g.k = p.k;
    g.batch_rows = 1;
    g.block_size = p.block_size;
    g.block_stride = p.block_stride;
    g.mask = p.mask;
    g.rsi = p.rsi;
    g.attention = p.attention;
    g.att_row_stride = p.att_row_stride;
    g.attention_block_stride = p.attention_block_stride;
    launch_copy(hisparse::hisparse_gather_plan_lines_kernel<true>, grid, threads, 0, stream, g);
  } else if (deep) {
    launch_copy(hisparse::hisparse_vllm_copy_kernel<512, 8>, grid, threads, 0, stream, p);
  } else {
    launch_copy(hisparse::hisparse_vllm_copy_kernel<hisparse::kCopyThreads, hisparse::kCopyUnroll>, grid, threads, 0,
                stream, p);
  }
}

// vLLM 0.33's hisparse_gather_compact schema and checks, on our copy. Tensors are judged as vLLM's
// op judges them (any hot dtype: rows are bytes); an error names the argument and what it got.
// Unlike vLLM's op, rows and blocks must be 16-byte aligned (vLLM falls back to narrower copies).
void vllm_gather_compact(const Tensor& host_cache, const Tensor& hot_cache, const Tensor& miss_global_indices,
                         const Tensor& miss_hot_indices, const Tensor& miss_counts) {
  TORCH_CHECK(hot_cache.is_cuda(), "hot_cache must be on CUDA, got ", hot_cache.device().str().c_str());
  const at::Device device = hot_cache.device();
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  TORCH_CHECK(hot_cache.dim() == 3, "hot_cache must be [num_blocks, block_size, row_width], got ",
              dims(hot_cache.sizes()).c_str());
  const int64_t elem = hot_cache.element_size();
  const int64_t row_bytes = hot_cache.size(2) * elem;
  TORCH_CHECK(row_bytes % 16 == 0 && row_bytes > 0, "KV rows must be 16-byte aligned: hot_cache rows are ",
              num(row_bytes).c_str(), " bytes");
  TORCH_CHECK(hot_cache.stride(2) == 1 && hot_cache.stride(1) * elem == row_bytes,
              "hot-cache rows must be contiguous: hot_cache strides are ", dims(hot_cache.strides()).c_str());
  const int64_t block_stride = hot_cache.stride(0) * elem;
  TORCH_CHECK(block_stride % 16 == 0 && reinterpret_cast<uintptr_t>(hot_cache.data_ptr()) % 16 == 0,
              "hot_cache blocks must start 16-byte aligned (block stride ", num(block_stride).c_str(), " bytes)");
  check_vllm_host_cache(host_cache, row_bytes, stream);
  check_device_tensor(miss_global_indices, "miss_global_indices", at::kInt, 2, device);
  const int64_t n = miss_global_indices.size(0);
  const int64_t k = miss_global_indices.size(1);
  check_device_tensor(miss_hot_indices, "miss_hot_indices", at::kInt, 2, device);
  check_shape(miss_hot_indices, "miss_hot_indices", {n, k});
  TORCH_CHECK(miss_counts.is_cuda() && miss_counts.device() == device, "miss_counts must be on ", device.str().c_str(),
              ", got ", miss_counts.device().str().c_str());
  TORCH_CHECK(miss_counts.scalar_type() == at::kInt && miss_counts.is_contiguous(),
              "miss_counts must be contiguous int32, got ", miss_counts.scalar_type());
  TORCH_CHECK(miss_counts.numel() >= n, "miss_counts holds ", num(miss_counts.numel()).c_str(), " counts for ",
              num(n).c_str(), " rows");
  if (n == 0 || k == 0) return;
  TORCH_CHECK(n <= 65535, "at most 65535 rows per launch, got ", num(n).c_str());
  TORCH_CHECK(k * (row_bytes / 16) < INT32_MAX, "top_k x row chunks overflows int32");
  const int64_t hot_rows = hot_cache.size(0) * hot_cache.size(1);
  TORCH_CHECK(hot_rows < INT32_MAX, "hot indices must fit int32");

  hisparse::VllmCopyParams p;
  p.host = static_cast<const uint8_t*>(host_cache.data_ptr());
  p.host_rows = host_cache.size(0);
  p.hot = static_cast<uint8_t*>(hot_cache.data_ptr());
  p.hot_rows = hot_rows;
  p.block_stride = block_stride;
  p.block_size = static_cast<int>(std::max<int64_t>(1, hot_cache.size(1)));
  p.row_bytes = static_cast<int>(row_bytes);
  p.src = miss_global_indices.data_ptr<int32_t>();
  p.dst = miss_hot_indices.data_ptr<int32_t>();
  p.counts = miss_counts.data_ptr<int32_t>();
  p.num_rows = static_cast<int>(n);
  p.k = static_cast<int>(k);
  if (p.hot_rows == 0) return;
  launch_vllm_copy(p, stream);
}

// vLLM 0.33's hisparse_gather_plan schema and checks, on our copy (launch_vllm_copy).
// As vLLM's op: rows of a multiple of 16 bytes, the source in pinned host memory, a 2D hot cache as
// block size 1; any hot dtype (rows are bytes).
void vllm_gather_plan(const Tensor& host_cache, const Tensor& hot_cache, const Tensor& global_indices,
                      const Tensor& hot_indices, const Tensor& miss_mask, const std::optional<Tensor>& request_state_indices,
                      const std::optional<Tensor>& attention_indices, int64_t attention_block_stride) {
  TORCH_CHECK(hot_cache.is_cuda(), "hot_cache must be on CUDA, got ", hot_cache.device().str().c_str());
  const at::Device device = hot_cache.device();
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  TORCH_CHECK(hot_cache.dim() == 2 || hot_cache.dim() == 3,
              "hot_cache must be [num_blocks, block_size, row_width] (or 2D, block size 1), got ",
              dims(hot_cache.sizes()).c_str());
  const bool paged = hot_cache.dim() == 3;
  const int64_t elem = hot_cache.element_size();
  const int64_t row_bytes = hot_cache.size(hot_cache.dim() - 1) * elem;
  TORCH_CHECK(row_bytes % 16 == 0, "KV rows must be 16-byte aligned: hot_cache rows are ", num(row_bytes).c_str(),
              " bytes");
  TORCH_CHECK(hot_cache.stride(hot_cache.dim() - 1) == 1 && (!paged || hot_cache.stride(1) * elem == row_bytes),
              "hot-cache rows must be contiguous: hot_cache strides are ", dims(hot_cache.strides()).c_str());
  const int64_t block_size = paged ? hot_cache.size(1) : 1;
  const int64_t block_stride = hot_cache.stride(0) * elem;
  TORCH_CHECK(block_stride % 16 == 0 && reinterpret_cast<uintptr_t>(hot_cache.data_ptr()) % 16 == 0,
              "hot_cache blocks must start 16-byte aligned (block stride ", num(block_stride).c_str(), " bytes)");
  check_vllm_host_cache(host_cache, row_bytes, stream);
  check_device_tensor(global_indices, "global_indices", at::kInt, 2, device);
  const int64_t n = global_indices.size(0);
  const int64_t k = global_indices.size(1);
  check_device_tensor(hot_indices, "hot_indices", at::kInt, 2, device);
  check_shape(hot_indices, "hot_indices", {n, k});
  check_device_tensor(miss_mask, "miss_mask", at::kInt, 2, device);
  check_shape(miss_mask, "miss_mask", {n, k});
  if (request_state_indices) {
    check_device_tensor(*request_state_indices, "request_state_indices", at::kInt, 1, device);
    TORCH_CHECK(request_state_indices->numel() >= n, "request_state_indices holds ",
                num(request_state_indices->numel()).c_str(), " entries for ", num(n).c_str(), " rows");
  }
  if (attention_indices) {
    const Tensor& att = *attention_indices;
    TORCH_CHECK(att.is_cuda() && att.device() == device, "attention_indices must be on ", device.str().c_str(),
                ", got ", att.device().str().c_str());
    TORCH_CHECK(att.scalar_type() == at::kInt && att.dim() == 2, "attention_indices must be 2D int32, got ",
                att.scalar_type(), " ", dims(att.sizes()).c_str());
    TORCH_CHECK(att.size(0) == n && att.size(1) == k, "attention_indices has shape ", dims(att.sizes()).c_str(),
                ", expected [", num(n).c_str(), ", ", num(k).c_str(), "]");
    TORCH_CHECK(att.is_contiguous(), "attention_indices must be contiguous (as vLLM's op requires), got strides ",
                dims(att.strides()).c_str());
  }
  if (n == 0 || k == 0 || row_bytes == 0) return;
  TORCH_CHECK(n <= 65535, "at most 65535 rows per launch, got ", num(n).c_str());
  TORCH_CHECK(k * row_bytes < INT32_MAX, "top_k x row bytes overflows int32");
  const int64_t hot_rows = hot_cache.size(0) * block_size;
  TORCH_CHECK(hot_rows < INT32_MAX, "hot indices must fit int32");

  hisparse::VllmCopyParams p;
  p.host = static_cast<const uint8_t*>(host_cache.data_ptr());
  p.host_rows = host_cache.size(0);
  p.hot = static_cast<uint8_t*>(hot_cache.data_ptr());
  p.hot_rows = hot_rows;
  p.block_stride = block_stride;
  p.block_size = static_cast<int>(block_size);
  p.row_bytes = static_cast<int>(row_bytes);
  p.src = global_indices.data_ptr<int32_t>();
  p.dst = hot_indices.data_ptr<int32_t>();
  p.counts = nullptr;  // all K entries, by mask
  p.mask = miss_mask.data_ptr<int32_t>();
  p.rsi = request_state_indices ? request_state_indices->data_ptr<int32_t>() : nullptr;
  p.attention = attention_indices ? attention_indices->data_ptr<int32_t>() : nullptr;
  p.att_row_stride = attention_indices ? attention_indices->stride(0) : 0;
  p.attention_block_stride = static_cast<int>(attention_block_stride);
  p.num_rows = static_cast<int>(n);
  p.k = static_cast<int>(k);
  launch_vllm_copy(p, stream);
}

// ------------------------------------------------------------------------------------------------
void resolve(const Tensor& topk, const Tensor& newest, const Tensor& num_real_reqs, const Tensor& dgi, const Tensor& lru,
             const Tensor& hot_rows, const Tensor& plan_src, const Tensor& plan_dst, const Tensor& plan_count, const Tensor& counters,
             const std::optional<Tensor>& miss_mask, int64_t region_stride, int64_t pool_rows) {
  const c10::cuda::CUDAGuard guard(topk.device());
  launch_resolve(topk, newest, num_real_reqs, dgi, lru, hot_rows, plan_src, plan_dst, plan_count, counters,
                 miss_mask, region_stride, pool_rows, at::cuda::getCurrentCUDAStream());
}

void gather_plan(const Tensor& host_pool, const Tensor& hot, const Tensor& plan_src, const Tensor& plan_dst,
                 const Tensor& plan_count, const Tensor& num_real_reqs, int64_t max_blocks) {
  const c10::cuda::CUDAGuard guard(hot.device());
  launch_gather(host_pool, hot, plan_src, plan_dst, plan_count, num_real_reqs, max_blocks,
                at::cuda::getCurrentCUDAStream());
}

void swap_in(const Tensor& topk, const Tensor& newest, const Tensor& num_real_reqs, const Tensor& dgi, const Tensor& lru,
             const Tensor& hot_rows, const Tensor& plan_src, const Tensor& plan_dst, const Tensor& plan_count, const Tensor& counters,
             const std::optional<Tensor>& miss_mask, const Tensor& host_pool, const Tensor& hot, int64_t region_stride) {
  const c10::cuda::CUDAGuard guard(topk.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  TORCH_CHECK(hot.dim() == 2 && hot.size(0) >= topk.size(0) * region_stride, "hot has shape ", dims(hot.sizes()).c_str(), "; ",
              num(topk.size(0)).c_str(), " requests x region_stride ", num(region_stride).c_str(), " rows are needed");
  check_host_pool(host_pool, hot.size(1), stream);
  launch_resolve(topk, newest, num_real_reqs, dgi, lru, hot_rows, plan_src, plan_dst, plan_count, counters,
                 miss_mask, region_stride, host_pool.size(0), stream);
  launch_gather(host_pool, hot, plan_src, plan_dst, plan_count, num_real_reqs, 0, stream);
}

void backup_newest_rows(const Tensor& hot, const Tensor& host_pool, const Tensor& newest, const Tensor& num_real_reqs,
                        int64_t region_stride, int64_t hot_slot) {
  const c10::cuda::CUDAGuard guard(hot.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Device device = hot.device();
  check_rows(hot, device);
  check_host_pool(host_pool, hot.size(1), stream);
  check_device_tensor(newest, "newest", at::kInt, 1, device);
  check_num_real(num_real_reqs, device);
  TORCH_CHECK(region_stride > 0 && hot_slot >= 0 && hot_slot < region_stride, "hot_slot=", num(hot_slot).c_str(),
              " must lie in [0, region_stride=", num(region_stride).c_str(), ")");
  // DP and graph padding make the forward longer than slot_mapping: clamp to what both can hold.
  const int64_t rows = std::min<int64_t>(newest.size(0), hot.size(0) / region_stride);
  if (rows == 0) return;
  hisparse::BackupParams p;
  p.hot = hot.data_ptr<uint8_t>();
  p.host_pool = host_pool.data_ptr<uint8_t>();
  p.pool_rows = host_pool.size(0);
  p.row_bytes = static_cast<int>(hot.size(1));
  p.newest = newest.data_ptr<int32_t>();
  p.num_real_reqs = num_real_reqs.data_ptr<int32_t>();
  p.num_rows = static_cast<int>(rows);
  p.region_stride = static_cast<int>(region_stride);
  p.hot_slot = static_cast<int>(hot_slot);
  const unsigned blocks = static_cast<unsigned>((rows + hisparse::kBackupWarpsPerBlock - 1) /
                                                hisparse::kBackupWarpsPerBlock);
  hisparse::hisparse_backup_newest_kernel<<<blocks, hisparse::kBackupWarpsPerBlock * 32, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void invalidate_slots(const Tensor& dgi, const Tensor& block_ids, int64_t block_size) {
  const c10::cuda::CUDAGuard guard(dgi.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Device device = dgi.device();
  check_device_tensor(dgi, "dgi", at::kInt, 2, device);
  check_device_tensor(block_ids, "block_ids", at::kInt, 1, device);
  TORCH_CHECK(block_size > 0, "block_size must be positive, got ", num(block_size).c_str());
  const int64_t B = dgi.size(0);
  const int64_t M = block_ids.size(0);
  if (B == 0 || M == 0 || dgi.size(1) == 0) return;
  // At most kChunk ids per launch keeps the shared table at 32 KiB; more ids take more launches.
  constexpr int64_t kChunk = 4096;
  for (int64_t first = 0; first < M; first += kChunk) {
    const int64_t n = std::min(kChunk, M - first);
    hisparse::InvalidateParams p;
    p.dgi = dgi.data_ptr<int32_t>();
    p.block_ids = block_ids.data_ptr<int32_t>() + first;
    p.num_blocks = static_cast<int>(n);
    p.block_size = static_cast<int>(block_size);
    p.h = static_cast<int>(dgi.size(1));
    p.table_bits = hisparse::resolve_table_bits(static_cast<int>(n));
    const size_t smem = hisparse::invalidate_smem_bytes(p.table_bits);
    hisparse::hisparse_invalidate_kernel<<<static_cast<unsigned>(B), hisparse::kInvalidateThreads, smem, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// ------------------------------------------------------------------------------------------------
// Benchmark-only ops.
void check_bench_lists(const Tensor& host_pool, const Tensor& hot, const Tensor& src, const Tensor& dst,
                       cudaStream_t stream) {
  const at::Device device = hot.device();
  check_rows(hot, device);
  check_host_pool(host_pool, hot.size(1), stream);
  check_device_tensor(src, "src", at::kInt, 1, device);
  check_device_tensor(dst, "dst", at::kInt, 1, device);
  check_shape(dst, "dst", {src.size(0)});
}

void bench_flat_gather(const Tensor& host_pool, const Tensor& hot, const Tensor& src, const Tensor& dst) {
  const c10::cuda::CUDAGuard guard(hot.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  check_bench_lists(host_pool, hot, src, dst, stream);
  const int64_t n = src.size(0);
  if (n == 0) return;
  const int64_t total = n * (hot.size(1) / 16);
  TORCH_CHECK(total < INT32_MAX, "rows x chunks overflows int32");
  const int64_t per_block = int64_t(hisparse::kCopyThreads) * hisparse::kCopyUnroll;
  const int64_t chip_blocks = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 8;
  const int64_t blocks = std::max<int64_t>(1, std::min((total + per_block - 1) / per_block, chip_blocks));
  hisparse::hisparse_bench_flat_gather_kernel<<<static_cast<unsigned>(blocks), hisparse::kCopyThreads, 0, stream>>>(
      host_pool.data_ptr<uint8_t>(), hot.data_ptr<uint8_t>(), static_cast<int>(hot.size(1)),
      src.data_ptr<int32_t>(), dst.data_ptr<int32_t>(), static_cast<int>(n));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void bench_warp_gather(const Tensor& host_pool, const Tensor& hot, const Tensor& src, const Tensor& dst) {
  const c10::cuda::CUDAGuard guard(hot.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  check_bench_lists(host_pool, hot, src, dst, stream);
  const int64_t n = src.size(0);
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>((n * 32 + 255) / 256);
  hisparse::hisparse_bench_warp_gather_kernel<<<blocks, 256, 0, stream>>>(
      host_pool.data_ptr<uint8_t>(), hot.data_ptr<uint8_t>(), static_cast<int>(hot.size(1)),
      src.data_ptr<int32_t>(), dst.data_ptr<int32_t>(), static_cast<int>(n));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void bench_launch_only(const Tensor& num_real_reqs, const Tensor& sink, int64_t blocks, int64_t threads,
                       int64_t smem) {
  const c10::cuda::CUDAGuard guard(sink.device());
  check_num_real(num_real_reqs, sink.device());
  check_device_tensor(sink, "sink", at::kInt, 1, sink.device());
  TORCH_CHECK(blocks > 0 && sink.numel() >= 1, "launch_only needs blocks > 0 and a sink");
  TORCH_CHECK(threads > 0 && threads <= 1024 && smem >= 0 && smem <= max_optin_smem(),
              "launch_only needs 1..1024 threads and at most the device's shared memory");
  static size_t configured[256] = {};
  allow_smem(hisparse::hisparse_bench_launch_only_kernel, static_cast<size_t>(smem), sink.device().index(), configured);
  hisparse::hisparse_bench_launch_only_kernel<<<static_cast<unsigned>(blocks), static_cast<unsigned>(threads),
                                                static_cast<size_t>(smem), at::cuda::getCurrentCUDAStream()>>>(
      num_real_reqs.data_ptr<int32_t>(), sink.data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The dynamic shared memory resolve launches with for (K, H) here (for the launch-floor kernel of
// the benchmark, which is shaped like the resolve).
int64_t bench_resolve_smem(int64_t k, int64_t h) {
  TORCH_CHECK(k >= 1 && h >= k && h < 32767, "bench_resolve_smem needs 1 <= K <= H < 32767");
  int table_bits = 0;
  const int ki = static_cast<int>(k);
  const int hi = static_cast<int>(h);
  return static_cast<int64_t>(resolve_launch_smem(ki, hi, use_fast_resolve(ki, hi), &table_bits));
}

}  // namespace

TORCH_LIBRARY_IMPL(hisparse, CompositeExplicitAutograd, m) {
  m.impl("host_register", &host_register);
  m.impl("host_unregister", &host_unregister);
  m.impl("bench_resolve_smem", &bench_resolve_smem);
}

TORCH_LIBRARY_IMPL(hisparse, CUDA, m) {
  m.impl("resolve", &resolve);
  m.impl("gather_plan", &gather_plan);
  m.impl("vllm_gather_compact", &vllm_gather_compact);
  m.impl("vllm_gather_plan", &vllm_gather_plan);
  m.impl("swap_in", &swap_in);
  m.impl("backup_newest_rows", &backup_newest_rows);
  m.impl("invalidate_slots", &invalidate_slots);
  m.impl("bench_flat_gather", &bench_flat_gather);
  m.impl("bench_warp_gather", &bench_warp_gather);
  m.impl("bench_launch_only", &bench_launch_only);
}
