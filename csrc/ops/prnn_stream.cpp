// prnn_stream.cpp - the host side of a stream, torch.classes.prnn.ResidentStream:
// the buffers both ends share, a step as one crossing from Python (x into its
// tagged words, post, wait for every CTA's answer, copy y out), the state
// commands, and closing. What answers the
// mailbox is a resident kernel (launch(), CUDA builds) or, in tests of this
// side alone, whoever writes its answer words.
//
// Every wait has a deadline: a kernel that stops answering raises an error
// (and breaks the stream) instead of hanging the caller.
#include <Python.h>  // first, as Python asks; the limited API (setup.py)

#include <ATen/MemoryOverlap.h>
#include <c10/util/accumulate.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>

#include "prnn_stream.h"

namespace torch_prnn {
namespace {

using Clock = std::chrono::steady_clock;

// A step's answer usually comes within microseconds: spin that long before
// the first look at the kernel's health, then look every kCheckNs.
constexpr int64_t kQuickWaitNs = 200 * 1000;
constexpr int64_t kCheckNs = 1000 * 1000;
constexpr size_t kPiece = 128;

size_t piece(size_t bytes) { return (bytes + kPiece - 1) / kPiece * kPiece; }

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

prnn_dtype_t stream_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return PRNN_DTYPE_FLOAT32;
    case at::kBFloat16: return PRNN_DTYPE_BFLOAT16;
    case at::kHalf: return PRNN_DTYPE_FLOAT16;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "Stream: dtype must be float32, bfloat16 or float16, got ", type);
  }
  return PRNN_DTYPE_FLOAT32;  // not reached
}

StreamShape make_shape(const std::string& cell, const std::string& nonlinearity, int64_t layers, int64_t batch,
                       int64_t input, int64_t hidden, at::ScalarType dtype) {
  StreamShape s{};
  TORCH_CHECK_VALUE(cell == "rnn" || cell == "lstm" || cell == "gru", "Stream: cell must be 'rnn', 'lstm' or 'gru', got '",
                    cell, "'");
  s.cell = cell == "lstm" ? PRNN_CELL_LSTM : cell == "gru" ? PRNN_CELL_GRU : PRNN_CELL_ELMAN;
  TORCH_CHECK_VALUE(nonlinearity == "tanh" || nonlinearity == "relu",
                    "Stream: nonlinearity must be 'tanh' or 'relu', got '", nonlinearity, "'");
  s.activation = nonlinearity == "relu" ? PRNN_ACT_RELU : PRNN_ACT_TANH;
  TORCH_CHECK_VALUE(layers >= 1 && layers <= PRNN_RESIDENT_MAX_LAYERS, "Stream: num_layers must be in [1, ",
                    PRNN_RESIDENT_MAX_LAYERS, "], got ", layers);
  TORCH_CHECK_VALUE(batch >= 1 && input >= 1 && hidden >= 1,
                    "Stream: batch, input_size and hidden_size must be >= 1, got ", batch, ", ", input, ", ", hidden);
  s.dtype = stream_dtype(dtype);
  s.scalar_type = dtype;
  s.layers = layers;
  s.batch = batch;
  s.input = input;
  s.hidden = hidden;
  return s;
}

// A CPU tensor with t's values (t itself on the CPU) that no CUDA kernel made:
// while a stream is open a kernel launch may wait for its kernel to end (CUDA's
// lazy loading waits for the device to be idle before a kernel's first
// launch), so a GPU tensor is copied with plain memcpys - a contiguous one
// whole, any other as the one storage span that holds its elements, viewed
// with its strides on the CPU.
at::Tensor host_copy(const at::Tensor& t) {
  if (!t.device().is_cuda() || t.is_contiguous()) return t.to(at::kCPU);
  if (t.numel() == 0) return at::empty(t.sizes(), t.options().device(at::kCPU));
  int64_t span = 1;  // strides are >= 0
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  const at::Tensor piece = t.as_strided({span}, {1}, t.storage_offset()).to(at::kCPU);
  return piece.as_strided(t.sizes(), t.strides(), 0);
}

