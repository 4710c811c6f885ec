// prnn_ops.cpp - the prnn:: op schemas, their CPU impls, prnn::layer (input
// projection + recurrence), the plan op, and the checks and GEMMs shared with
// the CUDA impls (prnn_ops_cuda.cpp) and the autograd (prnn_autograd.cpp).
//
// On CUDA the recurrence runs in csrc/kernels behind the torch-free C API of
// prnn.h; on the CPU in ATen (prnn_cpu.cpp), or in that API's C reference.
// This file checks tensors, allocates outputs and workspace, and turns a
// status into a Python error.
#include <Python.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>
#include <vector>

#include "prnn_ops.h"
#include "prnn_stream.h"

extern "C" {
// Importing torch_prnn._C loads this library, whose TORCH_LIBRARY blocks
// register the ops; the module itself holds only the stream's hot path.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  PyObject* module = PyModule_Create(&module_def);
  if (module != nullptr && torch_prnn::add_stream_functions(module) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
}

namespace torch_prnn {

std::optional<prnn_dtype_t> to_prnn_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return PRNN_DTYPE_FLOAT32;
    case at::kDouble: return PRNN_DTYPE_FLOAT64;
    case at::kHalf: return PRNN_DTYPE_FLOAT16;
    case at::kBFloat16: return PRNN_DTYPE_BFLOAT16;
    default: return std::nullopt;
  }
}

namespace {

prnn_activation_t to_activation(const char* op, c10::string_view nonlinearity) {
  TORCH_CHECK_VALUE(nonlinearity == "tanh" || nonlinearity == "relu", op,
                    ": nonlinearity must be 'tanh' or 'relu', got '", std::string(nonlinearity),
                    "'");
  return nonlinearity == "tanh" ? PRNN_ACT_TANH : PRNN_ACT_RELU;
}

void check_rank(const char* op, const char* name, const at::Tensor& t, int64_t rank,
                const char* dims) {
  check_defined(op, name, t);
  TORCH_CHECK(t.dim() == rank, op, ": ", name, " must be ", rank, "-D ", dims, ", got ", t.dim(),
              "-D ", t.sizes());
}

// `t` must have the dtype and device of `ref`.
void check_like(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " must have the dtype of ",
              ref_name, " (", ref.scalar_type(), "), got ", t.scalar_type());
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " must be on the device of ", ref_name,
              " (", ref.device(), "), got ", t.device());
}

// Checks h0, w_hh and the nonlinearity against `x` [steps, batch, hidden]
// (xp in the forward, y in the backward), which sets the sizes, dtype, device.
// sizes: [steps, batch, hidden], x's own unless given (prnn::layer's x is [steps, batch, input]).
prnn_problem_t check_problem(const char* op, const char* x_name, const at::Tensor& x,
                             const at::Tensor& h0, const at::Tensor& w_hh,
                             const std::optional<at::Tensor>& lengths,
                             c10::string_view nonlinearity,
                             std::optional<std::array<int64_t, 3>> sizes = std::nullopt) {
  if (!sizes) check_rank(op, x_name, x, 3, "[steps, batch, hidden]");
  const std::optional<prnn_dtype_t> dtype = to_prnn_dtype(x.scalar_type());
  TORCH_CHECK(dtype.has_value(), op, ": ", x_name,
              " must be float32, float64, float16 or bfloat16, got ", x.scalar_type());
  check_rank(op, "h0", h0, 2, "[batch, hidden]");
  check_rank(op, "w_hh", w_hh, 2, "[hidden, hidden]");
  check_like(op, "h0", h0, x_name, x);
  check_like(op, "w_hh", w_hh, x_name, x);
  const auto [T, B, H] = sizes.value_or(std::array<int64_t, 3>{x.size(0), x.size(1), x.size(2)});
  TORCH_CHECK(h0.size(0) == B && h0.size(1) == H, op, ": h0 must have shape [batch=", B,
              ", hidden=", H, "], got ", h0.sizes());
  TORCH_CHECK(w_hh.size(0) == H && w_hh.size(1) == H, op, ": w_hh must have shape [hidden=", H,
              ", hidden=", H, "], got ", w_hh.sizes());
  return prnn_problem_t{PRNN_CELL_ELMAN, to_activation(op, nonlinearity), *dtype, T, B, H,
                        lengths.has_value()};
}

