/* The C interface's MPI functions from C99 under mpiexec: a block in the
 * sequence-parallel mode (kfa_block_create_sequence_parallel on
 * MPI_COMM_WORLD's Fortran handle) on each rank's run of tokens against a
 * single-rank block on the whole sequence (this rank's rows of y and dx,
 * and every gradient summed over the ranks with
 * kfa_block_allreduce_gradients); the mean of data-parallel gradients,
 * bitwise equal on every rank when deterministic; the argument errors with
 * nothing written. fp64 blocks in the host space. */
#include <kfa/c_api.h>

#include <mpi.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, S = 13, D = 16 };

static int rank = 0, ranks = 1, failures = 0;

static void check(int ok, const char* what) {
  if (!ok) {
    ++failures;
    printf("rank %d FAILED %s\n", rank, what);
  }
}

static void expect_success(kfa_status got, const char* what) {
  if (got != KFA_SUCCESS) {
    ++failures;
    printf("rank %d FAILED %s: status %d: %s\n", rank, what, (int)got, kfa_last_error());
  }
}

/* status `want` and a message containing `needle`. */
static void expect_error(kfa_status got, kfa_status want, const char* needle, const char* what) {
  const char* message = kfa_last_error();
  if (got != want || strstr(message, needle) == NULL) {
    ++failures;
    printf("rank %d FAILED %s: status %d (want %d), message \"%s\" (want \"%s\")\n", rank, what,
           (int)got, (int)want, message, needle);
  } else if (rank == 0) {
    printf("ok  %-40s %s\n", what, message);
  }
}

/* Fixed-seed values in [-1, 1): the same on every rank. */
static unsigned long long rng_state = 0x2545f4914f6cdd1dULL;
static double uniform(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(rng_state >> 11) / 4503599627370496.0 - 1.0;
}

/* max |got - ref| <= tol · max(1, max |ref|). */
static void expect_close(const double* got, const double* ref, size_t n, double tol,
                         const char* what) {
  double err = 0, scale = 1;
  for (size_t i = 0; i < n; ++i) {
    const double e = fabs(got[i] - ref[i]);
    err = e > err || e != e ? e : err;
    scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
  }
  if (!(err <= tol * scale)) {
    ++failures;
    printf("rank %d FAILED %s: error %g, bound %g\n", rank, what, err, tol * scale);
  }
}

/* Rows [offset, offset + len) of every sequence of a [B][S][D] tensor. */
static void slice_rows(const double* t, double* out, int offset, int len) {
  for (int b = 0; b < B; ++b)
    memcpy(out + (size_t)b * len * D, t + ((size_t)b * S + offset) * D,
           sizeof(double) * (size_t)len * D);
}

/* A Llama-style block: RMSNorm, SwiGLU, grouped-query heads, rotary, causal. */
static void block_options(kfa_block_options* o) {
  kfa_block_options_default(o);
  o->d_model = D;
  o->heads = 4;
  o->kv_heads = 2;
  o->d_ff = 24;
  o->norm = KFA_RMS_NORM;
  o->activation = KFA_SWIGLU;
  o->rotary = 1;
  o->attention.causal = 1;
  o->init_seed = 7;
}