// Writes the CPU tensor src into dst, a dense GPU tensor (its elements fill one
// storage span, in any order) of src's shape and dtype, without a CUDA kernel:
// laid out as dst's span on the host, then one memcpy.
void write_dense(const at::Tensor& dst, const at::Tensor& src) {
  const int64_t n = dst.numel();
  const at::Tensor host = at::empty({n}, src.options());
  host.as_strided(dst.sizes(), dst.strides(), 0).copy_(src);
  dst.as_strided({n}, {1}, dst.storage_offset()).copy_(host);
}

// Host memory for the streams' buffers, cut from chunks that are never freed.
// torch's pinned allocator makes one cudaHostAlloc for each block it has no
// free one of (it does not split its blocks), so a stream opened beside open
// ones would allocate page-locked memory while their kernels run - a call
// CUDA lists among those that may synchronise, and freeing one (cudaFreeHost)
// does. A chunk (kChunkBytes, or the request if larger) serves many streams:
// the first stream pays its allocation, before any kernel of a stream runs.
// Pieces are kPiece-aligned and zeroed when taken; a closed stream gives its
// piece back (an abandoned one keeps it: its kernel may still write there).
class HostPool {
 public:
  static constexpr size_t kChunkBytes = 4 << 20;

  struct Piece {
    at::Tensor bytes;  // a view of its chunk (which it keeps alive)
    size_t chunk = 0, offset = 0, size = 0;
  };

  explicit HostPool(bool pinned) : pinned_(pinned) {}

  Piece take(size_t bytes) {
    bytes = (bytes + kPiece - 1) / kPiece * kPiece;
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t c = 0; c < chunks_.size(); ++c) {
      for (auto it = chunks_[c].free.begin(); it != chunks_[c].free.end(); ++it) {
        if (it->second < bytes) continue;
        const size_t offset = it->first, left = it->second - bytes;
        chunks_[c].free.erase(it);
        if (left > 0) chunks_[c].free.emplace(offset + bytes, left);
        return piece_of(c, offset, bytes);
      }
    }
    const size_t size = std::max(kChunkBytes, bytes);
    Chunk chunk;
    chunk.storage = at::empty({(int64_t)(size + kPiece)}, at::TensorOptions().dtype(at::kByte).pinned_memory(pinned_));
    const uintptr_t base = reinterpret_cast<uintptr_t>(chunk.storage.data_ptr());
    chunk.start = (kPiece - base % kPiece) % kPiece;
    if (size > bytes) chunk.free.emplace(bytes, size - bytes);
    chunks_.push_back(std::move(chunk));
    return piece_of(chunks_.size() - 1, 0, bytes);
  }

  // Returns a piece taken from this pool; it merges with the free space beside it.
  void give(const Piece& piece) {
    if (piece.size == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<size_t, size_t>& free = chunks_[piece.chunk].free;
    size_t offset = piece.offset, size = piece.size;
    auto next = free.lower_bound(offset);
    if (next != free.begin()) {
      auto before = std::prev(next);
      if (before->first + before->second == offset) {
        offset = before->first;
        size += before->second;
        free.erase(before);
      }
    }
    if (next != free.end() && offset + size == next->first) {
      size += next->second;
      free.erase(next);
    }
    free.emplace(offset, size);
  }

 private:
  struct Chunk {
    at::Tensor storage;
    size_t start = 0;                  // the first kPiece-aligned byte
    std::map<size_t, size_t> free;     // offset from start -> bytes
  };

  Piece piece_of(size_t c, size_t offset, size_t bytes) {
    Piece p;
    p.bytes = chunks_[c].storage.narrow(0, (int64_t)(chunks_[c].start + offset), (int64_t)bytes);
    std::memset(p.bytes.data_ptr(), 0, bytes);
    p.chunk = c;
    p.offset = offset;
    p.size = bytes;
    return p;
  }

  const bool pinned_;
  std::mutex mutex_;
  std::vector<Chunk> chunks_;
};

// Never destroyed: a stream may close as the process exits, after static destructors.
HostPool& host_pool(bool pinned) {
  static HostPool* pools[2] = {new HostPool(false), new HostPool(true)};
  return *pools[pinned ? 1 : 0];
}