bool is_reduced_precision(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

// The CPU impls compute in float32 or float64 (in ATen, prnn_cpu.cpp, or in the
// C reference under PRNN_CPU_REFERENCE): float16 and bfloat16 are upcast to
// float32 and the results cast back.

std::tuple<at::Tensor, at::Tensor> forward_cpu(const at::Tensor& xp, const at::Tensor& h0,
                                               const at::Tensor& w_hh,
                                               const std::optional<at::Tensor>& lengths,
                                               c10::string_view nonlinearity) {
  const char* op = "prnn::forward";
  const prnn_problem_t problem = check_forward(xp, h0, w_hh, lengths, nonlinearity);
  if (is_reduced_precision(xp)) {
    const auto [y, h_n] = forward_cpu(xp.to(at::kFloat), h0.to(at::kFloat), w_hh.to(at::kFloat),
                                      lengths, nonlinearity);
    return {y.to(xp.scalar_type()), h_n.to(xp.scalar_type())};
  }
  const at::Tensor host_lengths32 = host_lengths(op, lengths, problem);
  // forward_aten allocates its own outputs.
  if (!is_empty(problem) && !use_cpu_reference()) return forward_aten(xp, h0, w_hh, lengths, problem.activation);
  at::Tensor y = at::empty({problem.steps, problem.batch, problem.hidden}, xp.options());
  if (is_empty(problem)) return {y, final_state(y, h0, lengths)};

  const at::Tensor xp_ = unit_last_stride(xp), h0_ = unit_last_stride(h0),
                   w_hh_ = unit_last_stride(w_hh);
  prnn_plan_t plan;
  check_status(op, prnn_plan_cpu(&problem, PRNN_PASS_FORWARD, &plan));
  at::Tensor ws = workspace(plan, xp);
  const prnn_forward_args_t args = forward_args(xp_, h0_, w_hh_, host_lengths32, y);
  check_status(op, prnn_forward_cpu(&problem, &args, workspace_ptr(ws), plan.workspace_bytes));
  return {y, final_state(y, h0, lengths)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& grad_y, const at::Tensor& y, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity, bool h0_grad) {
  const char* op = "prnn::backward";
  const prnn_problem_t problem = check_backward(grad_y, y, h0, w_hh, lengths, nonlinearity);
  if (is_reduced_precision(y)) {
    const auto [grad_xp, grad_h0, grad_w_hh] =
        backward_cpu(grad_y.to(at::kFloat), y.to(at::kFloat), h0.to(at::kFloat),
                     w_hh.to(at::kFloat), lengths, nonlinearity, h0_grad);
    const at::ScalarType type = y.scalar_type();
    return {grad_xp.to(type), grad_h0.to(type), grad_w_hh.to(type)};
  }
  const at::Tensor host_lengths32 = host_lengths(op, lengths, problem);
  if (!is_empty(problem) && !use_cpu_reference()) {
    const at::Tensor grad_xp = backward_data_aten(grad_y, y, w_hh, lengths, problem.activation);
    return finish_backward(grad_xp, y, h0, w_hh, lengths, h0_grad);
  }
  at::Tensor grad_xp = at::empty({problem.steps, problem.batch, problem.hidden}, y.options());
  if (!is_empty(problem)) {
    const at::Tensor grad_y_ = unit_last_stride_gradient(grad_y), y_ = y.contiguous(),
                     w_hh_ = unit_last_stride(w_hh);
    prnn_plan_t plan;
    check_status(op, prnn_plan_cpu(&problem, PRNN_PASS_BACKWARD_DATA, &plan));
    at::Tensor ws = workspace(plan, y);
    const prnn_backward_args_t args = backward_args(grad_y_, y_, w_hh_, host_lengths32, grad_xp);
    check_status(op, prnn_backward_data_cpu(&problem, &args, workspace_ptr(ws), plan.workspace_bytes));
  }
  return finish_backward(grad_xp, y, h0, w_hh, lengths, h0_grad);
}

prnn_status_t plan_for_device(const char* op, prnn_problem_t problem, prnn_pass_t pass,
                              c10::Device device, prnn_plan_t* plan) {
  if (device.is_cpu()) {
    // What the CPU impls run: float16 and bfloat16 computed in float32.
    if (problem.dtype == PRNN_DTYPE_FLOAT16 || problem.dtype == PRNN_DTYPE_BFLOAT16)
      problem.dtype = PRNN_DTYPE_FLOAT32;
    return prnn_plan_cpu(&problem, pass, plan);
  }
#ifdef WITH_CUDA
  if (device.is_cuda()) return plan_cuda(problem, pass, device, plan);
#endif
  TORCH_CHECK(false, op, ": no plan for device ", device,
              device.is_cuda() ? ": torch_prnn was built without CUDA" : ": expected cpu or cuda");
}

prnn_cell_t to_cell(const char* op, c10::string_view cell) {
  TORCH_CHECK_VALUE(cell == "rnn" || cell == "lstm" || cell == "gru", op,
                    ": cell must be 'rnn', 'lstm' or 'gru', got '", std::string(cell), "'");
  return cell == "rnn" ? PRNN_CELL_ELMAN : cell == "lstm" ? PRNN_CELL_LSTM : PRNN_CELL_GRU;
}

// Returns [tier, workspace_bytes, grid, block, rows_per_cta, smem_bytes, fused_input_projection].
std::vector<int64_t> plan(int64_t steps, int64_t batch, int64_t hidden, at::ScalarType dtype,
                          c10::Device device, c10::string_view nonlinearity, bool backward,
                          bool has_lengths, int64_t input, c10::string_view cell, int64_t proj_size) {
  const char* op = "prnn::plan";
  const std::optional<prnn_dtype_t> type = to_prnn_dtype(dtype);
  TORCH_CHECK(type.has_value(), op, ": dtype must be float32, float64, float16 or bfloat16, got ",
              dtype);
  const prnn_cell_t cell_type = to_cell(op, cell);
  TORCH_CHECK_VALUE(proj_size >= 0, op, ": proj_size must be >= 0, got ", proj_size);
  TORCH_CHECK_VALUE(proj_size == 0 || cell_type == PRNN_CELL_LSTM, op,
                    ": proj_size is for cell='lstm' only, got proj_size=", proj_size, " with cell='",
                    std::string(cell), "'");
  const prnn_problem_t problem{cell_type, to_activation(op, nonlinearity), *type, steps,
                               batch,     hidden, has_lengths, proj_size};
  prnn_plan_t plan{};
  TORCH_CHECK(input >= 0, op, ": input must be >= 0, got ", input);
  // The fused layer (forward only; a gated one as prnn::gated_layer runs it):
  // its plan where a kernel fuses it, else the recurrence's.
  bool fused = false;
#ifdef WITH_CUDA
  if (input > 0 && !backward && device.is_cuda() && (cell_type == PRNN_CELL_ELMAN || proj_size == 0)) {
    const prnn_status_t status = plan_layer_cuda(problem, input, device, &plan);
    if (status != PRNN_STATUS_NOT_SUPPORTED) check_status(op, status);
    fused = status == PRNN_STATUS_SUCCESS;
  }
#endif
  if (!fused) {
    const prnn_status_t status = plan_for_device(
        op, problem, backward ? PRNN_PASS_BACKWARD_DATA : PRNN_PASS_FORWARD, device, &plan);
    // A valid problem that no tier runs is an answer (tier "none"), not an error.
    if (status != PRNN_STATUS_NOT_SUPPORTED) check_status(op, status);
  }
  return {plan.tier,         static_cast<int64_t>(plan.workspace_bytes), plan.grid, plan.block,
          plan.rows_per_cta, plan.smem_bytes, fused};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> layer_forward(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity) {
  return call_forward(input_projection(x, w_ih, b_ih, b_hh), h0, w_hh, lengths, nonlinearity);
}

at::Tensor host_buffer(int64_t n, at::ScalarType dtype, c10::Device device) {
  return at::empty({n}, at::TensorOptions().dtype(dtype).pinned_memory(!device.is_cpu()));
}

at::Tensor to_device_async(const at::Tensor& host, c10::Device device) {
  if (device.is_cpu()) return host;
  return host.to(host.options().device(device), /*non_blocking=*/true);
}

namespace {

// row_of(b, lengths[b]) for each sequence b whose row_of is >= 0, in order,
// into a host_buffer for `device`: host int64 lengths, one pass to count and
// one to fill, no ATen op.
template <class RowOf>
at::Tensor host_rows_where(const at::Tensor& lengths, c10::Device device, RowOf row_of) {
  const at::Tensor l = lengths.contiguous();
  const int64_t* length = l.const_data_ptr<int64_t>();
  const int64_t B = l.numel();
  int64_t count = 0;
  for (int64_t b = 0; b < B; ++b) count += row_of(b, length[b]) >= 0;
  at::Tensor rows = host_buffer(count, at::kLong, device);
  int64_t* row = rows.mutable_data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    if (row_of(b, length[b]) >= 0) *row++ = row_of(b, length[b]);
  return rows;
}

}  // namespace

bool has_unstarted(const at::Tensor& lengths) {
  const at::Tensor l = lengths.contiguous();
  const int64_t* length = l.const_data_ptr<int64_t>();
  return std::any_of(length, length + l.numel(), [](int64_t n) { return n == 0; });
}

at::Tensor final_state_rows(const at::Tensor& lengths, const c10::SymInt& batch) {
  return (lengths - 1).clamp_min(0) * batch + at::arange(batch, lengths.options());
}

at::Tensor final_state_rows_host(const at::Tensor& lengths, int64_t batch, c10::Device device) {
  return host_rows_where(lengths, device,
                         [&](int64_t b, int64_t length) { return std::max<int64_t>(length - 1, 0) * batch + b; });
}

at::Tensor final_state(const at::Tensor& y, const at::Tensor& h0,
                       const std::optional<at::Tensor>& lengths) {
  const int64_t T = y.size(0);
  if (T == 0) return h0.clone(at::MemoryFormat::Contiguous);
  if (!lengths.has_value()) return y.select(0, T - 1).clone(at::MemoryFormat::Contiguous);
  // final_state_rows as a loop over the host lengths: a few ATen calls less
  // of host time per layer, which the GPU may wait for.
  const int64_t B = y.size(1);
  at::Tensor h_n = as_rows(y).index_select(0, to_device_async(final_state_rows_host(*lengths, B, y.device()), y.device()));
  const at::Tensor unstarted =  // the sequences without a step: h_n is their h0
      host_rows_where(*lengths, y.device(), [](int64_t b, int64_t length) { return length == 0 ? b : -1; });
  if (unstarted.numel() > 0) {
    const at::Tensor unstarted_rows = to_device_async(unstarted, y.device());
    h_n.index_copy_(0, unstarted_rows, h0.index_select(0, unstarted_rows));
  }
  return h_n;
}

at::Tensor as_rows(const at::Tensor& t) {
  return t.reshape_symint({t.sym_size(0) * t.sym_size(1), t.sym_size(2)});
}

void check_input_projection(const at::Tensor& x, const at::Tensor& w_ih,
                            const std::optional<at::Tensor>& b_ih,
                            const std::optional<at::Tensor>& b_hh, const char* op, const char* rows) {
  check_rank(op, "x", x, 3, "[steps, batch, input]");
  TORCH_CHECK(to_prnn_dtype(x.scalar_type()).has_value(), op,
              ": x must be float32, float64, float16 or bfloat16, got ", x.scalar_type());
  const std::string w_dims = std::string("[") + rows + ", input]", b_dims = std::string("[") + rows + "]";
  check_rank(op, "w_ih", w_ih, 2, w_dims.c_str());
  check_like(op, "w_ih", w_ih, "x", x);
  // Symbolic sizes (see as_rows).
  const c10::SymInt T = x.sym_size(0), B = x.sym_size(1), I = x.sym_size(2), H = w_ih.sym_size(0);
  TORCH_CHECK(w_ih.sym_size(1) == I, op, ": w_ih must have shape [", rows, ", input=", I, "], got ",
              w_ih.sym_sizes());
  TORCH_CHECK(b_ih.has_value() == b_hh.has_value(), op,
              ": b_ih and b_hh must both be tensors or both be None");
  if (!b_ih.has_value()) return;
  const auto check_bias = [&](const char* name, const at::Tensor& b) {
    check_rank(op, name, b, 1, b_dims.c_str());
    check_like(op, name, b, "x", x);
    TORCH_CHECK(b.sym_size(0) == H, op, ": ", name, " must have shape [", rows, "=", H, "], got ",
                b.sym_sizes());
  };
  check_bias("b_ih", *b_ih);
  check_bias("b_hh", *b_hh);
}

at::Tensor input_projection(const at::Tensor& x, const at::Tensor& w_ih,
                            const std::optional<at::Tensor>& b_ih,
                            const std::optional<at::Tensor>& b_hh) {
  check_input_projection(x, w_ih, b_ih, b_hh);
  const c10::SymInt T = x.sym_size(0), B = x.sym_size(1), H = w_ih.sym_size(0);
  if (!b_ih.has_value()) return as_rows(x).mm(w_ih.t()).view_symint({T, B, H});
  // Both biases folded into the GEMM's.
  return at::addmm(*b_ih + *b_hh, as_rows(x), w_ih.t()).view_symint({T, B, H});
}

prnn_problem_t check_layer(const at::Tensor& x, const at::Tensor& w_ih,
                           const std::optional<at::Tensor>& b_ih,
                           const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
                           const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
                           c10::string_view nonlinearity) {
  check_input_projection(x, w_ih, b_ih, b_hh);
  // The recurrence's checks with prnn::forward's messages, as the GEMM-then-
  // forward path raises them (xp has x's dtype and device).
  return check_problem("prnn::forward", "xp", x, h0, w_hh, lengths, nonlinearity,
                       std::array<int64_t, 3>{x.size(0), x.size(1), w_ih.size(0)});
}

std::tuple<at::Tensor, at::Tensor> call_layer(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::layer", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&, c10::string_view)>();
  return op.call(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity);
}

std::tuple<at::Tensor, at::Tensor> call_forward(const at::Tensor& xp, const at::Tensor& h0,
                                                const at::Tensor& w_hh,
                                                const std::optional<at::Tensor>& lengths,
                                                c10::string_view nonlinearity) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::forward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&,
                                                    const std::optional<at::Tensor>&,
                                                    c10::string_view)>();
  return op.call(xp, h0, w_hh, lengths, nonlinearity);
}

// The backward ops' autograd kernel is only their double-backward refusal,
// in Python (torch_prnn/ops.py). A backward that builds no graph (grad mode
// off: create_graph=False) gives it nothing to do, so it calls below autograd
// and never enters Python (host time a training call: bench/NOTES.md).
struct BackwardDispatch {
  std::optional<at::AutoDispatchBelowADInplaceOrView> below;
  BackwardDispatch() {
    if (!c10::GradMode::is_enabled()) below.emplace();
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_backward(
    const at::Tensor& grad_y, const at::Tensor& y, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity, bool h0_grad) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&, c10::string_view, bool)>();
  const BackwardDispatch dispatch;
  return op.call(grad_y, y, h0, w_hh, lengths, nonlinearity, h0_grad);
}

prnn_problem_t check_forward(const at::Tensor& xp, const at::Tensor& h0, const at::Tensor& w_hh,
                             const std::optional<at::Tensor>& lengths,
                             c10::string_view nonlinearity) {
  return check_problem("prnn::forward", "xp", xp, h0, w_hh, lengths, nonlinearity);
}

prnn_problem_t check_backward(const at::Tensor& grad_y, const at::Tensor& y,
                              const at::Tensor& h0, const at::Tensor& w_hh,
                              const std::optional<at::Tensor>& lengths,
                              c10::string_view nonlinearity) {
  const char* op = "prnn::backward";
  const prnn_problem_t problem = check_problem(op, "y", y, h0, w_hh, lengths, nonlinearity);
  check_defined(op, "grad_y", grad_y);
  check_like(op, "grad_y", grad_y, "y", y);
  TORCH_CHECK(grad_y.sizes() == y.sizes(), op, ": grad_y must have the shape of y ", y.sizes(),
              ", got ", grad_y.sizes());
  return problem;
}

at::Tensor host_lengths(const char* op, const std::optional<at::Tensor>& lengths,
                        const prnn_problem_t& problem, c10::Device device) {
  if (!lengths.has_value()) return at::Tensor();
  const at::Tensor& l = *lengths;
  TORCH_CHECK(l.device().is_cpu(), op,
              ": lengths must be a CPU tensor (like nn.RNN's batch_sizes), got one on ",
              l.device());
  TORCH_CHECK(l.scalar_type() == at::kLong, op, ": lengths must be int64, got ", l.scalar_type());
  TORCH_CHECK(l.dim() == 1 && l.size(0) == problem.batch, op, ": lengths must have shape [batch=",
              problem.batch, "], got ", l.sizes());
  const at::Tensor values = l.contiguous();
  const int64_t* value = values.const_data_ptr<int64_t>();
  at::Tensor lengths32 = host_buffer(problem.batch, at::kInt, device);
  int32_t* length = lengths32.mutable_data_ptr<int32_t>();
  int64_t lo = 0, hi = 0;
  for (int64_t b = 0; b < problem.batch; ++b) {
    lo = b == 0 ? value[b] : std::min(lo, value[b]);
    hi = b == 0 ? value[b] : std::max(hi, value[b]);
    length[b] = static_cast<int32_t>(value[b]);
  }
  TORCH_CHECK(lo >= 0 && hi <= problem.steps, op, ": lengths must be in [0, steps=", problem.steps,
              "], got values in [", lo, ", ", hi, "]");
  return lengths32;
}

at::Tensor workspace(const prnn_plan_t& plan, const at::Tensor& like) {
  if (plan.workspace_bytes == 0) return at::Tensor();  // the cluster and CPU tiers: no allocator call
  return at::empty({static_cast<int64_t>(plan.workspace_bytes)}, like.options().dtype(at::kByte));
}

void* workspace_ptr(const at::Tensor& ws) { return ws.defined() ? ws.data_ptr() : nullptr; }

bool is_empty(const prnn_problem_t& problem) {
  return problem.steps == 0 || problem.batch == 0 || problem.hidden == 0;
}

at::Tensor unit_last_stride(const at::Tensor& t) {
  return t.stride(-1) == 1 ? t : t.contiguous();
}

at::Tensor unit_last_stride_gradient(const at::Tensor& grad) {
  if (grad.stride(-1) == 1) return grad;
  at::Tensor varying = grad;
  for (int64_t d = 0; d + 1 < grad.dim(); ++d)
    if (grad.stride(d) == 0 && grad.size(d) > 1) varying = varying.narrow(d, 0, 1);
  return varying.contiguous().expand(grad.sizes());
}

prnn_forward_args_t forward_args(const at::Tensor& xp, const at::Tensor& h0,
                                 const at::Tensor& w_hh, const at::Tensor& lengths,
                                 const at::Tensor& y) {
  prnn_forward_args_t args{};
  args.xp = xp.const_data_ptr();
  args.xp_stride_t = xp.stride(0);
  args.xp_stride_b = xp.stride(1);
  set_recurrence_args(args, h0, w_hh, lengths, y);
  return args;
}

prnn_backward_args_t backward_args(const at::Tensor& grad_y, const at::Tensor& y,
                                   const at::Tensor& w_hh, const at::Tensor& lengths,
                                   const at::Tensor& grad_xp) {
  prnn_backward_args_t args{};
  args.grad_y = grad_y.const_data_ptr();
  args.grad_y_stride_t = grad_y.stride(0);
  args.grad_y_stride_b = grad_y.stride(1);
  args.y = y.const_data_ptr();
  args.w_hh = w_hh.const_data_ptr();
  args.w_hh_stride = w_hh.stride(0);
  args.lengths = lengths.defined() ? lengths.const_data_ptr<int32_t>() : nullptr;
  args.grad_xp = grad_xp.mutable_data_ptr();
  return args;
}

void check_status(const char* op, prnn_status_t status) {
  if (status == PRNN_STATUS_SUCCESS) return;
  TORCH_CHECK_NOT_IMPLEMENTED(status != PRNN_STATUS_NOT_SUPPORTED, op, ": ",
                              prnn_status_string(status), ": ", prnn_last_error());
  TORCH_CHECK(false, op, ": ", prnn_status_string(status), ": ", prnn_last_error());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> finish_backward(
    const at::Tensor& grad_xp, const at::Tensor& y, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, bool h0_grad) {
  const int64_t T = grad_xp.size(0);
  const auto none = [&] { return at::empty({0}, h0.options()); };
  if (T == 0) {
    return {grad_xp, h0_grad ? at::zeros(h0.sizes(), h0.options()) : none(),
            at::zeros(w_hh.sizes(), w_hh.options())};
  }
  const at::Tensor grad_h0 = h0_grad ? grad_xp.select(0, 0).mm(w_hh) : none();  // delta_0 w_hh
  return {grad_xp, grad_h0, recurrent_weight_grad(grad_xp, y, h0, lengths)};
}

at::Tensor recurrent_weight_grad(const at::Tensor& delta, const at::Tensor& y, const at::Tensor& h0,
                                 const std::optional<at::Tensor>& lengths) {
  const int64_t T = delta.size(0);
  // Every step in one GEMM over the flattened (step, batch) rows, against
  // the state before each step (h0, then y_0 .. y_{T-2}). The t = 0 term as a
  // GEMM of its own (K = batch) made cuBLAS load a kernel that took 30-40 ms
  // on its first call (bench/NOTES.md step 33; at T = 1 K is the batch
  // again); the copy costs T B S elements.
  const at::Tensor prev = T > 0 ? at::cat({h0.unsqueeze(0), y.slice(0, 0, T - 1)}, 0) : y;
  if (lengths.has_value() && T > 0) {
    // At step lengths[b] < T, prev holds the state sequence b ended with (h0
    // at length 0), against a zero delta; 0 times a NaN or infinite state
    // is NaN, and nn's modules never multiply that state again: zero its row.
    // Past that step y, and so prev, is zero.
    const int64_t B = y.size(1);
    const at::Tensor ended = host_rows_where(  // checked: host int64 lengths in [0, T]
        *lengths, prev.device(), [&](int64_t b, int64_t length) { return length < T ? length * B + b : -1; });
    if (ended.numel() > 0) as_rows(prev).index_fill_(0, to_device_async(ended, prev.device()), 0);
  }
  return as_rows(delta).t().mm(as_rows(prev));
}

// ---- The gated cells ----

namespace {

int64_t gates_of(prnn_cell_t cell) { return cell == PRNN_CELL_LSTM ? PRNN_LSTM_GATES : PRNN_GRU_GATES; }
int64_t saved_of(prnn_cell_t cell) { return cell == PRNN_CELL_LSTM ? PRNN_LSTM_SAVED : PRNN_GRU_SAVED; }
int64_t state_size(const prnn_problem_t& problem) {
  return problem.proj_size > 0 ? problem.proj_size : problem.hidden;
}

const void* data_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }
void* mutable_data_or_null(const at::Tensor& t) { return t.defined() ? t.mutable_data_ptr() : nullptr; }

// A unit-stride copy where the C API needs one (undefined stays undefined).
at::Tensor unit_last_stride_or_none(const at::Tensor& t) { return t.defined() ? unit_last_stride(t) : t; }
at::Tensor unit_last_stride_or_none(const std::optional<at::Tensor>& t) {
  return t.has_value() ? unit_last_stride(*t) : at::Tensor();
}

// The names of the gate rows ("4*hidden") and of the state's width S
// ("proj_size" with a projection, else "hidden") in messages.
const char* gate_rows_name(prnn_cell_t cell) { return cell == PRNN_CELL_LSTM ? "4*hidden" : "3*hidden"; }
const char* state_name(bool projection) { return projection ? "proj_size" : "hidden"; }

// A shape in words for check_rank: dims({"batch", "hidden"}) is "[batch, hidden]".
std::string dims(std::initializer_list<const char*> names) {
  std::string out = "[";
  for (const char* name : names) out += (out.size() > 1 ? ", " : "") + std::string(name);
  return out + "]";
}

// The projection's size P from w_hr [P, H] (0 without one); H >= 1 and P >= 1 with one.
int64_t check_projection(const char* op, const std::optional<at::Tensor>& w_hr, const char* ref_name,
                         const at::Tensor& ref, int64_t H) {
  if (!w_hr.has_value()) return 0;
  check_rank(op, "w_hr", *w_hr, 2, "[proj_size, hidden]");
  check_like(op, "w_hr", *w_hr, ref_name, ref);
  TORCH_CHECK(H >= 1, op, ": a projection (w_hr) needs hidden >= 1, got hidden 0");
  TORCH_CHECK(w_hr->size(0) >= 1 && w_hr->size(1) == H, op,
              ": w_hr must have shape [proj_size >= 1, hidden=", H, "], got ", w_hr->sizes());
  return w_hr->size(0);
}

// A [batch, width] state (h0, c0, grad_h_n, grad_c_n) of ref's dtype and device.
void check_state(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                 const at::Tensor& ref, int64_t B, const char* width_name, int64_t width) {
  check_rank(op, name, t, 2, dims({"batch", width_name}).c_str());
  check_like(op, name, t, ref_name, ref);
  TORCH_CHECK(t.size(0) == B && t.size(1) == width, op, ": ", name, " must have shape [batch=", B,
              ", ", width_name, "=", width, "], got ", t.sizes());
}

void check_w_hh(const char* op, prnn_cell_t cell, const at::Tensor& w_hh, int64_t H, bool projection,
                int64_t S) {
  TORCH_CHECK(w_hh.size(0) == gates_of(cell) * H && w_hh.size(1) == S, op, ": w_hh must have shape [",
              gate_rows_name(cell), "=", gates_of(cell) * H, ", ", state_name(projection), "=", S,
              "], got ", w_hh.sizes());
}

}  // namespace

prnn_problem_t check_gated_forward(const char* op, prnn_cell_t cell, const at::Tensor& xp,
                                   const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
                                   const at::Tensor& c0, const at::Tensor& w_hh,
                                   const std::optional<at::Tensor>& w_hr,
                                   const std::optional<at::Tensor>& lengths) {
  const bool lstm = cell == PRNN_CELL_LSTM, projection = w_hr.has_value();
  const int64_t G = gates_of(cell);
  const char* rows = gate_rows_name(cell);
  check_rank(op, "xp", xp, 3, dims({"steps", "batch", rows}).c_str());
  const std::optional<prnn_dtype_t> dtype = to_prnn_dtype(xp.scalar_type());
  TORCH_CHECK(dtype.has_value(), op, ": xp must be float32, float64, float16 or bfloat16, got ",
              xp.scalar_type());
  check_rank(op, "w_hh", w_hh, 2, dims({rows, state_name(projection)}).c_str());
  check_like(op, "w_hh", w_hh, "xp", xp);
  const int64_t T = xp.size(0), B = xp.size(1);
  TORCH_CHECK(xp.size(2) % G == 0, op, ": xp must have shape [steps, batch, ", rows,
              "]: its last size must be a multiple of ", G, ", got ", xp.sizes());
  const int64_t H = xp.size(2) / G;
  const int64_t P = check_projection(op, w_hr, "xp", xp, H), S = projection ? P : H;
  check_state(op, "h0", h0, "xp", xp, B, state_name(projection), S);
  if (lstm) check_state(op, "c0", c0, "xp", xp, B, "hidden", H);
  check_w_hh(op, cell, w_hh, H, projection, S);
  if (b_hh.has_value()) {
    check_rank(op, "b_hh", *b_hh, 1, dims({rows}).c_str());
    check_like(op, "b_hh", *b_hh, "xp", xp);
    TORCH_CHECK(b_hh->size(0) == G * H, op, ": b_hh must have shape [", rows, "=", G * H, "], got ",
                b_hh->sizes());
  }
  return prnn_problem_t{cell, PRNN_ACT_TANH, *dtype, T, B, H, lengths.has_value(), P};
}

prnn_problem_t check_gated_backward(const char* op, prnn_cell_t cell, const at::Tensor& grad_y,
                                    const std::optional<at::Tensor>& grad_h_n,
                                    const std::optional<at::Tensor>& grad_c_n,
                                    const at::Tensor& h0, const at::Tensor& c0,
                                    const at::Tensor& y, const at::Tensor& saved,
                                    const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
                                    const std::optional<at::Tensor>& lengths) {
  const bool lstm = cell == PRNN_CELL_LSTM, projection = w_hr.has_value();
  const int64_t G = gates_of(cell);
  const char* rows = gate_rows_name(cell);
  const char* state = state_name(projection);
  check_rank(op, "y", y, 3, dims({"steps", "batch", state}).c_str());
  const std::optional<prnn_dtype_t> dtype = to_prnn_dtype(y.scalar_type());
  TORCH_CHECK(dtype.has_value(), op, ": y must be float32, float64, float16 or bfloat16, got ",
              y.scalar_type());
  check_defined(op, "grad_y", grad_y);
  check_like(op, "grad_y", grad_y, "y", y);
  TORCH_CHECK(grad_y.sizes() == y.sizes(), op, ": grad_y must have the shape of y ", y.sizes(),
              ", got ", grad_y.sizes());
  check_rank(op, "w_hh", w_hh, 2, dims({rows, state}).c_str());
  check_like(op, "w_hh", w_hh, "y", y);
  TORCH_CHECK(w_hh.size(0) % G == 0, op, ": w_hh must have shape [", rows, ", ", state,
              "]: its first size must be a multiple of ", G, ", got ", w_hh.sizes());
  const int64_t T = y.size(0), B = y.size(1), H = w_hh.size(0) / G;
  const int64_t P = check_projection(op, w_hr, "y", y, H), S = projection ? P : H;
  TORCH_CHECK(y.size(2) == S, op, ": y must have shape [steps, batch, ", state, "=", S, "], got ",
              y.sizes());
  check_w_hh(op, cell, w_hh, H, projection, S);
  check_state(op, "h0", h0, "y", y, B, state, S);
  if (lstm) check_state(op, "c0", c0, "y", y, B, "hidden", H);
  const int64_t saved_width = saved_of(cell) * H;
  check_rank(op, "saved", saved, 3, "[steps, batch, saved values*hidden]");
  check_like(op, "saved", saved, "y", y);
  TORCH_CHECK(saved.size(0) == T && saved.size(1) == B && saved.size(2) == saved_width, op,
              ": saved must have shape [steps=", T, ", batch=", B, ", ", saved_of(cell), "*hidden=",
              saved_width, "] (the forward's, with save=True), got ", saved.sizes());
  if (grad_h_n.has_value()) check_state(op, "grad_h_n", *grad_h_n, "y", y, B, state, S);
  if (grad_c_n.has_value()) check_state(op, "grad_c_n", *grad_c_n, "y", y, B, "hidden", H);
  return prnn_problem_t{cell, PRNN_ACT_TANH, *dtype, T, B, H, lengths.has_value(), P};
}

GatedForwardCall gated_forward_call(const prnn_problem_t& problem, const at::Tensor& xp,
                                    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
                                    const at::Tensor& c0, const at::Tensor& w_hh,
                                    const std::optional<at::Tensor>& w_hr,
                                    const at::Tensor& lengths32, bool save) {
  const bool lstm = problem.cell == PRNN_CELL_LSTM;
  const int64_t T = problem.steps, B = problem.batch, H = problem.hidden, S = state_size(problem);
  const at::TensorOptions options = xp.options();
  GatedForwardCall call{};
  call.y = at::empty({T, B, S}, options);
  call.saved = save ? at::empty({T, B, saved_of(problem.cell) * H}, options) : at::empty({0}, options);
  if (is_empty(problem)) {
    // No step runs: the final states are the initial ones (copies: an op never returns an input).
    call.h_n = h0.clone(at::MemoryFormat::Contiguous);
    if (lstm) call.c_n = c0.clone(at::MemoryFormat::Contiguous);
    return call;
  }
  call.h_n = at::empty({B, S}, options);
  if (lstm) call.c_n = at::empty({B, H}, options);
  call.xp = unit_last_stride(xp);
  call.b_hh = b_hh.has_value() ? b_hh->contiguous() : at::Tensor();
  call.h0 = unit_last_stride(h0);
  call.c0 = unit_last_stride_or_none(c0);
  call.w_hh = unit_last_stride(w_hh);
  call.w_hr = unit_last_stride_or_none(w_hr);
  call.lengths32 = lengths32;

  prnn_gated_forward_args_t& a = call.args;
  a.xp = call.xp.const_data_ptr();
  a.xp_stride_t = call.xp.stride(0);
  a.xp_stride_b = call.xp.stride(1);
  a.b_hh = data_or_null(call.b_hh);
  a.h0 = call.h0.const_data_ptr();
  a.h0_stride_b = call.h0.stride(0);
  a.c0 = data_or_null(call.c0);
  a.c0_stride_b = lstm ? call.c0.stride(0) : 0;
  a.w_hh = call.w_hh.const_data_ptr();
  a.w_hh_stride = call.w_hh.stride(0);
  a.w_hr = data_or_null(call.w_hr);
  a.w_hr_stride = call.w_hr.defined() ? call.w_hr.stride(0) : 0;
  a.lengths = lengths32.defined() ? lengths32.const_data_ptr<int32_t>() : nullptr;
  a.y = call.y.mutable_data_ptr();
  a.h_n = call.h_n.mutable_data_ptr();
  a.c_n = mutable_data_or_null(call.c_n);
  a.saved = save ? call.saved.mutable_data_ptr() : nullptr;
  return call;
}

GatedBackwardCall gated_backward_call(const prnn_problem_t& problem, const at::Tensor& grad_y,
                                      const std::optional<at::Tensor>& grad_h_n,
                                      const std::optional<at::Tensor>& grad_c_n,
                                      const at::Tensor& h0, const at::Tensor& c0,
                                      const at::Tensor& y, const at::Tensor& saved,
                                      const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
                                      const at::Tensor& lengths32) {
  const bool lstm = problem.cell == PRNN_CELL_LSTM;
  const int64_t T = problem.steps, B = problem.batch, H = problem.hidden, S = state_size(problem);
  const int64_t GH = gates_of(problem.cell) * H;
  const at::TensorOptions options = y.options();
  GatedBackwardCall call{};
  call.grad_xp = at::empty({T, B, GH}, options);
  if (!lstm) call.grad_hh = at::empty({T, B, GH}, options);
  if (problem.proj_size > 0) call.grad_h = at::empty({T, B, S}, options);
  // What finish_gated_backward reads, also for a zero-size problem.
  call.h0 = unit_last_stride(h0);
  call.y = y.contiguous();
  call.saved = saved.contiguous();
  if (is_empty(problem)) {
    // No step runs: grad_h_n and grad_c_n reach h0 and c0 unchanged. Every
    // [T, B, .] gradient is empty (T, B or H is zero, and a projection needs H).
    call.grad_h0 = grad_h_n.has_value() ? grad_h_n->clone(at::MemoryFormat::Contiguous)
                                        : at::zeros({B, S}, options);
    if (lstm)
      call.grad_c0 = grad_c_n.has_value() ? grad_c_n->clone(at::MemoryFormat::Contiguous)
                                          : at::zeros({B, H}, options);
    return call;
  }
  call.grad_h0 = at::empty({B, S}, options);
  if (lstm) call.grad_c0 = at::empty({B, H}, options);
  call.grad_y = unit_last_stride_gradient(grad_y);
  call.grad_h_n = unit_last_stride_or_none(grad_h_n);
  call.grad_c_n = unit_last_stride_or_none(grad_c_n);
  call.c0 = unit_last_stride_or_none(c0);
  call.w_hh = unit_last_stride(w_hh);
  call.w_hr = unit_last_stride_or_none(w_hr);
  call.lengths32 = lengths32;

  prnn_gated_backward_args_t& a = call.args;
  a.grad_y = call.grad_y.const_data_ptr();
  a.grad_y_stride_t = call.grad_y.stride(0);
  a.grad_y_stride_b = call.grad_y.stride(1);
  a.grad_h_n = data_or_null(call.grad_h_n);
  a.grad_h_n_stride_b = call.grad_h_n.defined() ? call.grad_h_n.stride(0) : 0;
  a.grad_c_n = data_or_null(call.grad_c_n);
  a.grad_c_n_stride_b = call.grad_c_n.defined() ? call.grad_c_n.stride(0) : 0;
  a.h0 = call.h0.const_data_ptr();
  a.h0_stride_b = call.h0.stride(0);
  a.c0 = data_or_null(call.c0);
  a.c0_stride_b = lstm ? call.c0.stride(0) : 0;
  a.y = call.y.const_data_ptr();
  a.saved = call.saved.const_data_ptr();
  a.w_hh = call.w_hh.const_data_ptr();
  a.w_hh_stride = call.w_hh.stride(0);
  a.w_hr = data_or_null(call.w_hr);
  a.w_hr_stride = call.w_hr.defined() ? call.w_hr.stride(0) : 0;
  a.lengths = lengths32.defined() ? lengths32.const_data_ptr<int32_t>() : nullptr;
  a.grad_xp = call.grad_xp.mutable_data_ptr();
  a.grad_hh = mutable_data_or_null(call.grad_hh);
  a.grad_h = mutable_data_or_null(call.grad_h);
  a.grad_h0 = call.grad_h0.mutable_data_ptr();
  a.grad_c0 = mutable_data_or_null(call.grad_c0);
  return call;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
finish_gated_backward(const prnn_problem_t& problem, const GatedBackwardCall& call,
                      const std::optional<at::Tensor>& lengths) {
  // dLoss/d(W_hh h_{t-1} + b_hh): a GRU's own (its n block differs), an LSTM's is grad_xp.
  const at::Tensor& grad_hh = call.grad_hh.defined() ? call.grad_hh : call.grad_xp;
  at::Tensor grad_w_hh = recurrent_weight_grad(grad_hh, call.y, call.h0, lengths);
  at::Tensor grad_b_hh = as_rows(grad_hh).sum(0);
  at::Tensor grad_w_hr;
  if (problem.proj_size > 0) {
    const int64_t H = problem.hidden;  // saved's blocks: i, f, g, o, c
    const at::Tensor m = call.saved.narrow(2, 3 * H, H) * call.saved.narrow(2, 4 * H, H).tanh();
    grad_w_hr = as_rows(call.grad_h).t().mm(as_rows(m));
  } else {
    grad_w_hr = at::empty({0}, call.y.options());
  }
  return {call.grad_xp, call.grad_h0, call.grad_c0, grad_w_hh, grad_b_hh, grad_w_hr};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_lstm(
    const at::Tensor& xp, const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
    const at::Tensor& c0, const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
    const std::optional<at::Tensor>& lengths, bool save) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::lstm", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&,
              const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, bool)>();
  return op.call(xp, b_hh, h0, c0, w_hh, w_hr, lengths, save);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
call_lstm_backward(const at::Tensor& grad_y, const std::optional<at::Tensor>& grad_h_n,
                   const std::optional<at::Tensor>& grad_c_n, const at::Tensor& h0,
                   const at::Tensor& c0, const at::Tensor& y, const at::Tensor& saved,
                   const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
                   const std::optional<at::Tensor>& lengths) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::lstm_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&)>();
  const BackwardDispatch dispatch;
  return op.call(grad_y, grad_h_n, grad_c_n, h0, c0, y, saved, w_hh, w_hr, lengths);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_gru(const at::Tensor& xp,
                                                        const std::optional<at::Tensor>& b_hh,
                                                        const at::Tensor& h0, const at::Tensor& w_hh,
                                                        const std::optional<at::Tensor>& lengths,
                                                        bool save) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::gru", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&,
              const at::Tensor&, const std::optional<at::Tensor>&, bool)>();
  return op.call(xp, b_hh, h0, w_hh, lengths, save);
}

