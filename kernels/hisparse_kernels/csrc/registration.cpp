// The op schemas: the contract of torch.ops.hisparse.*. Tensors a kernel writes carry (x!).
#include <torch/library.h>

TORCH_LIBRARY(hisparse, m) {
  m.def(
      "resolve(Tensor topk, Tensor newest, Tensor num_real_reqs, Tensor(a!) dgi, Tensor(b!) lru, "
      "Tensor(c!) hot_rows, Tensor(d!) plan_src, Tensor(e!) plan_dst, Tensor(f!) plan_count, "
      "Tensor(g!) counters, Tensor(h!)? miss_mask, int region_stride, int pool_rows) -> ()");
  m.def(
      "gather_plan(Tensor host_pool, Tensor(a!) hot, Tensor plan_src, Tensor plan_dst, Tensor plan_count, "
      "Tensor num_real_reqs, int max_blocks=0) -> ()");
  // vLLM 0.33's _C_cache_ops.hisparse_gather_compact, same arguments and semantics, on our copy.
  m.def(
      "vllm_gather_compact(Tensor host_cache, Tensor(a!) hot_cache, Tensor miss_global_indices, "
      "Tensor miss_hot_indices, Tensor miss_counts) -> ()");
  // vLLM 0.33's _C_cache_ops.hisparse_resolve_residency, same arguments and semantics, on our resolve.
  m.def(
      "vllm_resolve_residency(Tensor host_cache, Tensor! hot_cache, Tensor hot_block_table, Tensor global_indices, "
      "Tensor! hot_indices, Tensor! device_global_indices, Tensor! lru_slots, Tensor? request_state_indices, "
      "int region_stride, int max_union_rows, Tensor(a!)? miss_mask=None, Tensor(b!)? stats=None, "
      "Tensor(c!)? attention_indices=None, int attention_block_stride=0, Tensor? request_ids=None, "
      "Tensor? source_block_table=None, int source_block_size=0, Tensor(d!)? resolved_global_indices=None, "
      "Tensor(e!)? valid_counts=None, Tensor(f!)? swap_host_physical_rows=None, "
      "Tensor(g!)? swap_device_physical_rows=None, Tensor(h!)? swap_counts=None, "
      "Tensor? resident_block_table=None, int resident_block_size=0, int resident_null_block=0) -> ()");
  // vLLM 0.33's _C_cache_ops.hisparse_gather_plan, same arguments and semantics, on our copy.
  m.def(
      "vllm_gather_plan(Tensor host_cache, Tensor! hot_cache, Tensor global_indices, Tensor hot_indices, "
      "Tensor miss_mask, Tensor? request_state_indices, Tensor(a!)? attention_indices=None, "
      "int attention_block_stride=0) -> ()");
  // vLLM 0.33's _C_cache_ops.hisparse_invalidate_written_slots, same arguments and semantics.
  m.def(
      "vllm_invalidate_written_slots(Tensor! device_global_indices, Tensor request_state_indices, "
      "Tensor req_id_per_token, Tensor written_slots) -> ()");
  m.def(
      "swap_in(Tensor topk, Tensor newest, Tensor num_real_reqs, Tensor(a!) dgi, Tensor(b!) lru, "
      "Tensor(c!) hot_rows, Tensor(d!) plan_src, Tensor(e!) plan_dst, Tensor(f!) plan_count, "
      "Tensor(g!) counters, Tensor(h!)? miss_mask, Tensor host_pool, Tensor(i!) hot, int region_stride) -> ()");
  m.def(
      "backup_newest_rows(Tensor hot, Tensor(a!) host_pool, Tensor newest, Tensor num_real_reqs, "
      "int region_stride, int hot_slot) -> ()");
  m.def("invalidate_slots(Tensor(a!) dgi, Tensor block_ids, int block_size) -> ()");
  // Page-lock [ptr, ptr + nbytes) for UVA access and remember the range for the launch checks.
  m.def("host_register(int ptr, int nbytes) -> ()");
  m.def("host_unregister(int ptr) -> ()");
  // Benchmark-only: the limits the ops above are measured against.
  m.def("bench_flat_gather(Tensor host_pool, Tensor(a!) hot, Tensor src, Tensor dst) -> ()");
  m.def("bench_warp_gather(Tensor host_pool, Tensor(a!) hot, Tensor src, Tensor dst) -> ()");
  m.def("bench_launch_only(Tensor num_real_reqs, Tensor(a!) sink, int blocks, int threads=256, int smem=0) -> ()");
  m.def("bench_resolve_smem(int k, int h) -> int");
}

#ifdef HISPARSE_AOT_MODULE
// The ahead-of-time build is imported as hisparse_kernels._C; importing it runs the registrations.
#include <Python.h>
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "hisparse hot-buffer ops", -1, nullptr};
  return PyModule_Create(&def);
}
#endif