// Kernels that did not end when their stream closed, with the memory they may
// still write: kept for the life of the process (never freed, never counted
// free).
struct Abandoned {
  std::unique_ptr<ResidentKernel> kernel;
  at::Tensor storage;
};
std::mutex* g_abandoned_mutex = new std::mutex();
std::vector<Abandoned>* g_abandoned = new std::vector<Abandoned>();

class ResidentStream : public torch::CustomClassHolder {
 public:
  ResidentStream(std::string cell, std::string nonlinearity, int64_t layers, int64_t batch, int64_t input,
                 int64_t hidden, at::ScalarType dtype, bool pinned, double timeout_s)
      : shape_(make_shape(cell, nonlinearity, layers, batch, input, hidden, dtype)), timeout_s_(timeout_s) {
    TORCH_CHECK_VALUE(timeout_s > 0, "Stream: timeout must be > 0 seconds, got ", timeout_s);
    allocate(pinned);
  }

  ~ResidentStream() override {
    try {
      close();
    } catch (...) {
      // Nothing to raise into: a kernel that did not end is abandoned (close()).
    }
  }

  // Starts the resident kernel on CUDA device `device` and waits until it
  // holds the weights. Returns [grid, block, units_per_cta, smem_bytes].
  std::vector<int64_t> launch(std::vector<at::Tensor> weights, bool bias, int64_t device, int64_t max_sms,
                              double start_timeout_s) {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(state_ == State::kOpen && kernel_ == nullptr, "Stream.launch: the stream was launched or closed");
#ifdef WITH_CUDA
    TORCH_CHECK(buffers_.storage.is_pinned(), "Stream.launch: the stream's buffers are not pinned");
    TORCH_CHECK_VALUE(start_timeout_s > 0, "Stream: start_timeout must be > 0 seconds, got ", start_timeout_s);
    std::vector<int64_t> plan;
    kernel_ = launch_resident(shape_, buffers_, weights, bias, device, max_sms, &plan);
    device_index_ = device;
    answering_ctas_ = (int)plan[0];  // every CTA answers each command
    const Clock::time_point start = Clock::now();
    while (!prnn_resident_is_ready(buffers_.mailbox)) {
      std::string why = kernel_->check_running();
      if (why.empty() && seconds_since(start) > start_timeout_s)
        why = c10::str("not within ", start_timeout_s) +
              " s (start_timeout): its launch waits until the SMs it needs are free of other work";
      if (!why.empty()) {
        std::string closing;
        try {
          close_locked();
        } catch (const c10::Error& e) {
          closing = std::string("; ") + e.what_without_backtrace();
        }
        TORCH_CHECK(false, "Stream: the resident kernel did not start: ", why, closing);
      }
      std::this_thread::yield();
    }
    return plan;
#else
    (void)weights, (void)bias, (void)device, (void)max_sms, (void)start_timeout_s;
    TORCH_CHECK(false, "Stream: torch_prnn was built without CUDA");
    return {};
#endif
  }

  at::Tensor step(const at::Tensor& x) { return run_step(x, nullptr); }