bool check_gated_layer(const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
                       const std::optional<at::Tensor>& b_hh, const std::optional<at::Tensor>& c0,
                       c10::string_view mode) {
  const char* op = "prnn::gated_layer";
  const bool lstm = mode == "LSTM";
  TORCH_CHECK_VALUE(lstm || mode == "GRU", op, ": mode must be 'LSTM' or 'GRU', got '", std::string(mode), "'");
  TORCH_CHECK(c0.has_value() == lstm, op, ": c0 must be given for an LSTM and only for one");
  // The GEMM's operands checked here: at::linear's own messages differ between devices and meta.
  check_input_projection(x, w_ih, b_ih, b_hh, op, lstm ? "4*hidden" : "3*hidden");
  return lstm;
}

// at::linear(x, w_ih, b_ih) as the modules' regular path computes it, above
// autograd. Below autograd, where prnn::gated_layer's impls run, w_ih's
// transpose does not require grad, and at::matmul then multiplies a 3-D x
// whose leading dimensions do not fold into rows without a copy (batch_first
// input) by a batched GEMM instead of one GEMM over its copied rows: other
// bits. A contiguous x with a bias (also one whose size-1 dimensions break
// the fold test), or any 3-D x with a bias under TORCH_LINEAR_FLATTEN_3D=1,
// takes at::linear's one addmm on both sides.
at::Tensor gated_input_projection(const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih) {
  static const bool flatten_3d = [] {  // at::linear reads it so too
    const char* value = std::getenv("TORCH_LINEAR_FLATTEN_3D");
    return value != nullptr && std::string(value) == "1";
  }();
  const bool addmm = b_ih.has_value() && (x.is_contiguous() || flatten_3d);
  const bool folds_above = w_ih.requires_grad() && x.dim() == 3 && x.numel() > 0 &&
                           x.stride(0) != x.stride(1) * x.size(1) && !addmm;
  if (!folds_above) return at::linear(x, w_ih, b_ih);
  at::Tensor xp = x.reshape({-1, x.size(2)}).mm(w_ih.t()).view({x.size(0), x.size(1), w_ih.size(0)});
  if (b_ih.has_value()) xp.add_(*b_ih);
  return xp;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_layer_ops(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const std::optional<at::Tensor>& c0,
    const at::Tensor& w_hh, bool lstm) {
  const at::Tensor xp = gated_input_projection(x, w_ih, b_ih);
  if (lstm) {
    auto [y, h_n, c_n, saved] = call_lstm(xp, b_hh, h0, *c0, w_hh, std::nullopt, std::nullopt, /*save=*/false);
    return {y, h_n, c_n};
  }
  auto [y, h_n, saved] = call_gru(xp, b_hh, h0, w_hh, std::nullopt, /*save=*/false);
  return {y, h_n, at::empty({0}, y.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_layer_forward(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const std::optional<at::Tensor>& c0,
    const at::Tensor& w_hh, c10::string_view mode) {
  return gated_layer_ops(x, w_ih, b_ih, b_hh, h0, c0, w_hh, check_gated_layer(x, w_ih, b_ih, b_hh, c0, mode));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_gated_layer(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const std::optional<at::Tensor>& c0,
    const at::Tensor& w_hh, c10::string_view mode) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::gated_layer", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, const at::Tensor&, const std::optional<at::Tensor>&,
              const at::Tensor&, c10::string_view)>();
  return op.call(x, w_ih, b_ih, b_hh, h0, c0, w_hh, mode);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_gru_backward(
    const at::Tensor& grad_y, const std::optional<at::Tensor>& grad_h_n, const at::Tensor& h0,
    const at::Tensor& y, const at::Tensor& saved, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::gru_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&,
              const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&)>();
  const BackwardDispatch dispatch;
  return op.call(grad_y, grad_h_n, h0, y, saved, w_hh, lengths);
}

namespace {

std::optional<at::Tensor> to_float(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(t->to(at::kFloat)) : std::nullopt;
}
at::Tensor to_float(const at::Tensor& t) { return t.defined() ? t.to(at::kFloat) : t; }
at::Tensor to_type(const at::Tensor& t, at::ScalarType type) { return t.defined() ? t.to(type) : t; }

// prnn::lstm and prnn::gru on the CPU (a GRU's c0 undefined, its w_hr nullopt):
// (y, h_n, c_n, saved), c_n undefined for a GRU. float16 and bfloat16 are
// computed in float32, as forward_cpu does.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_forward_cpu(
    const char* op, prnn_cell_t cell, const at::Tensor& xp, const std::optional<at::Tensor>& b_hh,
    const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& w_hr, const std::optional<at::Tensor>& lengths, bool save) {
  const prnn_problem_t problem = check_gated_forward(op, cell, xp, b_hh, h0, c0, w_hh, w_hr, lengths);
  if (is_reduced_precision(xp)) {
    const auto [y, h_n, c_n, saved] =
        gated_forward_cpu(op, cell, to_float(xp), to_float(b_hh), to_float(h0), to_float(c0),
                          to_float(w_hh), to_float(w_hr), lengths, save);
    const at::ScalarType type = xp.scalar_type();
    return {y.to(type), h_n.to(type), to_type(c_n, type), saved.to(type)};
  }
  const at::Tensor host_lengths32 = host_lengths(op, lengths, problem);
  const GatedForwardCall call =
      gated_forward_call(problem, xp, b_hh, h0, c0, w_hh, w_hr, host_lengths32, save);
  if (!is_empty(problem) && !use_cpu_reference()) {
    gated_forward_aten(problem, call, lengths, save);
  } else if (!is_empty(problem)) {
    prnn_plan_t plan;
    check_status(op, prnn_plan_cpu(&problem, PRNN_PASS_FORWARD, &plan));
    at::Tensor ws = workspace(plan, xp);
    check_status(op, prnn_gated_forward_cpu(&problem, &call.args, workspace_ptr(ws),
                                            plan.workspace_bytes));
  }
  return {call.y, call.h_n, call.c_n, call.saved};
}

// prnn::lstm_backward and prnn::gru_backward on the CPU, likewise.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_backward_cpu(
    const char* op, prnn_cell_t cell, const at::Tensor& grad_y,
    const std::optional<at::Tensor>& grad_h_n, const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& y, const at::Tensor& saved,
    const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
    const std::optional<at::Tensor>& lengths) {
  const prnn_problem_t problem = check_gated_backward(op, cell, grad_y, grad_h_n, grad_c_n, h0, c0,
                                                      y, saved, w_hh, w_hr, lengths);
  if (is_reduced_precision(y)) {
    const auto [grad_xp, grad_h0, grad_c0, grad_w_hh, grad_b_hh, grad_w_hr] = gated_backward_cpu(
        op, cell, to_float(grad_y), to_float(grad_h_n), to_float(grad_c_n), to_float(h0),
        to_float(c0), to_float(y), to_float(saved), to_float(w_hh), to_float(w_hr), lengths);
    const at::ScalarType type = y.scalar_type();
    return {grad_xp.to(type),   grad_h0.to(type),   to_type(grad_c0, type),
            grad_w_hh.to(type), grad_b_hh.to(type), grad_w_hr.to(type)};
  }
  const at::Tensor host_lengths32 = host_lengths(op, lengths, problem);
  const GatedBackwardCall call = gated_backward_call(problem, grad_y, grad_h_n, grad_c_n, h0, c0, y,
                                                     saved, w_hh, w_hr, host_lengths32);
  if (!is_empty(problem) && !use_cpu_reference()) {
    gated_backward_aten(problem, call, host_lengths32, lengths);
  } else if (!is_empty(problem)) {
    prnn_plan_t plan;
    check_status(op, prnn_plan_cpu(&problem, PRNN_PASS_BACKWARD_DATA, &plan));
    at::Tensor ws = workspace(plan, y);
    check_status(op, prnn_gated_backward_data_cpu(&problem, &call.args, workspace_ptr(ws),
                                                  plan.workspace_bytes));
  }
  return finish_gated_backward(problem, call, lengths);
}

// A PackedSequence's batch_sizes as pack_padded_sequence makes them, for
// `batch` sequences of `rows` packed rows: a 1-D CPU tensor of integers,
// batch_sizes[0] == batch, non-negative, non-increasing, summing to rows.
// A hand-built one with growing sizes would run with the wrong lengths, and
// a negative or too large size index out of range. Returns them as int64.
at::Tensor checked_batch_sizes(const at::Tensor& batch_sizes, int64_t batch, int64_t rows) {
  TORCH_CHECK_VALUE(batch >= 0 && rows >= 0, "PackedSequence: the batch and the number of data rows must be >= 0, got ",
                    batch, " and ", rows);
  TORCH_CHECK_TYPE(batch_sizes.dim() == 1, "PackedSequence: batch_sizes must be a 1-D tensor of integers, got ",
                   batch_sizes.dim(), "-D");
  TORCH_CHECK_TYPE(at::isIntegralType(batch_sizes.scalar_type(), /*includeBool=*/false),
                   "PackedSequence: batch_sizes must be a 1-D tensor of integers, got other values");
  TORCH_CHECK(batch_sizes.device().is_cpu(), "PackedSequence: batch_sizes must be on the CPU, got one on ",
              batch_sizes.device());
  const at::Tensor sizes = batch_sizes.to(at::kLong).contiguous();
  const int64_t steps = sizes.numel();
  const int64_t* size = sizes.const_data_ptr<int64_t>();
  const auto listed = [&] {
    std::string list = "[";
    for (int64_t t = 0; t < steps; ++t) list += (t > 0 ? ", " : "") + std::to_string(size[t]);
    return list + "]";
  };
  TORCH_CHECK(steps == 0 || size[0] == batch, "PackedSequence: batch_sizes ", listed(), " is a batch of ", size[0],
              " sequences, but sorted_indices or hx have a batch of ", batch);
  bool well_formed = true;
  int64_t sum = 0;
  for (int64_t t = 0; t < steps; ++t) {
    well_formed &= size[t] >= 0 && (t == 0 || size[t] <= size[t - 1]);
    sum += size[t];
  }
  TORCH_CHECK(well_formed && sum == rows,
              "PackedSequence: batch_sizes must be non-negative, non-increasing and sum to the number of data "
              "rows, got batch_sizes ", listed(), " for ", rows, " rows");
  return sizes;
}

// prnn::check_packed: checked_batch_sizes alone, for a packed call handed
// over to torch's recurrence, which reads batch_sizes unchecked.
void check_packed(const at::Tensor& batch_sizes, c10::SymInt batch, c10::SymInt rows) {
  checked_batch_sizes(batch_sizes, batch.expect_int(), rows.expect_int());
}

// prnn::packed_rows: a PackedSequence's lengths [batch] and the index of
// each of its `rows` packed rows in the flattened padded [steps * batch] rows,
// int64 on the CPU (the index in pinned memory with pin_memory, for a queued
// copy to a GPU). Packed rows are time-major, each step's sequences in batch
// order. batch_sizes checked first (checked_batch_sizes).
std::tuple<at::Tensor, at::Tensor> packed_rows(const at::Tensor& batch_sizes, c10::SymInt batch_,
                                               c10::SymInt rows_, bool pin_memory) {
  const int64_t batch = batch_.expect_int(), rows = rows_.expect_int();
  const at::Tensor sizes = checked_batch_sizes(batch_sizes, batch, rows);
  const int64_t steps = sizes.numel();
  const int64_t* size = sizes.const_data_ptr<int64_t>();
  at::Tensor lengths = at::zeros({batch}, at::kLong);
  at::Tensor index = at::empty({rows}, at::TensorOptions().dtype(at::kLong).pinned_memory(pin_memory));
  int64_t *length = lengths.mutable_data_ptr<int64_t>(), *row = index.mutable_data_ptr<int64_t>();
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t b = 0; b < size[t]; ++b) {  // size[t] <= size[0] = batch
      *row++ = t * batch + b;
      ++length[b];
    }
  return {lengths, index};
}

}  // namespace

}  // namespace torch_prnn