/* Copies of every gradient of `block`, in parameter order. */
static double* gradients(kfa_block* block, int* count, size_t* total) {
  int32_t n = 0;
  expect_success(kfa_block_parameter_count(block, &n), "parameter count");
  *count = n;
  *total = 0;
  for (int i = 0; i < n; ++i) {
    const char* name = NULL;
    int64_t size = 0;
    kfa_block_parameter_name(block, i, &name);
    kfa_block_parameter(block, name, NULL, NULL, &size);
    *total += (size_t)size;
  }
  double* all = (double*)malloc(sizeof(double) * (*total + 1));
  size_t at = 0;
  for (int i = 0; i < n; ++i) {
    const char* name = NULL;
    void* grad = NULL;
    int64_t size = 0;
    kfa_block_parameter_name(block, i, &name);
    expect_success(kfa_block_parameter(block, name, NULL, &grad, &size), name);
    memcpy(all + at, grad, sizeof(double) * (size_t)size);
    at += (size_t)size;
  }
  return all;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  expect_success(kfa_initialize(), "kfa_initialize");
  const int32_t world = (int32_t)MPI_Comm_c2f(MPI_COMM_WORLD);
  const kfa_space host = KFA_SPACE_HOST;

  const size_t n = (size_t)B * S * D;
  double *x = malloc(sizeof(double) * n), *dy = malloc(sizeof(double) * n);
  double *y = malloc(sizeof(double) * n), *dx = malloc(sizeof(double) * n);
  for (size_t i = 0; i < n; ++i) x[i] = uniform();
  for (size_t i = 0; i < n; ++i) dy[i] = uniform();

  kfa_block_options o;
  block_options(&o);

  /* The whole sequence on one rank (every rank computes it). */
  kfa_block* single = NULL;
  expect_success(kfa_block_create(&o, KFA_F64, host, &single), "create single");
  expect_success(kfa_block_forward(single, NULL, KFA_F64, x, y, B, S, D, 3, 1), "single fwd");
  expect_success(kfa_block_backward(single, NULL, KFA_F64, dy, dx, B, S, D), "single bwd");
  expect_success(kfa_fence(host, NULL), "fence");
  int count = 0;
  size_t total = 0;
  double* g_single = gradients(single, &count, &total);

  /* This rank's contiguous run of every sequence, the runs in rank order. */
  int len = S / ranks + (rank < S % ranks ? 1 : 0), offset = 0;
  for (int r = 0; r < rank; ++r) offset += S / ranks + (r < S % ranks ? 1 : 0);
  const size_t nl = (size_t)B * len * D;
  double *xl = malloc(sizeof(double) * nl + 8), *dyl = malloc(sizeof(double) * nl + 8);
  double *yl = malloc(sizeof(double) * nl + 8), *dxl = malloc(sizeof(double) * nl + 8);
  double *y_ref = malloc(sizeof(double) * nl + 8), *dx_ref = malloc(sizeof(double) * nl + 8);
  slice_rows(x, xl, offset, len);
  slice_rows(dy, dyl, offset, len);
  slice_rows(y, y_ref, offset, len);
  slice_rows(dx, dx_ref, offset, len);
  for (size_t i = 0; i < nl; ++i) yl[i] = dxl[i] = NAN;

  kfa_block* parallel = NULL;
  expect_success(kfa_block_create_sequence_parallel(&o, KFA_F64, host, world, &parallel),
                 "create sequence parallel");
  check(parallel != NULL, "sequence-parallel block created");
  if (parallel != NULL) {
    expect_success(kfa_block_forward(parallel, NULL, KFA_F64, xl, yl, B, len, D, 3, 1), "fwd");
    expect_success(kfa_block_backward(parallel, NULL, KFA_F64, dyl, dxl, B, len, D), "bwd");
    expect_success(kfa_block_allreduce_gradients(parallel, NULL, world, KFA_GRADIENT_SUM, 0),
                   "allreduce sum");
    expect_success(kfa_fence(host, NULL), "fence");
    /* fp64 results that differ in the order of the attention's and the
     * gradients' sums only. */
    expect_close(yl, y_ref, nl, 1e-13, "sequence-parallel y");
    expect_close(dxl, dx_ref, nl, 1e-13, "sequence-parallel dx");
    int parallel_count = 0;
    size_t parallel_total = 0;
    double* g_parallel = gradients(parallel, &parallel_count, &parallel_total);
    check(parallel_count == count && parallel_total == total, "same parameters");
    if (parallel_total == total) {
      expect_close(g_parallel, g_single, total, 1e-12, "sequence-parallel gradients summed");
    }
    free(g_parallel);
  }

  /* Data parallelism: rank r's gradients are (r + 1) times the single
   * block's (dy scaled); their mean is (ranks + 1)/2 times them. */
  double* dy_scaled = malloc(sizeof(double) * n);
  for (size_t i = 0; i < n; ++i) dy_scaled[i] = dy[i] * (rank + 1);
  expect_success(kfa_block_zero_grad(single, NULL), "zero_grad");
  expect_success(kfa_block_forward(single, NULL, KFA_F64, x, y, B, S, D, 3, 1), "fwd");
  expect_success(kfa_block_backward(single, NULL, KFA_F64, dy_scaled, dx, B, S, D), "bwd");
  expect_success(kfa_block_allreduce_gradients(single, NULL, world, KFA_GRADIENT_MEAN, 1),
                 "allreduce mean");
  expect_success(kfa_fence(host, NULL), "fence");
  double* g_mean = gradients(single, &count, &total);
  double* g_expected = malloc(sizeof(double) * (total + 1));
  for (size_t i = 0; i < total; ++i) g_expected[i] = g_single[i] * (ranks + 1) / 2.0;
  expect_close(g_mean, g_expected, total, 1e-13, "data-parallel mean");
  /* Deterministic: bitwise the same on every rank. */
  double* g_rank0 = malloc(sizeof(double) * (total + 1));
  memcpy(g_rank0, g_mean, sizeof(double) * total);
  MPI_Bcast(g_rank0, (int)total, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  check(memcmp(g_rank0, g_mean, sizeof(double) * total) == 0,
        "deterministic mean bitwise equal on every rank");

  /* Errors: nothing created, nothing written. */
  kfa_block* bad = NULL;
  expect_error(kfa_block_create_sequence_parallel(&o, KFA_F64, host,
                                                  (int32_t)MPI_Comm_c2f(MPI_COMM_NULL), &bad),
               KFA_ERROR_INVALID_ARGUMENT,
               "kfa_block_create_sequence_parallel: comm (", "MPI_COMM_NULL handle");
  expect_error(kfa_block_create_sequence_parallel(NULL, KFA_F64, host, world, &bad),
               KFA_ERROR_INVALID_ARGUMENT, "options must not be NULL", "NULL options");
  expect_error(kfa_block_create_sequence_parallel(&o, KFA_F64, host, world, NULL),
               KFA_ERROR_INVALID_ARGUMENT, "block must not be NULL", "NULL block");
  kfa_block_options windowed = o;
  windowed.attention.window_left = 3;
  expect_error(kfa_block_create_sequence_parallel(&windowed, KFA_F64, host, world, &bad),
               KFA_ERROR_INVALID_ARGUMENT,
               "options.sequence_parallel needs options.attention.window_left", "window");
  expect_error(kfa_block_create_sequence_parallel(&o, KFA_BF16, host, world, &bad),
               KFA_ERROR_UNSUPPORTED, "KFA_F32 or KFA_F64", "bf16 block");
  check(bad == NULL, "no block on failure");
  for (size_t i = 0; i < total; ++i) g_expected[i] = g_mean[i];
  expect_error(kfa_block_allreduce_gradients(single, NULL, world, 7, 0),
               KFA_ERROR_INVALID_ARGUMENT,
               "kfa_block_allreduce_gradients: reduction must be KFA_GRADIENT_MEAN or "
               "KFA_GRADIENT_SUM, got 7",
               "bad reduction");
  expect_error(kfa_block_allreduce_gradients(single, NULL,
                                             (int32_t)MPI_Comm_c2f(MPI_COMM_NULL),
                                             KFA_GRADIENT_SUM, 0),
               KFA_ERROR_INVALID_ARGUMENT, "is MPI_COMM_NULL", "allreduce on MPI_COMM_NULL");
  expect_error(kfa_block_allreduce_gradients(NULL, NULL, world, KFA_GRADIENT_SUM, 0),
               KFA_ERROR_INVALID_ARGUMENT, "block must not be NULL", "allreduce NULL block");
  double* g_after = gradients(single, &count, &total);
  check(memcmp(g_after, g_expected, sizeof(double) * total) == 0, "gradients untouched");

  expect_success(kfa_block_destroy(parallel), "destroy parallel");
  expect_success(kfa_block_destroy(single), "destroy single");
  expect_success(kfa_finalize(), "kfa_finalize");
  free(x), free(dy), free(y), free(dx), free(xl), free(dyl), free(yl), free(dxl);
  free(y_ref), free(dx_ref), free(dy_scaled), free(g_single), free(g_mean), free(g_expected);
  free(g_rank0), free(g_after);

  int all_failures = 0;
  MPI_Allreduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("%s: %d failure(s) over %d rank(s)\n", all_failures ? "FAILED" : "PASSED",
           all_failures, ranks);
  }
  MPI_Finalize();
  return all_failures != 0;
}