  // The hot path of a step (_C._stream_step): x and out as TensorImpls (a
  // tensor's _cdata; the caller keeps them alive). Steps when both are plain
  // CPU tensors of the stream's dtype, contiguous, x [batch, input] and out
  // [batch, hidden] (or [input] and [hidden] for a batch of one): returns
  // kStepped. kNotPlain for anything else (the caller goes the checked way,
  // step / step_into); else the error.
  static constexpr const char* kStepped = "";
  static constexpr const char* kNotPlain = "not plain";
  std::string step_raw(const c10::TensorImpl* x, c10::TensorImpl* out) noexcept {
    try {
      const int64_t B = shape_.batch;
      const bool batched = x->dim() == 2;
      const std::array<int64_t, 2> x_shape{B, shape_.input}, out_shape{B, shape_.hidden};
      const size_t skip = batched ? 0 : 1;  // unbatched: [input] and [hidden]
      if ((!batched && B != 1) || !plain_cpu(*x, at::IntArrayRef(x_shape).slice(skip)) ||
          !plain_cpu(*out, at::IntArrayRef(out_shape).slice(skip)) || out->requires_grad())
        return kNotPlain;
      std::lock_guard<std::mutex> lock(mutex_);
      check_usable("Stream.step");
      out->bump_version();  // as an in-place write does; refuses an inference tensor outside inference mode
      await(prnn_resident_post_step(buffers_.mailbox, buffers_.x_words, x->data(), x_bytes_), "Stream.step");
      std::memcpy(out->mutable_data(), buffers_.y, y_bytes_);
      return kStepped;
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  // The object's address, for _C._stream_step (its owner keeps it alive).
  int64_t handle() { return static_cast<int64_t>(reinterpret_cast<intptr_t>(this)); }
  at::Tensor step_into(const at::Tensor& x, const at::Tensor& out) { return run_step(x, &out); }

  // [h] or, for an LSTM, [h, c]: float32 CPU tensors [layers, batch, hidden].
  std::vector<at::Tensor> get_state() {
    std::lock_guard<std::mutex> lock(mutex_);
    check_usable("Stream.state");
    await(prnn_resident_post(buffers_.mailbox, PRNN_RESIDENT_GET_STATE), "Stream.state");
    std::vector<at::Tensor> state{h_view_.clone()};
    if (c_view_.defined()) state.push_back(c_view_.clone());
    return state;
  }

  // state: [h] or, for an LSTM, [h, c], each [layers, batch, hidden] on the
  // CPU or the stream's device; rounded to the stream's dtype.
  void set_state(const std::vector<at::Tensor>& state) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_usable("Stream.set_state");
    const bool lstm = shape_.cell == PRNN_CELL_LSTM;
    TORCH_CHECK_VALUE(state.size() == (lstm ? 2u : 1u), "Stream.set_state: expected ",
                      lstm ? "(h, c) for an LSTM" : "one tensor h", ", got ", state.size(), " tensors");
    const char* names[] = {"h", "c"};
    std::vector<at::Tensor> values;
    for (size_t i = 0; i < state.size(); ++i) {
      const at::Tensor& t = state[i];
      TORCH_CHECK_VALUE(t.defined(), "Stream.set_state: ", names[i], " must be a tensor, got None");
      TORCH_CHECK_VALUE(t.sizes() == h_view_.sizes(), "Stream.set_state: ", names[i], " must have shape [num_layers=",
                        shape_.layers, ", batch=", shape_.batch, ", hidden_size=", shape_.hidden, "], got ", t.sizes());
      TORCH_CHECK_VALUE(t.is_floating_point(), "Stream.set_state: ", names[i], " must be a floating-point tensor, got ",
                        t.scalar_type());
      check_device("Stream.set_state", names[i], t);
      // The state is carried at the element width (an LSTM's c at float32).
      at::Tensor v = host_copy(t);
      if (i == 0) v = v.to(shape_.scalar_type);
      values.push_back(v.to(at::kFloat).contiguous());
    }
    h_view_.copy_(values[0]);
    if (lstm) c_view_.copy_(values[1]);
    await(prnn_resident_post(buffers_.mailbox, PRNN_RESIDENT_SET_STATE), "Stream.set_state");
  }

  // Zeroes the state of the sequences b with mask[b] (bool [batch], on the CPU
  // or the stream's device).
  void reset(const at::Tensor& mask) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_usable("Stream.reset");
    TORCH_CHECK_VALUE(mask.defined() && mask.scalar_type() == at::kBool && mask.dim() == 1 &&
                          mask.size(0) == shape_.batch,
                      "Stream.reset: mask must be a bool tensor of shape [batch=", shape_.batch, "], got ",
                      mask.defined() ? c10::toString(mask.scalar_type()) : "None", " ",
                      mask.defined() ? mask.sizes() : at::IntArrayRef{});
    check_device("Stream.reset", "mask", mask);
    mask_view_.copy_(host_copy(mask).to(at::kByte));
    await(prnn_resident_post(buffers_.mailbox, PRNN_RESIDENT_RESET), "Stream.reset");
  }

