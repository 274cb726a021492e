// Where the fast resolve spends its time: clock64() at each phase boundary of every block (thread 0's
// view, so a barrier's wait for the slowest warp is charged to the phase before it), for all-hit and
// all-miss steps. Standalone (no torch):
//   nvcc -arch=sm_90 -O3 -I../hisparse_kernels/csrc resolve_phases.cu -o resolve_phases && ./resolve_phases
#define HISPARSE_PHASE_CLOCKS 1
#include "hot_buffer.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e = (x);                                                              \
    if (e != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

constexpr int kNumPhases = 10;
static const char* kPhases[kNumPhases] = {
    "first load (batch size)", "clear + stage (barrier 1)", "insert + slot_first (2)", "LRU walk (3)",
    "counts + scan (4)", "new LRU ranks + LRU out (5)", "misses take slots", "hot rows + miss mask out",
    "(nothing since the LRU goes out at 5)", "plan sort + plan out"};

static void run(int B, int K, int H, int steps, bool small_table = false, int bitonic_max = hisparse::kFastBitonicMax) {
  const int region_stride = (H + 1 + 127) / 128 * 128;
  std::mt19937 rng(1234);
  std::vector<int32_t> topk(size_t(B) * K);
  {
    std::vector<int32_t> pool(1 << 22);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    std::copy(pool.begin(), pool.begin() + topk.size(), topk.begin());
  }
  std::vector<int32_t> dgi(size_t(B) * H, -1);
  std::vector<int16_t> lru(size_t(B) * H);
  for (int r = 0; r < B; ++r)
    for (int i = 0; i < H; ++i) lru[size_t(r) * H + i] = static_cast<int16_t>(i);
  std::vector<int32_t> newest(B, -1);
  int32_t *d_topk, *d_newest, *d_real, *d_dgi, *d_rows, *d_src, *d_dst, *d_count;
  int16_t* d_lru;
  unsigned long long* d_counters;
  CHECK(cudaMalloc(&d_topk, topk.size() * 4));
  CHECK(cudaMalloc(&d_newest, B * 4));
  CHECK(cudaMalloc(&d_real, 4));
  CHECK(cudaMalloc(&d_dgi, dgi.size() * 4));
  CHECK(cudaMalloc(&d_lru, lru.size() * 2));
  CHECK(cudaMalloc(&d_rows, topk.size() * 4));
  CHECK(cudaMalloc(&d_src, topk.size() * 4));
  CHECK(cudaMalloc(&d_dst, topk.size() * 4));
  CHECK(cudaMalloc(&d_count, B * 4));
  CHECK(cudaMalloc(&d_counters, 16));
  CHECK(cudaMemcpy(d_topk, topk.data(), topk.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_newest, newest.data(), B * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_real, &B, 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_lru, lru.data(), lru.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(d_counters, 0, 16));

  hisparse::ResolveParams p{};
  p.topk = d_topk;
  p.newest = d_newest;
  p.num_real_reqs = d_real;
  p.dgi = d_dgi;
  p.lru = d_lru;
  p.hot_rows = d_rows;
  p.plan_src = d_src;
  p.plan_dst = d_dst;
  p.plan_count = d_count;
  p.counters = d_counters;
  p.miss_mask = nullptr;
  p.num_rows = B;
  p.k = K;
  p.h = H;
  p.region_stride = region_stride;
  p.pool_rows = 1 << 22;
  p.bitonic_max = bitonic_max;
  int max_smem = 0;
  CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  p.table_bits = small_table ? hisparse::resolve_table_bits(K)
                             : hisparse::resolve_fast_table_bits(K, H, static_cast<size_t>(max_smem));
  const size_t smem = hisparse::resolve_fast_smem_bytes(K, H, p.table_bits);
  const hisparse::ResolveKernelFn kernel = hisparse::resolve_fast_kernel_for(K, H);
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (const char* mode : {"all miss", "all hit"}) {
    std::vector<double> phase(kNumPhases, 0.0);
    float ms_total = 0.f;
    for (int step = 0; step < steps; ++step) {
      if (mode[4] == 'm') CHECK(cudaMemcpy(d_dgi, dgi.data(), dgi.size() * 4, cudaMemcpyHostToDevice));
      CHECK(cudaEventRecord(e0));
      kernel<<<B, hisparse::kFastThreads, smem>>>(p);
      CHECK(cudaEventRecord(e1));
      CHECK(cudaGetLastError());
      CHECK(cudaEventSynchronize(e1));
      float ms = 0.f;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      static long long clocks[1024][12];
      CHECK(cudaMemcpyFromSymbol(clocks, hisparse::g_phase_clock, sizeof(clocks)));
      if (step == 0) continue;  // warm-up
      ms_total += ms;
      for (int r = 0; r < std::min(B, 1024); ++r)
        for (int ph = 0; ph < kNumPhases; ++ph) phase[ph] += double(clocks[r][ph + 1] - clocks[r][ph]) / std::min(B, 1024);
    }
    unsigned long long counters[2];
    CHECK(cudaMemcpy(counters, d_counters, 16, cudaMemcpyDeviceToHost));
    std::printf("B=%d K=%d H=%d %s, table %d, plan sort %s: %.2f us per launch (events, eager), "
                "hits/misses so far %llu/%llu\n", B, K, H, mode, 1 << p.table_bits,
                K <= bitonic_max ? "bitonic" : "radix", 1e3 * ms_total / (steps - 1), counters[0], counters[1]);
    double sum = 0;
    for (int ph = 0; ph < kNumPhases; ++ph) {
      std::printf("  %-28s %8.0f cycles\n", kPhases[ph], phase[ph] / (steps - 1));
      sum += phase[ph] / (steps - 1);
    }
    std::printf("  %-28s %8.0f cycles\n", "total (thread 0, mean of blocks)", sum);
  }
  CHECK(cudaFree(d_topk));
  CHECK(cudaFree(d_newest));
  CHECK(cudaFree(d_real));
  CHECK(cudaFree(d_dgi));
  CHECK(cudaFree(d_lru));
  CHECK(cudaFree(d_rows));
  CHECK(cudaFree(d_src));
  CHECK(cudaFree(d_dst));
  CHECK(cudaFree(d_count));
  CHECK(cudaFree(d_counters));
}

int main() {
  run(64, 2048, 4096, 21);
  // The plan sort at 256, 512 and 1024 misses per row: radix (bitonic_max 0) against bitonic.
  for (const int k : {256, 512, 1024}) {
    run(64, k, 2 * k, 21, false, 0);
    run(64, k, 2 * k, 21);
  }
  run(64, 2048, 4096, 21, true);  // the hash table of 2 x K entries the kernel used before
  return 0;
}
