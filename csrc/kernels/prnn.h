/*
 * prnn.h - the public C API of torch_prnn's kernels.
 *
 * Torch-free and C-callable (C99 or C++). It computes one layer of the Elman
 * recurrence
 *
 *     h_t = act(xp_t + W_hh h_{t-1}),   t = 0 .. T-1,   h_{-1} = h0
 *
 * where xp_t = W_ih x_t + b_ih + b_hh is precomputed by the caller (one GEMM
 * over all steps), and its backward-data pass
 *
 *     delta_t = act'(h_t) * (grad_y_t + W_hh^T delta_{t+1}),   delta_T = 0.
 *
 * The weight and h0 gradients are GEMMs over the returned delta and are left
 * to the caller:  grad_W_hh = sum_t delta_t^T h_{t-1},  grad_h0 = delta_0 W_hh.
 *
 * Per-sequence lengths: past its length a sequence's state is frozen and its
 * outputs are zero (what nn.RNN gives for a PackedSequence); in the backward
 * pass delta is zero there.
 *
 * Conventions
 *   - Shapes are written [steps x batch x hidden] etc.; strides are in
 *     elements; the hidden (last) dimension of every tensor is unit-stride.
 *   - Every tensor argument has the problem's dtype; arithmetic accumulates in
 *     float32 (float64 for float64).
 *   - Nothing allocates: the caller passes a workspace of at least the size
 *     the plan query reports (its contents on entry do not matter), aligned to
 *     PRNN_WORKSPACE_ALIGNMENT bytes.
 *   - CPU entry points take host pointers; CUDA entry points take device
 *     pointers of the current device and run asynchronously on `stream`.
 */
#ifndef PRNN_H
#define PRNN_H

#include <stddef.h>
#include <stdint.h>

/* Workspace alignment the entry points require (the CUDA grid tier reads it
 * 16 bytes at a time). */
#define PRNN_WORKSPACE_ALIGNMENT 16