  // Ends the kernel (a STOP, then its end) and releases what the stream holds.
  // Idempotent. Raises if the kernel did not end within the timeout: it is
  // then abandoned with its memory and SMs until the process exits.
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    close_locked();
  }

  bool is_open() {
    std::lock_guard<std::mutex> lock(mutex_);
    return state_ == State::kOpen;
  }

  // Closed, as opposed to open or broken (a broken stream's kernel may still run).
  bool is_closed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return state_ == State::kClosed;
  }

  int64_t ctas() {
    std::lock_guard<std::mutex> lock(mutex_);
    return kernel_ != nullptr ? kernel_->ctas() : 0;
  }

  // The shared buffers as tensors (views, not copies), for tests of the host
  // side that answer the mailbox themselves: [mailbox as int32, x_t's tagged
  // words as int64, y, h, c (LSTM; else empty), mask].
  std::vector<at::Tensor> buffers() {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(state_ != State::kClosed, "Stream.buffers: the stream is closed");
    return {mailbox_view_, x_words_view_, y_view_, h_view_, c_view_.defined() ? c_view_ : at::empty({0}), mask_view_};
  }

  // How many answer words a command waits for (the kernel's CTAs; set by
  // launch), for tests of the host side that answer as several CTAs.
  void expect_answers(int64_t ctas) {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK_VALUE(ctas >= 1 && ctas <= PRNN_RESIDENT_MAX_CTAS, "Stream.expect_answers: ctas must be in [1, ",
                      PRNN_RESIDENT_MAX_CTAS, "], got ", ctas);
    answering_ctas_ = (int)ctas;
  }

 private:
  enum class State { kOpen, kBroken, kClosed };

  void allocate(bool pinned) {
    const StreamShape& s = shape_;
    const size_t elem = c10::elementSize(s.scalar_type);
    const size_t B = s.batch, I = s.input, H = s.hidden, L = s.layers;
    const bool lstm = s.cell == PRNN_CELL_LSTM;
    const size_t x_words = prnn_resident_x_words(B * I * elem);
    const size_t sizes[] = {piece(sizeof(prnn_resident_mailbox_t)), piece(x_words * 8), piece(B * H * elem),
                            piece(L * B * H * sizeof(float)), lstm ? piece(L * B * H * sizeof(float)) : 0,
                            piece(B)};
    size_t total = 0;
    for (size_t n : sizes) total += n;
    piece_ = host_pool(pinned).take(total);  // zeroed, kPiece-aligned
    pinned_ = pinned;
    const at::Tensor storage = piece_.bytes;
    size_t at_byte = 0;
    // A piece as a tensor view of `storage` (so it keeps the storage alive).
    auto view = [&](size_t i, at::ScalarType type, at::IntArrayRef shape) {
      const int64_t n = c10::multiply_integers(shape);
      at::Tensor v = storage.narrow(0, (int64_t)at_byte, n * (int64_t)c10::elementSize(type)).view(type).view(shape);
      at_byte += sizes[i];
      return v;
    };
    mailbox_view_ = view(0, at::kInt, {(int64_t)(sizeof(prnn_resident_mailbox_t) / 4)});
    x_words_view_ = view(1, at::kLong, {(int64_t)x_words});
    y_view_ = view(2, s.scalar_type, {s.batch, s.hidden});
    h_view_ = view(3, at::kFloat, {s.layers, s.batch, s.hidden});
    if (lstm) c_view_ = view(4, at::kFloat, {s.layers, s.batch, s.hidden});
    else at_byte += sizes[4];
    mask_view_ = view(5, at::kByte, {s.batch});
    buffers_.storage = storage;
    buffers_.mailbox = reinterpret_cast<prnn_resident_mailbox_t*>(mailbox_view_.data_ptr());
    buffers_.x_words = reinterpret_cast<uint64_t*>(x_words_view_.data_ptr());
    buffers_.y = y_view_.data_ptr();
    buffers_.h = h_view_.data_ptr<float>();
    buffers_.c = lstm ? c_view_.data_ptr<float>() : nullptr;
    buffers_.mask = mask_view_.data_ptr<uint8_t>();
    prnn_resident_mailbox_init(buffers_.mailbox);
    x_bytes_ = B * I * elem;
    y_bytes_ = B * H * elem;
  }

  void check_usable(const char* what) const {
    TORCH_CHECK(state_ != State::kClosed, what, ": the stream is closed");
    TORCH_CHECK(state_ != State::kBroken, what, ": the stream is broken (", broken_, "); close() it and open a new one");
  }

  // Whether t is a CPU tensor of the stream's dtype and `shape` whose bytes
  // are its values in order: contiguous, strided, no negative or conjugate
  // view, no wrapper (what step_raw copies with a memcpy).
  bool plain_cpu(const c10::TensorImpl& t, at::IntArrayRef shape) const {
    return t.is_cpu() && t.layout() == at::kStrided && t.has_storage() && !t.is_python_dispatch() && !t.is_neg() &&
           !t.is_conj() && !t.has_symbolic_sizes_strides() && t.dtype() == c10::scalarTypeToTypeMeta(shape_.scalar_type) &&
           t.sizes() == shape && t.is_contiguous() && t.data() != nullptr;
  }

  void check_device(const char* what, const char* name, const at::Tensor& t) const {
    const bool ours = t.device().is_cuda() && device_index_ >= 0 && t.device().index() == device_index_;
    TORCH_CHECK_VALUE(t.device().is_cpu() || ours, what, ": ", name, " must be on the CPU",
                      device_index_ >= 0 ? " or on the stream's device cuda:" + std::to_string(device_index_) : "",
                      ", got ", t.device());
  }

  // One STEP: x [batch, input] (or [input] for a batch of one) in, y out.
  at::Tensor run_step(const at::Tensor& x, const at::Tensor* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    const char* what = out != nullptr ? "Stream.step(out=)" : "Stream.step";
    check_usable(what);
    const int64_t B = shape_.batch, I = shape_.input, H = shape_.hidden;
    TORCH_CHECK_VALUE(x.defined(), what, ": x must be a tensor, got None");
    const bool unbatched = x.dim() == 1;
    TORCH_CHECK_VALUE((x.dim() == 2 && x.size(0) == B && x.size(1) == I) || (unbatched && B == 1 && x.size(0) == I),
                      what, ": x must have shape [batch=", B, ", input_size=", I, "]", B == 1 ? " or [input_size]" : "",
                      ", got ", x.sizes());
    TORCH_CHECK_VALUE(x.scalar_type() == shape_.scalar_type, what, ": x must have the stream's dtype ",
                      shape_.scalar_type, ", got ", x.scalar_type());
    TORCH_CHECK_VALUE(x.layout() == at::kStrided, what, ": x must be a dense (strided) tensor, got layout ",
                      x.layout());
    check_device(what, "x", x);
    // Everything that could refuse out is checked before the step runs: a step refused after it ran would lose
    // y_t with the state moved on.
    if (out != nullptr) {
      TORCH_CHECK_VALUE(out->defined(), what, ": out must be a tensor, got None");
      const bool shaped = unbatched ? out->dim() == 1 && out->size(0) == H
                                    : out->dim() == 2 && out->size(0) == B && out->size(1) == H;
      TORCH_CHECK_VALUE(shaped, what, ": out must have shape ", unbatched ? "[hidden_size=" : "[batch=",
                        unbatched ? "" : std::to_string(B) + ", hidden_size=", H, "], got ", out->sizes());
      TORCH_CHECK_VALUE(out->scalar_type() == shape_.scalar_type, what, ": out must have the stream's dtype ",
                        shape_.scalar_type, ", got ", out->scalar_type());
      check_device(what, "out", *out);
      // A strided copy on the GPU would be a kernel, which may wait for the stream's own (host_copy).
      TORCH_CHECK_VALUE(!out->device().is_cuda() || out->is_non_overlapping_and_dense(), what,
                        ": out on the GPU must be dense (its elements one block of memory, in any order), got strides ",
                        out->strides());
      TORCH_CHECK_VALUE(out->layout() == at::kStrided, what, ": out must be a dense (strided) tensor, got layout ",
                        out->layout());
      TORCH_CHECK_VALUE(at::has_internal_overlap(*out) != at::MemOverlap::Yes, what,
                        ": out must not have elements that share memory (an expanded tensor), got strides ",
                        out->strides());
      TORCH_CHECK_VALUE(!out->requires_grad(), what,
                        ": out must not require grad (the stream runs no autograd: write into a tensor that does not)");
      out->unsafeGetTensorImpl()->bump_version();  // refuses an inference tensor outside inference mode
    }

    // x_t's values in order on the host: from the GPU by a copy on the current stream, waited for, and never
    // by a kernel (host_copy); resolve_neg: a negative view's bytes are not its values.
    const at::Tensor x_host = host_copy(x).resolve_neg().contiguous();
    await(prnn_resident_post_step(buffers_.mailbox, buffers_.x_words, x_host.const_data_ptr(), x_bytes_), what);

    const at::Tensor y = unbatched ? y_view_[0] : y_view_;
    if (out != nullptr) {
      // A negative view takes its values by copy_ (its bytes are their negation).
      if (out->device().is_cpu() && out->is_contiguous() && !out->is_neg())
        std::memcpy(out->mutable_data_ptr(), buffers_.y, y_bytes_);
      else if (out->device().is_cpu() || out->is_contiguous()) out->copy_(y);
      else write_dense(*out, y);
      return *out;
    }
    if (x.device().is_cpu()) {
      at::Tensor fresh = at::empty(y.sizes(), at::TensorOptions().dtype(shape_.scalar_type));
      std::memcpy(fresh.mutable_data_ptr(), buffers_.y, y_bytes_);
      return fresh;
    }
    return y.to(x.device());  // from pinned memory, waited for: the buffer is reused next step
  }

  // Waits for the answer to the command posted as `seq`; raises (and breaks
  // the stream) when none comes within the timeout or the kernel stopped running.
  void await(uint32_t seq, const char* what) {
    std::string why;
    if (!answered(seq, timeout_s_, &why)) {
      state_ = State::kBroken;
      broken_ = why;
      TORCH_CHECK(false, what, ": ", why);
    }
  }

  // Waits up to timeout_s for the answer to `seq`; false with the reason if
  // none came.
  bool answered(uint32_t seq, double timeout_s, std::string* why) {
    const prnn_resident_mailbox_t* mailbox = buffers_.mailbox;
    if (prnn_resident_wait(mailbox, seq, answering_ctas_, kQuickWaitNs)) return true;
    const Clock::time_point start = Clock::now();
    for (;;) {
      if (kernel_ != nullptr) {
        const std::string failure = kernel_->check_running();
        if (!failure.empty()) {
          if (prnn_resident_wait(mailbox, seq, answering_ctas_, 0)) return true;  // it answered, then ended (a STOP)
          *why = failure;
          return false;
        }
      }
      if (prnn_resident_wait(mailbox, seq, answering_ctas_, kCheckNs)) return true;
      if (seconds_since(start) >= timeout_s) {
        *why = c10::str("no answer within ", timeout_s) +
               " s (the stream's timeout): the resident kernel is stalled or the GPU too busy to run it";
        return false;
      }
    }
  }

  void close_locked() {
    if (state_ == State::kClosed) return;
    const bool answering = kernel_ != nullptr || prnn_resident_is_ready(buffers_.mailbox);
    const bool had_kernel = kernel_ != nullptr;
    state_ = State::kClosed;
    std::string why;
    if (answering) answered(prnn_resident_post(buffers_.mailbox, PRNN_RESIDENT_STOP), timeout_s_, &why);
    if (kernel_ != nullptr && !kernel_->wait_ended(timeout_s_)) {
      const int64_t ctas = kernel_->ctas();
      {
        std::lock_guard<std::mutex> lock(*g_abandoned_mutex);
        g_abandoned->push_back(Abandoned{std::move(kernel_), buffers_.storage});
      }
      release(false);
      TORCH_CHECK(false, "Stream.close: the resident kernel did not end within ", timeout_s_, " s",
                  why.empty() ? "" : " (" + why + ")", "; its ", ctas,
                  " SMs and its memory stay held until the process exits");
    }
    kernel_.reset();
    // A kernel that ended writes there no more; whoever answers without one (a test's thread) and did not
    // answer the STOP may still.
    release(had_kernel || !answering || why.empty());
  }

  // Drops the views of the buffers; gives their piece back to the pool unless its memory stays held.
  void release(bool give_back) {
    mailbox_view_ = x_words_view_ = y_view_ = h_view_ = c_view_ = mask_view_ = at::Tensor();
    buffers_ = StreamBuffers{};
    if (give_back) host_pool(pinned_).give(piece_);
    piece_ = HostPool::Piece{};
  }

  const StreamShape shape_;
  const double timeout_s_;
  std::mutex mutex_;
  State state_ = State::kOpen;
  std::string broken_;                       // why the stream broke
  int64_t device_index_ = -1;                // the kernel's CUDA device, -1 before launch
  StreamBuffers buffers_{};
  at::Tensor mailbox_view_, x_words_view_, y_view_, h_view_, c_view_, mask_view_;
  int answering_ctas_ = 1;                   // answer words a command waits for: the kernel's CTAs
  size_t x_bytes_ = 0, y_bytes_ = 0;
  HostPool::Piece piece_;                    // the buffers' memory, from host_pool(pinned_)
  bool pinned_ = false;
  std::unique_ptr<ResidentKernel> kernel_;
};

