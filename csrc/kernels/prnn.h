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
 *     PRNN_WORKSPACE_ALIGNMENT bytes (the CPU entry points check only the
 *     element size's alignment).
 *   - Outputs overlap neither the inputs nor each other: no argument may be
 *     computed in place, unless its comment says so.
 *   - Strides are the caller's to get right: any stride >= 0 is taken (0
 *     repeats a row; one smaller than a row makes rows overlap), and every
 *     offset index x stride must fit in int64_t. Pointers a call needs must
 *     not be NULL: the entry points that return a status check them, the
 *     void host helpers of the resident mode do not.
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
  PRNN_TIER_PERSISTENT_REGISTERS = 2, /* one persistent kernel, W_hh in registers. Gated cells:
                                       16 bits up to H = 1024, forward and backward, on a
                                       cooperative grid (sm_80+), W_hh as tensor-core
                                       fragments, the state (or the gate gradients)
                                       exchanged through L2 */
  PRNN_TIER_PERSISTENT_SHARED = 3,  /* one persistent kernel, W_hh in registers + shared memory */
  PRNN_TIER_STEPWISE = 4,           /* one kernel per step, W_hh re-read from L2/HBM */
  PRNN_TIER_PERSISTENT_CLUSTER = 5, /* thread-block clusters (sm_90+, H <= 1152): 16-bit, up
                                       to 8 sequences a cluster, W_hh in registers as
                                       tensor-core fragments; float32, one sequence a cluster,
                                       W_hh in registers and shared memory, FFMA. Gated
                                       cells: 16 bits up to H = 512, a CTA holding all
                                       gate rows of its units (forward) or their columns
                                       of W_hh (backward) */
  PRNN_TIER_PERSISTENT_CLUSTER_GRID = 6, /* several clusters at once (sm_90, H 1153 to 2048, B >= 5):
                                       W_hh over ceil(H / 160) clusters of 8 CTAs (8 to 13), 20
                                       rows a CTA, 4 of each warp's 5 rows in registers and 1 in
                                       shared memory; groups of 8 sequences; the state exchanged
                                       through L2 and multicast into each cluster; FFMA */
  PRNN_TIER_FEW_STEPS = 7           /* a whole layer (prnn_layer_forward_cuda) of a few steps of a
                                       small batch without lengths (Elman: T = 1 with B <= 16, T = 2
                                       with B <= 4; LSTM without proj_size and GRU: T = 1, B <= 16):
                                       one plain launch a step computes its input projection and
                                       recurrence, W_ih and W_hh read from L2/HBM each step; no
                                       workspace */
} prnn_tier_t;

/* Name of a tier, e.g. "persistent_registers". */
const char *prnn_tier_string(prnn_tier_t tier);

