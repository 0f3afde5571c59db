// vllm_custom_ar_binding.cpp: Python bindings for the entry points of vLLM's own
// csrc/custom_all_reduce.cu, so that tests/frameworks/vllm_custom_ar.py can drive vLLM's
// custom all-reduce kernels without building (or installing) the rest of vLLM.
//
// vLLM registers these functions through TORCH_LIBRARY in its torch_bindings.cpp, which pulls
// in the whole of its csrc; pybind11 needs nothing but this file. The declarations below
// must match the definitions in csrc/custom_all_reduce.cu of the vLLM releases with the
// "fake_ipc_ptrs" interface (checked against 0.20.2; later releases moved the file to
// csrc/libtorch_stable/); a mismatch is a load-time error (undefined symbol), not a silent bug.
#include <torch/extension.h>

#include <cstdint>
#include <tuple>
#include <vector>

using fptr_t = int64_t;

// Defined in vLLM's csrc/custom_all_reduce.cu.
fptr_t init_custom_ar(const std::vector<fptr_t>& fake_ipc_ptrs, torch::Tensor& rank_data,
                      int64_t rank, bool fully_connected);
void all_reduce(fptr_t fa, torch::Tensor& inp, torch::Tensor& out, fptr_t reg_buffer,
                int64_t reg_buffer_sz_bytes);
void dispose(fptr_t fa);
int64_t meta_size();
void register_buffer(fptr_t fa, const std::vector<fptr_t>& fake_ipc_ptrs);
std::tuple<std::vector<int64_t>, std::vector<int64_t>> get_graph_buffer_ipc_meta(fptr_t fa);
void register_graph_buffers(fptr_t fa, const std::vector<std::vector<int64_t>>& handles,
                            const std::vector<std::vector<int64_t>>& offsets);
std::tuple<fptr_t, torch::Tensor> allocate_shared_buffer_and_handle(int64_t size);
fptr_t open_mem_handle(torch::Tensor& mem_handle);
void free_shared_buffer(fptr_t buffer);

// The lambdas take tensors by value (a cheap handle) and pass lvalues on, because vLLM's
// functions take non-const references, which pybind11's tensor caster should not be asked for.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "vLLM custom all-reduce (csrc/custom_all_reduce.cu), bound for vmmipc's checks";
  m.def("init_custom_ar", [](const std::vector<fptr_t>& ptrs, torch::Tensor rank_data, int64_t rank,
                             bool fully_connected) {
    return init_custom_ar(ptrs, rank_data, rank, fully_connected);
  });
  m.def("all_reduce", [](fptr_t fa, torch::Tensor inp, torch::Tensor out, fptr_t reg_buffer,
                         int64_t reg_buffer_sz_bytes) {
    all_reduce(fa, inp, out, reg_buffer, reg_buffer_sz_bytes);
  });
  m.def("dispose", &dispose);
  m.def("meta_size", &meta_size);
  m.def("register_buffer", &register_buffer);
  m.def("get_graph_buffer_ipc_meta", &get_graph_buffer_ipc_meta);
  m.def("register_graph_buffers", &register_graph_buffers);
  m.def("allocate_shared_buffer_and_handle", &allocate_shared_buffer_and_handle);
  m.def("open_mem_handle", [](torch::Tensor handle) { return open_mem_handle(handle); });
  m.def("free_shared_buffer", &free_shared_buffer);
}