// _C._stream_step(handle, x, out): ResidentStream.step_raw from Python in one
// call with plain integers (the stream's handle, the tensors' _cdata), a
// fraction of a method call's cost; the GIL is released while the kernel
// answers. True once stepped; False when x and out are not what the hot path
// takes (the caller goes the checked way).
PyObject* stream_step(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "_stream_step(handle, x, out) takes 3 integers");
    return nullptr;
  }
  auto* stream = static_cast<ResidentStream*>(PyLong_AsVoidPtr(args[0]));
  const auto* x = static_cast<const c10::TensorImpl*>(PyLong_AsVoidPtr(args[1]));
  auto* out = static_cast<c10::TensorImpl*>(PyLong_AsVoidPtr(args[2]));
  if (PyErr_Occurred() != nullptr) return nullptr;
  std::string error;
  Py_BEGIN_ALLOW_THREADS
  error = stream->step_raw(x, out);
  Py_END_ALLOW_THREADS
  if (error == ResidentStream::kNotPlain) Py_RETURN_FALSE;
  if (!error.empty()) {
    PyErr_SetString(PyExc_RuntimeError, error.c_str());
    return nullptr;
  }
  Py_RETURN_TRUE;
}

PyMethodDef g_stream_functions[] = {
    {"_stream_step", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(stream_step)), METH_FASTCALL,
     "The hot path of torch_prnn.Stream.step (private)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int add_stream_functions(PyObject* module) { return PyModule_AddFunctions(module, g_stream_functions); }

}  // namespace torch_prnn

TORCH_LIBRARY_FRAGMENT(prnn, m) {
  m.class_<torch_prnn::ResidentStream>("ResidentStream")
      .def(torch::init<std::string, std::string, int64_t, int64_t, int64_t, int64_t, at::ScalarType, bool, double>())
      .def("launch", &torch_prnn::ResidentStream::launch)
      .def("step", &torch_prnn::ResidentStream::step)
      .def("step_into", &torch_prnn::ResidentStream::step_into)
      .def("get_state", &torch_prnn::ResidentStream::get_state)
      .def("set_state", &torch_prnn::ResidentStream::set_state)
      .def("reset", &torch_prnn::ResidentStream::reset)
      .def("close", &torch_prnn::ResidentStream::close)
      .def("is_open", &torch_prnn::ResidentStream::is_open)
      .def("is_closed", &torch_prnn::ResidentStream::is_closed)
      .def("ctas", &torch_prnn::ResidentStream::ctas)
      .def("handle", &torch_prnn::ResidentStream::handle)
      .def("buffers", &torch_prnn::ResidentStream::buffers)
      .def("expect_answers", &torch_prnn::ResidentStream::expect_answers);
}