/* The problem: everything but the data. */
typedef struct prnn_problem {
  prnn_cell_t cell;
  prnn_activation_t activation; /* Elman only (the gated cells' activations are fixed; there it must
                                   still be a prnn_activation_t, and is not read) */
  prnn_dtype_t dtype;
  int64_t steps;      /* T >= 1 */
  int64_t batch;      /* B >= 1 */
  int64_t hidden;     /* H >= 1 */
  int has_lengths;    /* nonzero: per-sequence lengths are given in the args */
  int64_t proj_size;  /* LSTM only: P >= 1 with a projection W_hr, 0 without (then P = H); any
                         P >= 1 is computed, where nn.LSTM asks for P < H */
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
 * input projection and the recurrence. Elman: xp = W_ih x_t + b_ih + b_hh,
 * then the recurrence above. Gated cells (problem->cell LSTM or GRU, below,
 * without proj_size): G gates a unit, xp = W_ih x_t + b_ih rounded to the
 * element type as the gated passes' caller's GEMM gives it, b_hh inside. */
typedef struct prnn_layer_args {
  const void *x;             /* steps x batch x input */
  int64_t x_stride_t;
  int64_t x_stride_b;
  int64_t input;             /* input >= 1 */
  const void *w_ih;          /* G*hidden x input: W_ih[i][k] at w_ih[i * w_ih_stride + k] */
  int64_t w_ih_stride;
  const void *b_ih;          /* G*hidden, contiguous; b_ih and b_hh both NULL for no bias */
  const void *b_hh;
  const void *h0;            /* batch x hidden, as in prnn_forward_args_t */
  int64_t h0_stride_b;
  const void *c0;            /* LSTM: batch x hidden, the initial cell state; else NULL */
  int64_t c0_stride_b;
  const void *w_hh;          /* G*hidden x hidden */
  int64_t w_hh_stride;
  const int32_t *lengths;
  void *y;
  void *h_n;                 /* batch x hidden, contiguous, or NULL: also written with the state
                                after each sequence's last step (h0 at length 0) */
  void *c_n;                 /* LSTM: batch x hidden, contiguous, or NULL, likewise for c; else NULL.
                                The outputs (y, h_n, c_n) must not overlap any input. */
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

/* A whole layer's forward with its input projection fused: for a few steps
 * of a small batch, a launch a step computing both (PRNN_TIER_FEW_STEPS;
 * the only tier of the gated cells' layers, at T = 1); else, Elman only, in
 * one launch, CTAs the recurrence leaves idle computing xp chunk by
 * chunk of steps while the others step through the chunks done (the cluster
 * tier's FFMA kernel in float32 and its tensor-core kernel in 16 bits,
 * H <= 1152, when the device holds enough clusters beside the batch's for
 * the projection to keep ahead). Elsewhere both return
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


/*
 * Resident mode: one timestep a call, at the cost of one step. One launch
 * keeps a module's layers on chip (every CTA holds the W_ih and W_hh rows of
 * its hidden units, and their biases, in shared memory) and waits for
 * commands from the host in a mailbox. A STEP runs one timestep of every
 * layer from x_t and returns the top layer's h_t; the state (h, and c for an
 * LSTM) stays on the GPU between steps. Layers run in turn inside the one
 * launch; unidirectional only.
 *
 * Every layer computes what the whole-sequence passes compute, with the
 * input projection done in-kernel and rounded to the element type as the
 * projection GEMM's output is:
 *   Elman:  h_t = act(round(W_ih x_t + round(b_ih + b_hh)) + W_hh h_{t-1})
 *   gated:  xp_t = round(W_ih x_t + b_ih), then the gated cell above with b_hh
 * with float32 accumulation, h rounded to the element type each step and an
 * LSTM's c kept in float32. Layer l > 0 takes layer l-1's h_t as its x_t.
 *
 * The mailbox and the step's input and output buffers live in host-mapped
 * (pinned) memory that both sides read and write; the host half of the
 * protocol (prnn_resident_post*, prnn_resident_wait) makes no CUDA call.
 *   1. the host writes what the command reads, then posts it: `request`,
 *      the command's sequence number and kind in one release store. A STEP's
 *      x_t goes into the tagged input words: each carries 4 bytes of x_t and
 *      the STEP's sequence number, so that a word read shows by itself
 *      whether it is current and the kernel may read x_t in the same bus
 *      round trip as the request, before it has seen the request;
 *   2. the kernel sees the new request, runs the command on every CTA; each
 *      CTA writes its part of what the command returns (y, or the state)
 *      and then sets its own answer word to the sequence number (release);
 *   3. the host waits until every CTA's answer word holds that number (with
 *      a timeout: the kernel only ends on a STOP), then reads the result.
 * One command is in flight at a time. Sequence numbers are compared for
 * equality only, so they may wrap.
 *
 * The launch needs all its CTAs resident at once (a cooperative launch, one
 * CTA per SM at most) for as long as it runs: a caller that opens several must
 * keep the sum of their grids within the device's SMs, or a later launch waits
 * for SMs that never free. While it runs, device-wide synchronisation
 * (cudaDeviceSynchronize, cudaFree, which waits for the device) does not
 * return until a STOP ends it.
 */

#define PRNN_RESIDENT_MAX_LAYERS 8

typedef enum prnn_resident_command {
  PRNN_RESIDENT_STEP = 1,       /* one timestep of every layer: reads x, writes y */
  PRNN_RESIDENT_SET_STATE = 2,  /* every layer's state from the state buffers h (and c) */
  PRNN_RESIDENT_GET_STATE = 3,  /* every layer's state into the state buffers h (and c) */
  PRNN_RESIDENT_RESET = 4,      /* zero the state of the sequences b with mask[b] != 0 */
  PRNN_RESIDENT_STOP = 5        /* answer, then end the kernel */
} prnn_resident_command_t;

/* Alignment of the mailbox (its parts are 128-byte lines). */
#define PRNN_RESIDENT_MAILBOX_ALIGNMENT 128
/* The most CTAs a resident launch has: one answer word each. */
#define PRNN_RESIDENT_MAX_CTAS 256

/* The mailbox: host-mapped memory, PRNN_RESIDENT_MAILBOX_ALIGNMENT-aligned,
 * zeroed by prnn_resident_mailbox_init before the launch. */
typedef struct prnn_resident_mailbox {
  /* written by the host */
  uint64_t request;          /* the latest command: its sequence number (low 32 bits; 0 before the
                                first, and again once the numbers wrap) and
                                its prnn_resident_command_t (high 32 bits), one store */
  uint32_t posted;           /* host-only: the last sequence number posted */
  uint32_t x_tag;            /* host-only: the sequence number the input words carry (the last STEP's) */
  uint32_t host_pad[28];
  /* written by the kernel */
  uint32_t ready;            /* nonzero once the weights are on chip and the kernel waits for commands */
  uint32_t kernel_pad[31];
  uint32_t answer[PRNN_RESIDENT_MAX_CTAS]; /* answer[c]: sequence number of the last command CTA c finished */
} prnn_resident_mailbox_t;

/* The problem of a resident launch. */
typedef struct prnn_resident_problem {
  prnn_cell_t cell;
  prnn_activation_t activation; /* Elman only */
  prnn_dtype_t dtype;           /* float32, bfloat16 or float16 */
  int64_t layers;               /* 1 .. PRNN_RESIDENT_MAX_LAYERS */
  int64_t batch;                /* B >= 1 */
  int64_t input;                /* I >= 1: width of x */
  int64_t hidden;               /* H >= 1 */
  int64_t max_ctas;             /* >= 1: the most CTAs (SMs) the launch may hold; plans take at most
                                   PRNN_RESIDENT_MAX_CTAS */
} prnn_resident_problem_t;

/* One layer's weights (G gates a unit: 1 Elman, 4 LSTM, 3 GRU; in_l = input for
 * layer 0, hidden above). Device memory of the current device, read by the
 * kernel before it reports ready; the caller may change or free them after. */
typedef struct prnn_resident_layer {
  const void *w_ih;          /* G*hidden x in_l: W_ih[i][k] at w_ih[i * w_ih_stride + k] */
  int64_t w_ih_stride;
  const void *w_hh;          /* G*hidden x hidden: W_hh[i][j] at w_hh[i * w_hh_stride + j] */
  int64_t w_hh_stride;
  const void *b_ih;          /* G*hidden, contiguous; b_ih and b_hh both NULL for no bias */
  const void *b_hh;
} prnn_resident_layer_t;

/* The launch's tensors. The mailbox and the buffers are host-mapped memory,
 * passed as the device's addresses of it (cudaHostGetDevicePointer, or the
 * host address under unified addressing). */
typedef struct prnn_resident_args {
  prnn_resident_layer_t layer[PRNN_RESIDENT_MAX_LAYERS]; /* the first problem->layers */
  prnn_resident_mailbox_t *mailbox;
  const uint64_t *x_words;   /* prnn_resident_x_words(batch x input x element size) tagged words,
                                16-byte aligned: a STEP's x_t (prnn_resident_post_step) */
  void *y;                   /* batch x hidden, contiguous: a STEP's y_t (the top layer's h_t) */
  float *h;                  /* layers x batch x hidden, contiguous, float32: SET_STATE / GET_STATE's h */
  float *c;                  /* LSTM: layers x batch x hidden, float32, likewise for c; else NULL */
  const uint8_t *mask;       /* batch: RESET's rows */
} prnn_resident_args_t;

/* What the resident plan says. */
typedef struct prnn_resident_plan {
  int grid;                  /* CTAs, one per SM at most: the SMs the launch holds */
  int block;                 /* threads per CTA */
  int units_per_cta;         /* hidden units each CTA owns, in every layer */
  int smem_bytes;            /* dynamic shared memory per CTA */
  size_t workspace_bytes;    /* device workspace the launch needs */
} prnn_resident_plan_t;

/* Checks a resident problem and plans it on `device`: as many CTAs as hold
 * about 64 KiB of weights each (fewer rows a CTA make a shorter step, fewer
 * CTAs a cheaper barrier), at least as many as the weights need to fit in
 * shared memory and at most max_ctas and the device's SMs.
 * PRNN_STATUS_NOT_SUPPORTED (prnn_last_error() says why) when the weights do
 * not fit in that many CTAs, or for float64. */
prnn_status_t prnn_resident_plan_cuda(const prnn_resident_problem_t *problem, int device,
                                      prnn_resident_plan_t *plan);

/* Zeroes the workspace and launches the resident kernel on `stream`
 * (asynchronous; use a stream of its own, created non-blocking, so that work
 * on the legacy default stream does not wait for it). The kernel sets
 * mailbox->ready once it holds the weights, then runs commands until a STOP.
 * The mailbox must have been initialised by prnn_resident_mailbox_init.
 * First it loads the kernels of the tiers the layer planners choose beside a
 * resident kernel (prnn_resident_hold_sms): under CUDA's lazy loading a
 * kernel's first launch would otherwise wait for the device to idle. */
prnn_status_t prnn_resident_launch_cuda(const prnn_resident_problem_t *problem,
                                        const prnn_resident_args_t *args, void *workspace,
                                        size_t workspace_bytes, prnn_stream_t stream);

/* The host half of the protocol: plain memory accesses, no CUDA call, in
 * every build. A mailbox has one host thread posting at a time. */
void prnn_resident_mailbox_init(prnn_resident_mailbox_t *mailbox);
/* Tagged input words for x_bytes of x_t: one for every 4 bytes, an even
 * number (the kernel reads them in pairs). */
size_t prnn_resident_x_words(size_t x_bytes);
/* Writes x_t (x_bytes, zero-padded to the words) into the tagged words
 * x_words (prnn_resident_x_words(x_bytes) of them), each with the STEP's
 * sequence number, and posts the STEP; returns its sequence number. */
uint32_t prnn_resident_post_step(prnn_resident_mailbox_t *mailbox, uint64_t *x_words, const void *x,
                                 size_t x_bytes);
/* Posts a command other than a STEP (after the host has written what it
 * reads); returns its sequence number. */
uint32_t prnn_resident_post(prnn_resident_mailbox_t *mailbox, prnn_resident_command_t command);
/* Waits up to timeout_ns (>= 0; 0 looks once; INT64_MAX in effect forever)
 * until the answer words of CTAs [0, ctas) all hold `seq` (ctas >= 1: the
 * plan's grid); nonzero when they do. */
int prnn_resident_wait(const prnn_resident_mailbox_t *mailbox, uint32_t seq, int ctas, int64_t timeout_ns);
/* Nonzero once the kernel reported ready. */
int prnn_resident_is_ready(const prnn_resident_mailbox_t *mailbox);

/* Devices the counts below cover: [0, PRNN_MAX_DEVICES). */
#define PRNN_MAX_DEVICES 64

/* The SMs of `device` that this process's resident kernels hold, as their
 * caller counts them: delta = plan.grid before the launch, -plan.grid once
 * the kernel has ended (or did not launch). While any are held, the layer
 * planners (prnn_plan_cuda, prnn_plan_layer_cuda, the gated cells') choose
 * only tiers of plain launches (few-steps, stepwise): a persistent launch
 * needs all its CTAs resident at once, and beside a resident kernel it could
 * wait for SMs that never free. Each plan and each launch reads the count
 * afresh: a caller that opens resident kernels beside threads planning and
 * launching layers orders the two itself (the torch ops hold a lock from a
 * layer's plan to its launch, and a stream holds it alone from its count
 * to its launch). PRNN_STATUS_BAD_PARAM for a device out of range or a
 * count that would go negative (the count then unchanged). */
prnn_status_t prnn_resident_hold_sms(int device, int64_t delta);
/* That count (0 for a device out of range). */
int64_t prnn_resident_held_sms(int device);

#ifdef __cplusplus
}
#endif

#endif /* PRNN_H */