#ifdef __cplusplus
extern "C" {
#endif

/* Same type as cudaStream_t, without pulling in the CUDA headers. */
struct CUstream_st;
typedef struct CUstream_st *prnn_stream_t;

typedef enum prnn_status {
  PRNN_STATUS_SUCCESS = 0,
  PRNN_STATUS_BAD_PARAM = 1,            /* a size, stride, pointer or enum is invalid */
  PRNN_STATUS_NOT_SUPPORTED = 2,        /* valid, but no tier of this build runs it */
  PRNN_STATUS_WORKSPACE_TOO_SMALL = 3,  /* workspace_bytes below the plan's size */
  PRNN_STATUS_CUDA_ERROR = 4,           /* a CUDA runtime call failed */
  PRNN_STATUS_NOT_COMPILED = 5          /* this build has no CUDA support */
} prnn_status_t;

/* A static, human-readable name of a status. */
const char *prnn_status_string(prnn_status_t status);

/* Detail of the last failure in this thread (which check failed, which CUDA
 * call and its error string); "" when none. Valid until the next API call. */
const char *prnn_last_error(void);

typedef enum prnn_cell {
  PRNN_CELL_ELMAN = 0,                  /* h_t = act(xp_t + W_hh h_{t-1}) */
  PRNN_CELL_LSTM = 1,                   /* torch.nn.LSTM's cell: gated passes below */
  PRNN_CELL_GRU = 2                     /* torch.nn.GRU's cell: gated passes below */
} prnn_cell_t;

typedef enum prnn_activation {
  PRNN_ACT_TANH = 0,
  PRNN_ACT_RELU = 1
} prnn_activation_t;

typedef enum prnn_dtype {
  PRNN_DTYPE_FLOAT32 = 0,
  PRNN_DTYPE_FLOAT64 = 1,
  PRNN_DTYPE_FLOAT16 = 2,
  PRNN_DTYPE_BFLOAT16 = 3
} prnn_dtype_t;

typedef enum prnn_pass {
  PRNN_PASS_FORWARD = 0,
  PRNN_PASS_BACKWARD_DATA = 1
} prnn_pass_t;

/* How a problem runs. */
typedef enum prnn_tier {
  PRNN_TIER_NONE = 0,               /* not supported */
  PRNN_TIER_CPU_REFERENCE = 1,      /* the C99 reference loop */
  PRNN_TIER_PERSISTENT_REGISTERS = 2, /* one persistent kernel, W_hh in registers */
  PRNN_TIER_PERSISTENT_SHARED = 3,  /* one persistent kernel, W_hh in registers + shared memory */
  PRNN_TIER_STEPWISE = 4,           /* one kernel per step, W_hh re-read from L2/HBM */
  PRNN_TIER_PERSISTENT_CLUSTER = 5, /* thread-block clusters (sm_90+, H <= 1152): 16-bit, up
                                       to 8 sequences a cluster, W_hh in registers as
                                       tensor-core fragments; float32, one sequence a cluster,
                                       W_hh in registers and shared memory, FFMA */
  PRNN_TIER_PERSISTENT_CLUSTER_GRID = 6 /* several clusters at once (sm_90, H 1153 to 2048, B >= 5):
                                       W_hh over ceil(H / 160) clusters of 8 CTAs (8 to 13), 20
                                       rows a CTA, 4 of each warp's 5 rows in registers and 1 in
                                       shared memory; groups of 8 sequences; the state exchanged
                                       through L2 and multicast into each cluster; FFMA */
} prnn_tier_t;

/* Name of a tier, e.g. "persistent_registers". */
const char *prnn_tier_string(prnn_tier_t tier);

/* The problem: everything but the data. */
typedef struct prnn_problem {
  prnn_cell_t cell;
  prnn_activation_t activation; /* Elman only (the gated cells' activations are fixed) */
  prnn_dtype_t dtype;
  int64_t steps;      /* T >= 1 */
  int64_t batch;      /* B >= 1 */
  int64_t hidden;     /* H >= 1 */
  int has_lengths;    /* nonzero: per-sequence lengths are given in the args */
  int64_t proj_size;  /* LSTM only: P >= 1 with a projection W_hr, 0 without (then P = H) */
} prnn_problem_t;

/* Tensors of the forward pass. */
typedef struct prnn_forward_args {
  const void *xp;            /* steps x batch x hidden: W_ih x_t + b_ih + b_hh */
  int64_t xp_stride_t;       /*   element stride between steps */
  int64_t xp_stride_b;       /*   element stride between sequences */
  const void *h0;            /* batch x hidden: initial state */
  int64_t h0_stride_b;
  const void *w_hh;          /* hidden x hidden: W_hh[i][j] at w_hh[i * w_hh_stride + j] */
  int64_t w_hh_stride;
  const int32_t *lengths;    /* batch: each in [0, steps]; NULL when !has_lengths.
                                Host memory for CPU calls, device memory for CUDA
                                calls (out-of-range values are clamped there). */
  void *y;                   /* steps x batch x hidden, contiguous, written in full:
                                h_t, or zero at and past a sequence's length */
} prnn_forward_args_t;

/* Tensors of the backward-data pass. */
typedef struct prnn_backward_args {
  const void *grad_y;        /* steps x batch x hidden: dLoss/dy (may be stride 0) */
  int64_t grad_y_stride_t;
  int64_t grad_y_stride_b;
  const void *y;             /* steps x batch x hidden, contiguous: the forward's y */
  const void *w_hh;          /* hidden x hidden, as in the forward (not transposed) */
  int64_t w_hh_stride;
  const int32_t *lengths;    /* batch, as in the forward */
  void *grad_xp;             /* steps x batch x hidden, contiguous, written in full:
                                delta_t (zero at and past a sequence's length) */
} prnn_backward_args_t;

/* Tensors of a whole layer's forward pass (prnn_layer_forward_cuda): the
 * input projection xp = W_ih x_t + b_ih + b_hh and the recurrence. */
typedef struct prnn_layer_args {
  const void *x;             /* steps x batch x input */
  int64_t x_stride_t;
  int64_t x_stride_b;
  int64_t input;             /* input >= 1 */
  const void *w_ih;          /* hidden x input: W_ih[i][k] at w_ih[i * w_ih_stride + k] */
  int64_t w_ih_stride;
  const void *b_ih;          /* hidden, contiguous; b_ih and b_hh both NULL for no bias */
  const void *b_hh;
  const void *h0;            /* batch x hidden, as in prnn_forward_args_t */
  int64_t h0_stride_b;
  const void *w_hh;
  int64_t w_hh_stride;
  const int32_t *lengths;
  void *y;
} prnn_layer_args_t;

/* What the plan query says about a problem. */
typedef struct prnn_plan {
  prnn_tier_t tier;
  size_t workspace_bytes;   /* the least workspace the entry point accepts */
  int grid;                 /* CTAs of the persistent kernel (1 on the CPU) */
  int block;                /* threads per CTA (1 on the CPU) */
  int rows_per_cta;         /* rows of W_hh (W_hh^T for backward) each CTA owns */
  int smem_bytes;           /* dynamic shared memory per CTA */
} prnn_plan_t;

/* Checks a problem and says how (and whether) it runs.
 * PRNN_STATUS_BAD_PARAM for an invalid problem, PRNN_STATUS_NOT_SUPPORTED
 * (with plan->tier = NONE and prnn_last_error() naming the limit) when valid
 * but too large. */
prnn_status_t prnn_plan_cpu(const prnn_problem_t *problem, prnn_pass_t pass,
                            prnn_plan_t *plan);
prnn_status_t prnn_plan_cuda(const prnn_problem_t *problem, prnn_pass_t pass,
                             int device, prnn_plan_t *plan);

/* CPU reference, float32 and float64 (float32 accumulation for float32). */
prnn_status_t prnn_forward_cpu(const prnn_problem_t *problem,
                               const prnn_forward_args_t *args,
                               void *workspace, size_t workspace_bytes);
prnn_status_t prnn_backward_data_cpu(const prnn_problem_t *problem,
                                     const prnn_backward_args_t *args,
                                     void *workspace, size_t workspace_bytes);

/* CUDA, every dtype, on the current device, asynchronous on `stream`.
 * Builds without CUDA return PRNN_STATUS_NOT_COMPILED. */
prnn_status_t prnn_forward_cuda(const prnn_problem_t *problem,
                                const prnn_forward_args_t *args,
                                void *workspace, size_t workspace_bytes,
                                prnn_stream_t stream);
prnn_status_t prnn_backward_data_cuda(const prnn_problem_t *problem,
                                      const prnn_backward_args_t *args,
                                      void *workspace, size_t workspace_bytes,
                                      prnn_stream_t stream);

/* A whole layer's forward in one CUDA launch, where a kernel can fuse the
 * input projection: CTAs the recurrence leaves idle compute xp chunk by chunk
 * of steps while the others step through the chunks done (the cluster tier's
 * FFMA kernel in float32 and its tensor-core kernel in 16 bits, H <= 1152,
 * when the device holds enough clusters beside the batch's for the
 * projection to keep ahead). Elsewhere both return
 * PRNN_STATUS_NOT_SUPPORTED (the plan's tier NONE): the caller then computes
 * xp itself (one GEMM) and calls prnn_forward_cuda. */
prnn_status_t prnn_plan_layer_cuda(const prnn_problem_t *problem, int64_t input, int device,
                                   prnn_plan_t *plan);
prnn_status_t prnn_layer_forward_cuda(const prnn_problem_t *problem,
                                      const prnn_layer_args_t *args,
                                      void *workspace, size_t workspace_bytes,
                                      prnn_stream_t stream);


/*
 * Gated cells (PRNN_CELL_LSTM, PRNN_CELL_GRU): torch.nn.LSTM's and
 * torch.nn.GRU's cells, gates in PyTorch's order. G gates per hidden unit
 * (LSTM 4: i, f, g, o; GRU 3: r, z, n); the state h has width S (S = P with
 * an LSTM projection, else S = H). The caller precomputes the input side
 * xp_t = W_ih x_t + b_ih (one GEMM); b_hh is added inside, since a GRU's
 * b_hn sits inside r * (W_hn h + b_hn).
 *
 *   LSTM:  a = xp_t + W_hh h_{t-1} + b_hh,  i,f,o = sigmoid(a_i,f,o), g = tanh(a_g)
 *          c_t = f c_{t-1} + i g,  m_t = o tanh(c_t),  h_t = m_t (or W_hr m_t with P)
 *   GRU:   hh = W_hh h_{t-1} + b_hh,  r = sigmoid(xp_r + hh_r),  z = sigmoid(xp_z + hh_z)
 *          n = tanh(xp_n + r hh_n),  h_t = (1 - z) n + z h_{t-1}
 *
 * Past a sequence's length its state (h and c) is frozen, its outputs y and
 * its gradients are zero; dLoss/dh_n and dLoss/dc_n enter at its last valid
 * step (at length 0 they are grad_h0 and grad_c0). The backward pass returns
 * the gradients of the gate pre-activations on both sides, from which the
 * caller's GEMMs give the weight and bias gradients:
 *   grad_W_ih = sum_t grad_xp_t^T x_t,      grad_b_ih = sum grad_xp
 *   grad_W_hh = sum_t grad_hh_t^T h_{t-1},  grad_b_hh = sum grad_hh
 *   grad_W_hr = sum_t grad_h_t^T m_t        (m_t = o tanh(c_t), from saved)
 * and writes grad_h0 (and grad_c0) itself.
 */

/* Gates per hidden unit, and values per hidden unit the forward saves for the
 * backward pass. LSTM saves i, f, g, o (after their activations) and c_t;
 * GRU saves r, z, n and W_hn h_{t-1} + b_hn. */
#define PRNN_LSTM_GATES 4
#define PRNN_LSTM_SAVED 5
#define PRNN_GRU_GATES 3
#define PRNN_GRU_SAVED 4

typedef struct prnn_gated_forward_args {
  const void *xp;            /* steps x batch x G*hidden: W_ih x_t + b_ih, gate blocks of hidden */
  int64_t xp_stride_t;
  int64_t xp_stride_b;
  const void *b_hh;          /* G*hidden, contiguous, or NULL (no bias) */
  const void *h0;            /* batch x S: initial state */
  int64_t h0_stride_b;
  const void *c0;            /* LSTM: batch x hidden, initial cell state; GRU: NULL */
  int64_t c0_stride_b;
  const void *w_hh;          /* G*hidden x S: W_hh[i][j] at w_hh[i * w_hh_stride + j] */
  int64_t w_hh_stride;
  const void *w_hr;          /* LSTM with proj_size: S x hidden; else NULL */
  int64_t w_hr_stride;
  const int32_t *lengths;    /* batch, as in prnn_forward_args_t */
  void *y;                   /* steps x batch x S, contiguous: h_t, zero at and past a length */
  void *h_n;                 /* batch x S, contiguous: the state after each sequence's last step */
  void *c_n;                 /* LSTM: batch x hidden, contiguous, likewise for c; GRU: NULL */
  void *saved;               /* steps x batch x SAVED*hidden, contiguous: SAVED blocks of width
                                hidden in the order listed at PRNN_*_SAVED (value k of unit j
                                at [k * hidden + j]), or NULL when no backward follows; zero
                                at and past a length */
} prnn_gated_forward_args_t;

typedef struct prnn_gated_backward_args {
  const void *grad_y;        /* steps x batch x S: dLoss/dy (may be stride 0) */
  int64_t grad_y_stride_t;
  int64_t grad_y_stride_b;
  const void *grad_h_n;      /* batch x S, or NULL (zero): dLoss/dh_n */
  int64_t grad_h_n_stride_b;
  const void *grad_c_n;      /* LSTM: batch x hidden, or NULL (zero): dLoss/dc_n; GRU: NULL */
  int64_t grad_c_n_stride_b;
  const void *h0;            /* batch x S, as in the forward */
  int64_t h0_stride_b;
  const void *c0;            /* LSTM: batch x hidden, as in the forward; GRU: NULL */
  int64_t c0_stride_b;
  const void *y;             /* steps x batch x S, contiguous: the forward's y */
  const void *saved;         /* steps x batch x SAVED*hidden, contiguous: the forward's saved */
  const void *w_hh;          /* G*hidden x S, as in the forward */
  int64_t w_hh_stride;
  const void *w_hr;          /* S x hidden or NULL, as in the forward */
  int64_t w_hr_stride;
  const int32_t *lengths;    /* batch, as in the forward */
  void *grad_xp;             /* steps x batch x G*hidden, contiguous: dLoss/dxp_t */
  void *grad_hh;             /* GRU: steps x batch x G*hidden, contiguous: dLoss/d(W_hh h_{t-1} + b_hh),
                                which differs from grad_xp in the n block; LSTM: NULL (it is grad_xp) */
  void *grad_h;              /* LSTM with proj_size: steps x batch x S, contiguous: dLoss/dh_t
                                (for grad_W_hr); else NULL */
  void *grad_h0;             /* batch x S, contiguous */
  void *grad_c0;             /* LSTM: batch x hidden, contiguous; GRU: NULL */
} prnn_gated_backward_args_t;

/* The gated passes, on the CPU (float32, float64) and on CUDA (every dtype,
 * asynchronous on `stream`). Plans come from prnn_plan_cpu / prnn_plan_cuda
 * with problem->cell set. */
prnn_status_t prnn_gated_forward_cpu(const prnn_problem_t *problem,
                                     const prnn_gated_forward_args_t *args,
                                     void *workspace, size_t workspace_bytes);
prnn_status_t prnn_gated_backward_data_cpu(const prnn_problem_t *problem,
                                           const prnn_gated_backward_args_t *args,
                                           void *workspace, size_t workspace_bytes);
prnn_status_t prnn_gated_forward_cuda(const prnn_problem_t *problem,
                                      const prnn_gated_forward_args_t *args,
                                      void *workspace, size_t workspace_bytes,
                                      prnn_stream_t stream);
prnn_status_t prnn_gated_backward_data_cuda(const prnn_problem_t *problem,
                                            const prnn_gated_backward_args_t *args,
                                            void *workspace, size_t workspace_bytes,
                                            prnn_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* PRNN_H */
