// prnn_ops.cpp - the prnn:: op schemas, their CPU impls, prnn::layer (input
// projection + recurrence), the plan op, and the checks and GEMMs shared with
// the CUDA impls (prnn_ops_cuda.cpp) and the autograd (prnn_autograd.cpp).
//
// The recurrence itself runs in csrc/kernels behind the torch-free C API of
// prnn.h; this file only checks tensors, allocates outputs and workspace, and
// turns a status into a Python error.
#include <Python.h>
#include <torch/library.h>

#include <array>
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
namespace {

std::optional<prnn_dtype_t> to_prnn_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return PRNN_DTYPE_FLOAT32;
    case at::kDouble: return PRNN_DTYPE_FLOAT64;
    case at::kHalf: return PRNN_DTYPE_FLOAT16;
    case at::kBFloat16: return PRNN_DTYPE_BFLOAT16;
    default: return std::nullopt;
  }
}

prnn_activation_t to_activation(const char* op, c10::string_view nonlinearity) {
  TORCH_CHECK_VALUE(nonlinearity == "tanh" || nonlinearity == "relu", op,
                    ": nonlinearity must be 'tanh' or 'relu', got '", std::string(nonlinearity),
                    "'");
  return nonlinearity == "tanh" ? PRNN_ACT_TANH : PRNN_ACT_RELU;
}