TORCH_LIBRARY(prnn, m) {
  // h_n: each sequence's state after its last step, a tensor of its own (a
  // view of y would make its gradient and y's one, unlike nn.RNN's outputs).
  m.def(
      "forward(Tensor xp, Tensor h0, Tensor w_hh, Tensor? lengths, str nonlinearity) "
      "-> (Tensor y, Tensor h_n)");
  m.def(
      "backward(Tensor grad_y, Tensor y, Tensor h0, Tensor w_hh, Tensor? lengths, "
      "str nonlinearity, bool h0_grad=True) -> (Tensor grad_xp, Tensor grad_h0, Tensor grad_w_hh)");
  // What PersistentRNN runs per layer (forward direction): x [T,B,I] -> (y [T,B,H],
  // h_n [B,H]), with xp = x w_ih^T + b_ih + b_hh. One op (one autograd node)
  // instead of the projection's and the recurrence's: host time the GPU waits
  // for in eager calls (bench/NOTES.md).
  m.def(
      "layer(Tensor x, Tensor w_ih, Tensor? b_ih, Tensor? b_hh, Tensor h0, Tensor w_hh, "
      "Tensor? lengths, str nonlinearity) -> (Tensor y, Tensor h_n)");
  // The gated cells (torch.nn.LSTM's and torch.nn.GRU's), one layer and
  // direction: xp = x W_ih^T + b_ih [T,B,G*H] is the caller's GEMM, b_hh is
  // added inside (a GRU's b_hn sits inside r * (...)). `saved` is what the
  // backward op takes ([T,B,SAVED*H] with save=True, else a [0] tensor); the
  // autograd kernel asks for it itself when it records a graph.
  m.def(
      "lstm(Tensor xp, Tensor? b_hh, Tensor h0, Tensor c0, Tensor w_hh, Tensor? w_hr, "
      "Tensor? lengths, bool save=False) -> (Tensor y, Tensor h_n, Tensor c_n, Tensor saved)");
  m.def(
      "lstm_backward(Tensor grad_y, Tensor? grad_h_n, Tensor? grad_c_n, Tensor h0, Tensor c0, "
      "Tensor y, Tensor saved, Tensor w_hh, Tensor? w_hr, Tensor? lengths) -> (Tensor grad_xp, "
      "Tensor grad_h0, Tensor grad_c0, Tensor grad_w_hh, Tensor grad_b_hh, Tensor grad_w_hr)");
  m.def(
      "gru(Tensor xp, Tensor? b_hh, Tensor h0, Tensor w_hh, Tensor? lengths, bool save=False) "
      "-> (Tensor y, Tensor h_n, Tensor saved)");
  m.def(
      "gru_backward(Tensor grad_y, Tensor? grad_h_n, Tensor h0, Tensor y, Tensor saved, "
      "Tensor w_hh, Tensor? lengths) -> (Tensor grad_xp, Tensor grad_h0, Tensor grad_w_hh, "
      "Tensor grad_b_hh)");
  // A gated layer's forward with its input projection, x [T,B,I] -> (y, h_n,
  // c_n), for calls that need no gradient (prnn::layers under no_grad on
  // CUDA): one launch where the few-steps kernel takes it (T = 1, B <= 16),
  // else the GEMM then prnn::lstm / prnn::gru. No autograd formula. c_n is a
  // [0] tensor for a GRU; mode: 'LSTM' or 'GRU'.
  m.def(
      "gated_layer(Tensor x, Tensor w_ih, Tensor? b_ih, Tensor? b_hh, Tensor h0, Tensor? c0, Tensor w_hh, "
      "str mode) -> (Tensor y, Tensor h_n, Tensor c_n)");
  // Every layer of a one-direction PersistentRNN, PersistentLSTM or
  // PersistentGRU, from input [T,B,I], h [layers,B,S] and an LSTM's c: what
  // their forward runs for an eager call on tensor input, in one crossing
  // from Python (prnn_layers.cpp). params: the modules' _flat_weights; mode:
  // nn's. c_n is None but for an LSTM.
  m.def(
      "layers(Tensor input, Tensor h, Tensor? c, Tensor[] params, str mode, float dropout) "
      "-> (Tensor output, Tensor h_n, Tensor c_n)");
  // A PackedSequence's lengths and where its rows sit in the padded batch
  // (packed_rows above), for eager calls and torch.compile's graphs alike.
  m.def("packed_rows(Tensor batch_sizes, SymInt batch, SymInt rows, bool pin_memory=False) -> (Tensor, Tensor)");
  m.def("check_packed(Tensor batch_sizes, SymInt batch, SymInt rows) -> ()");
  // No tensor arguments, so one kernel for every device.
  m.def(
      "plan(int steps, int batch, int hidden, ScalarType dtype, Device device, "
      "str nonlinearity, bool backward, bool has_lengths, int input=0, str cell=\"rnn\", "
      "int proj_size=0) -> int[]",
      &torch_prnn::plan);
}

TORCH_LIBRARY_IMPL(prnn, CPU, m) {
  m.impl("forward", &torch_prnn::forward_cpu);
  m.impl("backward", &torch_prnn::backward_cpu);
  m.impl("lstm", &torch_prnn::lstm_kernel<torch_prnn::gated_forward_cpu>);
  m.impl("lstm_backward", &torch_prnn::lstm_backward_kernel<torch_prnn::gated_backward_cpu>);
  m.impl("gru", &torch_prnn::gru_kernel<torch_prnn::gated_forward_cpu>);
  m.impl("gru_backward", &torch_prnn::gru_backward_kernel<torch_prnn::gated_backward_cpu>);
}

// The layer's GEMM and the recurrence's own dispatch cover every device (CUDA
// has its own kernel, which fuses the two where it can: prnn_ops_cuda.cpp).
TORCH_LIBRARY_IMPL(prnn, CompositeExplicitAutograd, m) {
  m.impl("packed_rows", &torch_prnn::packed_rows);  // batch_sizes on any device gets its check
  m.impl("check_packed", &torch_prnn::check_packed);
  m.impl("layer", &torch_prnn::layer_forward);
  m.impl("gated_layer", &torch_prnn::gated_layer_forward);
}