// A None passed for a Tensor argument arrives as an undefined tensor.
void check_defined(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", name, " must be a tensor, got None");
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

// The CPU reference computes in float32 or float64: float16 and bfloat16 are
// upcast to float32 and the results cast back.

at::Tensor forward_cpu(const at::Tensor& xp, const at::Tensor& h0, const at::Tensor& w_hh,
                       const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity) {
  const char* op = "prnn::forward";
  const prnn_problem_t problem = check_forward(xp, h0, w_hh, lengths, nonlinearity);
  if (is_reduced_precision(xp)) {
    return forward_cpu(xp.to(at::kFloat), h0.to(at::kFloat), w_hh.to(at::kFloat), lengths,
                       nonlinearity)
        .to(xp.scalar_type());
  }
  const at::Tensor host_lengths32 = host_lengths(op, lengths, problem);
  at::Tensor y = at::empty({problem.steps, problem.batch, problem.hidden}, xp.options());
  if (is_empty(problem)) return y;

  const at::Tensor xp_ = unit_last_stride(xp), h0_ = unit_last_stride(h0),
                   w_hh_ = unit_last_stride(w_hh);
  prnn_plan_t plan;
  check_status(op, prnn_plan_cpu(&problem, PRNN_PASS_FORWARD, &plan));
  at::Tensor ws = workspace(plan, xp);
  const prnn_forward_args_t args = forward_args(xp_, h0_, w_hh_, host_lengths32, y);
  check_status(op, prnn_forward_cpu(&problem, &args, workspace_ptr(ws), plan.workspace_bytes));
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& grad_y, const at::Tensor& y, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity) {
  const char* op = "prnn::backward";
  const prnn_problem_t problem = check_backward(grad_y, y, h0, w_hh, lengths, nonlinearity);
  if (is_reduced_precision(y)) {
    const auto [grad_xp, grad_h0, grad_w_hh] =
        backward_cpu(grad_y.to(at::kFloat), y.to(at::kFloat), h0.to(at::kFloat),
                     w_hh.to(at::kFloat), lengths, nonlinearity);
    const at::ScalarType type = y.scalar_type();
    return {grad_xp.to(type), grad_h0.to(type), grad_w_hh.to(type)};
  }
  const at::Tensor host_lengths32 = host_lengths(op, lengths, problem);
  at::Tensor grad_xp = at::empty({problem.steps, problem.batch, problem.hidden}, y.options());
  if (!is_empty(problem)) {
    const at::Tensor grad_y_ = unit_last_stride(grad_y), y_ = y.contiguous(),
                     w_hh_ = unit_last_stride(w_hh);
    prnn_plan_t plan;
    check_status(op, prnn_plan_cpu(&problem, PRNN_PASS_BACKWARD_DATA, &plan));
    at::Tensor ws = workspace(plan, y);
    const prnn_backward_args_t args = backward_args(grad_y_, y_, w_hh_, host_lengths32, grad_xp);
    check_status(op, prnn_backward_data_cpu(&problem, &args, workspace_ptr(ws), plan.workspace_bytes));
  }
  return finish_backward(grad_xp, y, h0, w_hh);
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

// Returns [tier, workspace_bytes, grid, block, rows_per_cta, smem_bytes, fused_input_projection].
std::vector<int64_t> plan(int64_t steps, int64_t batch, int64_t hidden, at::ScalarType dtype,
                          c10::Device device, c10::string_view nonlinearity, bool backward,
                          bool has_lengths, int64_t input) {
  const char* op = "prnn::plan";
  const std::optional<prnn_dtype_t> type = to_prnn_dtype(dtype);
  TORCH_CHECK(type.has_value(), op, ": dtype must be float32, float64, float16 or bfloat16, got ",
              dtype);
  const prnn_problem_t problem{PRNN_CELL_ELMAN, to_activation(op, nonlinearity), *type, steps,
                               batch, hidden, has_lengths};
  prnn_plan_t plan{};
  TORCH_CHECK(input >= 0, op, ": input must be >= 0, got ", input);
  // The fused layer (forward only): its plan where a kernel fuses it, else the recurrence's.
  bool fused = false;
#ifdef WITH_CUDA
  if (input > 0 && !backward && device.is_cuda()) {
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

at::Tensor layer_forward(const at::Tensor& x, const at::Tensor& w_ih,
                         const std::optional<at::Tensor>& b_ih,
                         const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
                         const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
                         c10::string_view nonlinearity) {
  return call_forward(input_projection(x, w_ih, b_ih, b_hh), h0, w_hh, lengths, nonlinearity);
}

at::Tensor as_rows(const at::Tensor& t) {
  return t.reshape_symint({t.sym_size(0) * t.sym_size(1), t.sym_size(2)});
}

void check_input_projection(const at::Tensor& x, const at::Tensor& w_ih,
                            const std::optional<at::Tensor>& b_ih,
                            const std::optional<at::Tensor>& b_hh) {
  const char* op = "prnn::layer";
  check_rank(op, "x", x, 3, "[steps, batch, input]");
  check_rank(op, "w_ih", w_ih, 2, "[hidden, input]");
  check_like(op, "w_ih", w_ih, "x", x);
  // Symbolic sizes (see as_rows).
  const c10::SymInt T = x.sym_size(0), B = x.sym_size(1), I = x.sym_size(2), H = w_ih.sym_size(0);
  TORCH_CHECK(w_ih.sym_size(1) == I, op, ": w_ih must have shape [hidden, input=", I, "], got ",
              w_ih.sym_sizes());
  TORCH_CHECK(b_ih.has_value() == b_hh.has_value(), op,
              ": b_ih and b_hh must both be tensors or both be None");
  if (!b_ih.has_value()) return;
  const auto check_bias = [&](const char* name, const at::Tensor& b) {
    check_rank(op, name, b, 1, "[hidden]");
    check_like(op, name, b, "x", x);
    TORCH_CHECK(b.sym_size(0) == H, op, ": ", name, " must have shape [hidden=", H, "], got ",
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

at::Tensor call_layer(const at::Tensor& x, const at::Tensor& w_ih,
                      const std::optional<at::Tensor>& b_ih, const std::optional<at::Tensor>& b_hh,
                      const at::Tensor& h0, const at::Tensor& w_hh,
                      const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::layer", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, c10::string_view)>();
  return op.call(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity);
}

at::Tensor call_forward(const at::Tensor& xp, const at::Tensor& h0, const at::Tensor& w_hh,
                        const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::forward", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, c10::string_view)>();
  return op.call(xp, h0, w_hh, lengths, nonlinearity);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_backward(
    const at::Tensor& grad_y, const at::Tensor& y, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&, c10::string_view)>();
  return op.call(grad_y, y, h0, w_hh, lengths, nonlinearity);
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
                        const prnn_problem_t& problem) {
  if (!lengths.has_value()) return at::Tensor();
  const at::Tensor& l = *lengths;
  TORCH_CHECK(l.device().is_cpu(), op,
              ": lengths must be a CPU tensor (like nn.RNN's batch_sizes), got one on ",
              l.device());
  TORCH_CHECK(l.scalar_type() == at::kLong, op, ": lengths must be int64, got ", l.scalar_type());
  TORCH_CHECK(l.dim() == 1 && l.size(0) == problem.batch, op, ": lengths must have shape [batch=",
              problem.batch, "], got ", l.sizes());
  if (problem.batch > 0) {
    const int64_t lo = l.min().item<int64_t>(), hi = l.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi <= problem.steps, op, ": lengths must be in [0, steps=",
                problem.steps, "], got values in [", lo, ", ", hi, "]");
  }
  return l.to(at::kInt).contiguous();
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> finish_backward(const at::Tensor& grad_xp,
                                                               const at::Tensor& y,
                                                               const at::Tensor& h0,
                                                               const at::Tensor& w_hh) {
  const int64_t T = grad_xp.size(0);
  if (T == 0) {
    return {grad_xp, at::zeros(h0.sizes(), h0.options()), at::zeros(w_hh.sizes(), w_hh.options())};
  }
  const at::Tensor delta0 = grad_xp.select(0, 0);  // batch x hidden
  // Every step in one GEMM over the flattened (step, batch) rows, against
  // the state before each step (h0, then y_0 .. y_{T-2}). The t = 0 term as a
  // GEMM of its own (K = batch) made cuBLAS load a kernel that took 30-40 ms
  // on its first call (bench/NOTES.md step 33; at T = 1 K is the batch
  // again); the copy costs T B H elements.
  const at::Tensor prev = at::cat({h0.unsqueeze(0), y.slice(0, 0, T - 1)}, 0);
  at::Tensor grad_w_hh = as_rows(grad_xp).t().mm(as_rows(prev));
  return {grad_xp, delta0.mm(w_hh), grad_w_hh};
}

}  // namespace torch_prnn

TORCH_LIBRARY(prnn, m) {
  m.def("forward(Tensor xp, Tensor h0, Tensor w_hh, Tensor? lengths, str nonlinearity) -> Tensor");
  m.def(
      "backward(Tensor grad_y, Tensor y, Tensor h0, Tensor w_hh, Tensor? lengths, "
      "str nonlinearity) -> (Tensor grad_xp, Tensor grad_h0, Tensor grad_w_hh)");
  // What PersistentRNN runs per layer (forward direction): x [T,B,I] -> y [T,B,H],
  // with xp = x w_ih^T + b_ih + b_hh. One op (one autograd node) instead of
  // the projection's and the recurrence's: host time the GPU waits for in
  // eager calls (bench/NOTES.md).
  m.def(
      "layer(Tensor x, Tensor w_ih, Tensor? b_ih, Tensor? b_hh, Tensor h0, Tensor w_hh, "
      "Tensor? lengths, str nonlinearity) -> Tensor");
  // No tensor arguments, so one kernel for every device.
  m.def(
      "plan(int steps, int batch, int hidden, ScalarType dtype, Device device, "
      "str nonlinearity, bool backward, bool has_lengths, int input=0) -> int[]",
      &torch_prnn::plan);
}

TORCH_LIBRARY_IMPL(prnn, CPU, m) {
  m.impl("forward", &torch_prnn::forward_cpu);
  m.impl("backward", &torch_prnn::backward_cpu);
}

// The layer's GEMM and the recurrence's own dispatch cover every device (CUDA
// has its own kernel, which fuses the two where it can: prnn_ops_cuda.cpp).
TORCH_LIBRARY_IMPL(prnn, CompositeExplicitAutograd, m) {
  m.impl("layer", &torch_prnn::layer_forward);
}
