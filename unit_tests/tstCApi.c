/* The C interface from C99: attention forward/backward and a
 * TransformerBlock's training steps are bit for bit those of the C++ API on
 * the same inputs (c_api_reference.cpp), in both spaces; every argument
 * error returns its status with a message naming the argument and leaves
 * the outputs alone. */
#include <kfa/c_api.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* c_api_reference.cpp */
int kfa_test_f16_available(void);
void kfa_test_attention_reference(int dtype, const void* q, const void* k, const void* v,
                                  const void* d_o, void* o, void* lse, void* dq, void* dk,
                                  void* dv, int b, int sq, int sk, int h, int hkv, int d,
                                  const kfa_attention_options* options);
void kfa_test_block_reference(int dtype, const kfa_block_options* options,
                              const kfa_adamw_options* adamw, int steps, const void* x,
                              const void* dy, void* y, void* dx, void* grads, void* values,
                              int batch, int seqlen);
void* kfa_test_device_malloc(size_t bytes);
void kfa_test_device_free(void* pointer);
void kfa_test_copy(void* dst, int dst_device, const void* src, int src_device, size_t bytes);

static int failures = 0;

static void check(int ok, const char* what) {
  if (!ok) {
    ++failures;
    printf("FAILED %s\n", what);
  }
}

/* status `want` and a message containing `needle`. */
static void expect_error(kfa_status got, kfa_status want, const char* needle, const char* what) {
  const char* message = kfa_last_error();
  if (got != want || strstr(message, needle) == NULL) {
    ++failures;
    printf("FAILED %s: status %d (want %d), message \"%s\" (want \"%s\")\n", what, (int)got,
           (int)want, message, needle);
  } else {
    printf("ok  %-44s %s\n", what, message);
  }
}

static void expect_success(kfa_status got, const char* what) {
  if (got != KFA_SUCCESS) {
    ++failures;
    printf("FAILED %s: status %d: %s\n", what, (int)got, kfa_last_error());
  }
}

static size_t element_size(kfa_dtype dtype) {
  return dtype == KFA_F64 ? 8 : dtype == KFA_F32 ? 4 : 2;
}
static size_t lse_size(kfa_dtype dtype) { return dtype == KFA_F64 ? 8 : 4; }

/* Fixed-seed uniform values in [-1, 1), stored as dtype. */
static unsigned long long rng_state = 0x9e3779b97f4a7c15ULL;
static double uniform(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(rng_state >> 11) / 4503599627370496.0 - 1.0;
}
static unsigned short to_f16(float x) {
  unsigned int u;
  memcpy(&u, &x, 4);
  unsigned short sign = (unsigned short)((u >> 16) & 0x8000u);
  int exponent = (int)((u >> 23) & 0xff) - 127 + 15;
  if (exponent <= 0) return sign; /* flush tiny values */
  return (unsigned short)(sign | (exponent << 10) | ((u >> 13) & 0x3ffu));
}
static void* random_buffer(kfa_dtype dtype, size_t n) {
  unsigned char* p = (unsigned char*)malloc(n * element_size(dtype) + 1);
  for (size_t i = 0; i < n; ++i) {
    const double x = uniform();
    if (dtype == KFA_F64) {
      ((double*)p)[i] = x;
    } else if (dtype == KFA_F32) {
      ((float*)p)[i] = (float)x;
    } else if (dtype == KFA_BF16) {
      float f = (float)x;
      unsigned int u;
      memcpy(&u, &f, 4);
      ((unsigned short*)p)[i] = (unsigned short)(u >> 16);
    } else {
      ((unsigned short*)p)[i] = to_f16((float)x);
    }
  }
  return p;
}
static void* poisoned(size_t bytes) {
  void* p = malloc(bytes + 1);
  memset(p, 0x7f, bytes + 1);
  return p;
}

/* A buffer in `space`'s memory holding `host` (NULL: poisoned). */
static void* in_space(kfa_space space, const void* host, size_t bytes) {
  void* p = space == KFA_SPACE_HOST ? malloc(bytes + 1) : kfa_test_device_malloc(bytes);
  if (host != NULL) {
    kfa_test_copy(p, space == KFA_SPACE_DEFAULT, host, 0, bytes);
  } else {
    void* poison = poisoned(bytes);
    kfa_test_copy(p, space == KFA_SPACE_DEFAULT, poison, 0, bytes);
    free(poison);
  }
  return p;
}
static void release(kfa_space space, void* p) {
  if (space == KFA_SPACE_HOST) free(p);
  else kfa_test_device_free(p);
}
static void* back(kfa_space space, const void* p, size_t bytes) {
  void* host = malloc(bytes + 1);
  kfa_test_copy(host, 0, p, space == KFA_SPACE_DEFAULT, bytes);
  return host;
}

static const char* dtype_name(kfa_dtype dtype) {
  return dtype == KFA_F64 ? "f64" : dtype == KFA_F32 ? "f32" : dtype == KFA_BF16 ? "bf16" : "f16";
}

enum { B = 2, SQ = 37, SK = 53, H = 4, HKV = 2, D = 24 };

static void test_attention(kfa_dtype dtype, kfa_space space, const kfa_attention_options* options,
                           const char* label) {
  const size_t nq = (size_t)B * SQ * H * D, nkv = (size_t)B * SK * HKV * D, nl = (size_t)B * H * SQ;
  const size_t es = element_size(dtype), ls = lse_size(dtype);
  void* q = random_buffer(dtype, nq);
  void* k = random_buffer(dtype, nkv);
  void* v = random_buffer(dtype, nkv);
  void* d_o = random_buffer(dtype, nq);
  void* sq = in_space(space, q, nq * es);
  void* sk = in_space(space, k, nkv * es);
  void* sv = in_space(space, v, nkv * es);
  void* sdo = in_space(space, d_o, nq * es);
  void* so = in_space(space, NULL, nq * es);
  void* slse = in_space(space, NULL, nl * ls);
  void* sdq = in_space(space, NULL, nq * es);
  void* sdk = in_space(space, NULL, nkv * es);
  void* sdv = in_space(space, NULL, nkv * es);
  char what[128];
  snprintf(what, sizeof what, "attention %s %s %s", dtype_name(dtype),
           space == KFA_SPACE_HOST ? "host" : "default", label);
  expect_success(kfa_attention_forward(space, NULL, dtype, sq, sk, sv, so, slse, B, SQ, SK, H,
                                       HKV, D, options),
                 what);
  expect_success(kfa_attention_backward(space, NULL, dtype, sq, sk, sv, so, slse, sdo, sdq, sdk,
                                        sdv, B, SQ, SK, H, HKV, D, options),
                 what);
  expect_success(kfa_fence(space, NULL), what);

  void* o = poisoned(nq * es);
  void* lse = poisoned(nl * ls);
  void* dq = poisoned(nq * es);
  void* dk = poisoned(nkv * es);
  void* dv = poisoned(nkv * es);
  kfa_attention_options reference_options;
  if (options != NULL) reference_options = *options;
  else kfa_attention_options_default(&reference_options);
  kfa_test_attention_reference(dtype, q, k, v, d_o, o, lse, dq, dk, dv, B, SQ, SK, H, HKV, D,
                               &reference_options);
  void* got[5] = {back(space, so, nq * es), back(space, slse, nl * ls), back(space, sdq, nq * es),
                  back(space, sdk, nkv * es), back(space, sdv, nkv * es)};
  void* want[5] = {o, lse, dq, dk, dv};
  const size_t bytes[5] = {nq * es, nl * ls, nq * es, nkv * es, nkv * es};
  const char* names[5] = {"o", "lse", "dq", "dk", "dv"};
  int same = 1;
  for (int i = 0; i < 5; ++i) {
    if (memcmp(got[i], want[i], bytes[i]) != 0) {
      printf("  %s differs from the C++ API's\n", names[i]);
      same = 0;
    }
    free(got[i]);
    free(want[i]);
  }
  check(same, what);
  if (same) printf("ok  %-44s bitwise equal to the C++ API\n", what);
  void* buffers[9] = {sq, sk, sv, sdo, so, slse, sdq, sdk, sdv};
  for (int i = 0; i < 9; ++i) release(space, buffers[i]);
  free(q);
  free(k);
  free(v);
  free(d_o);
}

/* Every argument error of the attention calls: status, message, and o, dq
 * untouched. */
static void test_attention_errors(void) {
  const kfa_dtype t = KFA_F32;
  const size_t nq = (size_t)B * SQ * H * D, nkv = (size_t)B * SK * HKV * D, nl = (size_t)B * H * SQ;
  float* q = (float*)random_buffer(t, nq);
  float* k = (float*)random_buffer(t, nkv);
  float* v = (float*)random_buffer(t, nkv);
  float* d_o = (float*)random_buffer(t, nq);
  float* o = (float*)poisoned(nq * 4);
  float* lse = (float*)poisoned(nl * 4);
  float* dq = (float*)poisoned(nq * 4);
  float* dk = (float*)poisoned(nkv * 4);
  float* dv = (float*)poisoned(nkv * 4);
  void* poison = poisoned(nq * 4);
  const kfa_space s = KFA_SPACE_HOST;

  const void* fwd[5] = {q, k, v, o, lse};
  const char* fwd_names[5] = {": q [", ": k [", ": v [", ": o [", ": lse ["};
  for (int i = 0; i < 5; ++i) {
    const void* p[5];
    memcpy(p, fwd, sizeof p);
    p[i] = NULL;
    char what[64];
    snprintf(what, sizeof what, "forward with%s NULL", fwd_names[i] + 1);
    expect_error(kfa_attention_forward(s, NULL, t, p[0], p[1], p[2], (void*)p[3], (void*)p[4], B,
                                       SQ, SK, H, HKV, D, NULL),
                 KFA_ERROR_INVALID_ARGUMENT, fwd_names[i], what);
  }
  const void* bwd[9] = {q, k, v, o, lse, d_o, dq, dk, dv};
  const char* bwd_names[9] = {": q [", ": k [", ": v [", ": o [", ": lse [", ": d_o [",
                              ": dq [", ": dk [", ": dv ["};
  for (int i = 0; i < 9; ++i) {
    const void* p[9];
    memcpy(p, bwd, sizeof p);
    p[i] = NULL;
    char what[64];
    snprintf(what, sizeof what, "backward with%s NULL", bwd_names[i] + 1);
    expect_error(kfa_attention_backward(s, NULL, t, p[0], p[1], p[2], p[3], p[4], p[5],
                                        (void*)p[6], (void*)p[7], (void*)p[8], B, SQ, SK, H, HKV,
                                        D, NULL),
                 KFA_ERROR_INVALID_ARGUMENT, bwd_names[i], what);
  }
  expect_error(kfa_attention_forward(s, NULL, (kfa_dtype)7, q, k, v, o, lse, B, SQ, SK, H, HKV, D,
                                     NULL),
               KFA_ERROR_INVALID_ARGUMENT, "dtype must be", "forward with dtype 7");
  expect_error(kfa_attention_backward(s, NULL, (kfa_dtype)-1, q, k, v, o, lse, d_o, dq, dk, dv, B,
                                      SQ, SK, H, HKV, D, NULL),
               KFA_ERROR_INVALID_ARGUMENT, "dtype must be", "backward with dtype -1");
  expect_error(kfa_attention_forward((kfa_space)9, NULL, t, q, k, v, o, lse, B, SQ, SK, H, HKV, D,
                                     NULL),
               KFA_ERROR_INVALID_ARGUMENT, "space must be", "forward with space 9");
  if (!kfa_test_f16_available()) {
    expect_error(kfa_attention_forward(s, NULL, KFA_F16, q, k, v, o, lse, B, SQ, SK, H, HKV, D,
                                       NULL),
                 KFA_ERROR_UNSUPPORTED, "KFA_F16", "forward with f16 (not in this build)");
  }
  struct {
    long long b, sq, sk, h, hkv, d;
    const char* needle;
  } sizes[] = {{-1, SQ, SK, H, HKV, D, "batch must be >= 0, got -1"},
               {B, -3, SK, H, HKV, D, "seqlen_q must be >= 0, got -3"},
               {B, SQ, -1, H, HKV, D, "seqlen_k must be >= 0"},
               {B, SQ, SK, 0, HKV, D, "heads must be >= 1, got 0"},
               {B, SQ, SK, H, 0, D, "kv_heads must be >= 1, got 0"},
               {B, SQ, SK, 4, 3, D, "heads (4) must be a multiple of kv_heads (3)"},
               {B, SQ, SK, H, HKV, 0, "head_dim must be >= 1, got 0"},
               {B, SQ, SK, H, HKV, 300, "head_dim must be in 1..256, got 300"}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    expect_error(kfa_attention_forward(s, NULL, t, q, k, v, o, lse, sizes[i].b, sizes[i].sq,
                                       sizes[i].sk, sizes[i].h, sizes[i].hkv, sizes[i].d, NULL),
                 KFA_ERROR_INVALID_ARGUMENT, sizes[i].needle, "forward with a bad size");
    expect_error(kfa_attention_backward(s, NULL, t, q, k, v, o, lse, d_o, dq, dk, dv, sizes[i].b,
                                        sizes[i].sq, sizes[i].sk, sizes[i].h, sizes[i].hkv,
                                        sizes[i].d, NULL),
                 KFA_ERROR_INVALID_ARGUMENT, sizes[i].needle, "backward with a bad size");
  }
  kfa_attention_options bad;
  kfa_attention_options_default(&bad);
  bad.window_left = -2;
  expect_error(kfa_attention_forward(s, NULL, t, q, k, v, o, lse, B, SQ, SK, H, HKV, D, &bad),
               KFA_ERROR_INVALID_ARGUMENT, "window_left", "forward with window_left -2");
  kfa_attention_options_default(&bad);
  bad.dropout_p = 1.5;
  expect_error(kfa_attention_backward(s, NULL, t, q, k, v, o, lse, d_o, dq, dk, dv, B, SQ, SK, H,
                                      HKV, D, &bad),
               KFA_ERROR_INVALID_ARGUMENT, "dropout_p", "backward with dropout_p 1.5");
  kfa_attention_options_default(&bad);
  bad.softcap = -1;
  expect_error(kfa_attention_forward(s, NULL, t, q, k, v, o, lse, B, SQ, SK, H, HKV, D, &bad),
               KFA_ERROR_INVALID_ARGUMENT, "softcap", "forward with softcap -1");
  kfa_attention_options_default(&bad);
  bad.softmax_scale = NAN;
  expect_error(kfa_attention_forward(s, NULL, t, q, k, v, o, lse, B, SQ, SK, H, HKV, D, &bad),
               KFA_ERROR_INVALID_ARGUMENT, "softmax_scale", "forward with softmax_scale NaN");
  check(memcmp(o, poison, nq * 4) == 0 && memcmp(dq, poison, nq * 4) == 0,
        "failed calls leave o and dq alone");
  float* buffers[9] = {q, k, v, d_o, o, lse, dq, dk, dv};
  for (int i = 0; i < 9; ++i) free(buffers[i]);
  free(poison);
}

/* Two training steps (zero_grad, forward, backward, AdamW) through the C
 * interface and through the C++ API: y, dx, every gradient and every
 * parameter equal bit for bit. */
static void test_block(kfa_dtype dtype, kfa_space space, const kfa_block_options* options,
                       const char* label) {
  enum { BB = 2, S = 11, STEPS = 2 };
  const size_t es = element_size(dtype), n = (size_t)BB * S * options->d_model;
  kfa_adamw_options adamw;
  kfa_adamw_options_default(&adamw);
  adamw.lr = 1e-2;
  void* x = random_buffer(dtype, n);
  void* dy = random_buffer(dtype, n);
  void* sx = in_space(space, x, n * es);
  void* sdy = in_space(space, dy, n * es);
  void* sy = in_space(space, NULL, n * es);
  void* sdx = in_space(space, NULL, n * es);
  char what[128];
  snprintf(what, sizeof what, "block %s %s %s", dtype_name(dtype),
           space == KFA_SPACE_HOST ? "host" : "default", label);
  kfa_block* block = NULL;
  expect_success(kfa_block_create(options, dtype, space, &block), what);
  if (block == NULL) return;
  for (int step = 0; step < STEPS; ++step) {
    expect_success(kfa_block_zero_grad(block, NULL), what);
    expect_success(kfa_block_forward(block, NULL, dtype, sx, sy, BB, S, options->d_model,
                                     100 + step, 1),
                   what);
    expect_success(kfa_block_backward(block, NULL, dtype, sdy, sdx, BB, S, options->d_model),
                   what);
    expect_success(kfa_block_adamw_step(block, NULL, &adamw), what);
  }
  expect_success(kfa_fence(space, NULL), what);

  int count = 0;
  long long total = 0;
  expect_success(kfa_block_parameter_count(block, &count), what);
  for (int i = 0; i < count; ++i) {
    const char* name;
    int64_t size = 0;
    expect_success(kfa_block_parameter_name(block, i, &name), what);
    expect_success(kfa_block_parameter(block, name, NULL, NULL, &size), what);
    total += size;
  }
  unsigned char* grads = (unsigned char*)malloc(total * es + 1);
  unsigned char* values = (unsigned char*)malloc(total * es + 1);
  long long offset = 0;
  for (int i = 0; i < count; ++i) {
    const char* name;
    void *value, *grad;
    int64_t size;
    kfa_block_parameter_name(block, i, &name);
    kfa_block_parameter(block, name, &value, &grad, &size);
    kfa_test_copy(grads + offset * es, 0, grad, space == KFA_SPACE_DEFAULT, size * es);
    kfa_test_copy(values + offset * es, 0, value, space == KFA_SPACE_DEFAULT, size * es);
    offset += size;
  }
  void* y = back(space, sy, n * es);
  void* dx = back(space, sdx, n * es);
  void* ref_y = poisoned(n * es);
  void* ref_dx = poisoned(n * es);
  void* ref_grads = poisoned(total * es);
  void* ref_values = poisoned(total * es);
  kfa_test_block_reference(dtype, options, &adamw, STEPS, x, dy, ref_y, ref_dx, ref_grads,
                           ref_values, BB, S);
  const int same = memcmp(y, ref_y, n * es) == 0 && memcmp(dx, ref_dx, n * es) == 0 &&
                   memcmp(grads, ref_grads, total * es) == 0 &&
                   memcmp(values, ref_values, total * es) == 0;
  check(same, what);
  if (same) {
    printf("ok  %-44s %d parameters (%lld values): bitwise equal to the C++ API\n", what, count,
           total);
  }
  expect_success(kfa_block_destroy(block), what);
  void* buffers[] = {x, dy, y, dx, ref_y, ref_dx, ref_grads, ref_values, grads, values};
  for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) free(buffers[i]);
  void* space_buffers[] = {sx, sdy, sy, sdx};
  for (int i = 0; i < 4; ++i) release(space, space_buffers[i]);
}

static void small_block(kfa_block_options* o) {
  kfa_block_options_default(o);
  o->d_model = 24;
  o->heads = 3;
  o->d_ff = 40;
}

static void test_block_errors(void) {
  const kfa_space s = KFA_SPACE_HOST;
  kfa_block_options o;
  small_block(&o);
  kfa_block* block = NULL;
  expect_error(kfa_block_create(NULL, KFA_F32, s, &block), KFA_ERROR_INVALID_ARGUMENT,
               "options must not be NULL", "create with NULL options");
  expect_error(kfa_block_create(&o, KFA_F32, s, NULL), KFA_ERROR_INVALID_ARGUMENT,
               "block must not be NULL", "create with NULL block");
  expect_error(kfa_block_create(&o, KFA_BF16, s, &block), KFA_ERROR_UNSUPPORTED, "KFA_F32 or KFA_F64",
               "create with bf16");
  expect_error(kfa_block_create(&o, (kfa_dtype)9, s, &block), KFA_ERROR_INVALID_ARGUMENT,
               "dtype must be", "create with dtype 9");
  expect_error(kfa_block_create(&o, KFA_F32, (kfa_space)3, &block), KFA_ERROR_INVALID_ARGUMENT,
               "space must be", "create with space 3");
  o.d_ff = 0;
  expect_error(kfa_block_create(&o, KFA_F32, s, &block), KFA_ERROR_INVALID_ARGUMENT, "d_ff",
               "create with d_ff 0");
  small_block(&o);
  o.heads = 5;
  expect_error(kfa_block_create(&o, KFA_F32, s, &block), KFA_ERROR_INVALID_ARGUMENT, "heads",
               "create with d_model 24, heads 5");
  small_block(&o);
  o.norm = 9;
  expect_error(kfa_block_create(&o, KFA_F32, s, &block), KFA_ERROR_INVALID_ARGUMENT,
               "options->norm", "create with norm 9");
  small_block(&o);
  o.activation = -1;
  expect_error(kfa_block_create(&o, KFA_F32, s, &block), KFA_ERROR_INVALID_ARGUMENT,
               "options->activation", "create with activation -1");
  small_block(&o);
  o.rotary_style = 4;
  expect_error(kfa_block_create(&o, KFA_F32, s, &block), KFA_ERROR_INVALID_ARGUMENT,
               "options->rotary_style", "create with rotary_style 4");
  check(block == NULL, "failed creates leave *block alone");

  small_block(&o);
  expect_success(kfa_block_create(&o, KFA_F32, s, &block), "create");
  enum { BB = 2, S = 5, DM = 24 };
  float* x = (float*)random_buffer(KFA_F32, BB * S * DM);
  float* y = (float*)poisoned(BB * S * DM * 4);
  float* dx = (float*)poisoned(BB * S * DM * 4);
  void* poison = poisoned(BB * S * DM * 4);
  double* x64 = (double*)random_buffer(KFA_F64, BB * S * DM);
  expect_error(kfa_block_backward(block, NULL, KFA_F32, x, dx, BB, S, DM),
               KFA_ERROR_INVALID_ARGUMENT, "call forward", "backward before a forward");
  expect_error(kfa_block_forward(NULL, NULL, KFA_F32, x, y, BB, S, DM, 0, 1),
               KFA_ERROR_INVALID_ARGUMENT, "block must not be NULL", "forward with NULL block");
  expect_error(kfa_block_forward(block, NULL, KFA_F64, x64, y, BB, S, DM, 0, 1),
               KFA_ERROR_INVALID_ARGUMENT, "dtype (0) must be the block's (1)",
               "forward with f64 on an f32 block");
  expect_error(kfa_block_forward(block, NULL, KFA_F32, NULL, y, BB, S, DM, 0, 1),
               KFA_ERROR_INVALID_ARGUMENT, ": x [batch][seqlen][d_model] must not be NULL",
               "forward with NULL x");
  expect_error(kfa_block_forward(block, NULL, KFA_F32, x, NULL, BB, S, DM, 0, 1),
               KFA_ERROR_INVALID_ARGUMENT, ": y [batch][seqlen][d_model] must not be NULL",
               "forward with NULL y");
  expect_error(kfa_block_forward(block, NULL, KFA_F32, x, y, BB, S, 23, 0, 1),
               KFA_ERROR_INVALID_ARGUMENT, "d_model must be the block's 24, got 23",
               "forward with d_model 23");
  expect_error(kfa_block_forward(block, NULL, KFA_F32, x, y, 0, S, DM, 0, 1),
               KFA_ERROR_INVALID_ARGUMENT, "batch must be >= 1, got 0", "forward with batch 0");
  expect_error(kfa_block_forward(block, NULL, KFA_F32, x, y, BB, -2, DM, 0, 1),
               KFA_ERROR_INVALID_ARGUMENT, "seqlen must be >= 1, got -2", "forward with seqlen -2");
  expect_error(kfa_block_forward(block, NULL, KFA_F32, x, x, BB, S, DM, 0, 1),
               KFA_ERROR_INVALID_ARGUMENT, "y", "forward with y = x");
  check(memcmp(y, poison, BB * S * DM * 4) == 0, "failed forwards leave y alone");
  expect_success(kfa_block_forward(block, NULL, KFA_F32, x, y, BB, S, DM, 0, 1), "forward");
  expect_error(kfa_block_backward(block, NULL, KFA_F32, y, dx, BB, S - 1, DM),
               KFA_ERROR_INVALID_ARGUMENT, "dy", "backward with another seqlen");
  expect_error(kfa_block_backward(block, NULL, KFA_F32, NULL, dx, BB, S, DM),
               KFA_ERROR_INVALID_ARGUMENT, ": dy [", "backward with NULL dy");
  expect_error(kfa_block_backward(block, NULL, KFA_F32, y, NULL, BB, S, DM),
               KFA_ERROR_INVALID_ARGUMENT, ": dx [", "backward with NULL dx");
  check(memcmp(dx, poison, BB * S * DM * 4) == 0, "failed backwards leave dx alone");
  expect_error(kfa_block_zero_grad(NULL, NULL), KFA_ERROR_INVALID_ARGUMENT, "block",
               "zero_grad with NULL block");
  kfa_adamw_options adamw;
  kfa_adamw_options_default(&adamw);
  adamw.lr = -1;
  expect_error(kfa_block_adamw_step(block, NULL, &adamw), KFA_ERROR_INVALID_ARGUMENT, "lr",
               "adamw_step with lr -1");
  kfa_adamw_options_default(&adamw);
  adamw.beta1 = 1;
  expect_error(kfa_block_adamw_step(block, NULL, &adamw), KFA_ERROR_INVALID_ARGUMENT, "beta1",
               "adamw_step with beta1 1");
  int count = -1;
  expect_error(kfa_block_parameter_count(block, NULL), KFA_ERROR_INVALID_ARGUMENT,
               "count must not be NULL", "parameter_count with NULL count");
  expect_success(kfa_block_parameter_count(block, &count), "parameter_count");
  const char* name = NULL;
  expect_error(kfa_block_parameter_name(block, count, &name), KFA_ERROR_INVALID_ARGUMENT,
               "index must be in [0, ", "parameter_name past the end");
  expect_error(kfa_block_parameter_name(block, -1, &name), KFA_ERROR_INVALID_ARGUMENT,
               "index must be in [0, ", "parameter_name -1");
  expect_error(kfa_block_parameter_name(block, 0, NULL), KFA_ERROR_INVALID_ARGUMENT,
               "name must not be NULL", "parameter_name with NULL name");
  void* value = NULL;
  int64_t size = 0;
  expect_error(kfa_block_parameter(block, "linear3.weight", &value, NULL, &size),
               KFA_ERROR_INVALID_ARGUMENT, "name \"linear3.weight\" is not a parameter",
               "parameter with an unknown name");
  expect_error(kfa_block_parameter(block, NULL, &value, NULL, &size), KFA_ERROR_INVALID_ARGUMENT,
               "name must not be NULL", "parameter with NULL name");
  expect_success(kfa_block_parameter(block, "linear1.weight", &value, NULL, &size), "parameter");
  check(value != NULL && size == 40 * 24, "linear1.weight is [d_ff][d_model]");
  expect_success(kfa_block_parameter_name(block, 0, &name), "parameter_name");
  check(strcmp(name, "self_attn.in_proj_weight") == 0, "parameter 0 is self_attn.in_proj_weight");
  check(kfa_last_error()[0] == '\0', "a success clears the message");

  expect_error(kfa_finalize(), KFA_ERROR_INVALID_STATE, "1 block(s) still alive",
               "finalize with a live block");
  expect_success(kfa_block_destroy(block), "destroy");
  expect_success(kfa_block_destroy(NULL), "destroy NULL");
  free(x);
  free(y);
  free(dx);
  free(x64);
  free(poison);
}

int main(void) {
  float x = 0;
  expect_error(kfa_attention_forward(KFA_SPACE_HOST, NULL, KFA_F32, &x, &x, &x, &x, &x, 1, 1, 1,
                                     1, 1, 1, NULL),
               KFA_ERROR_NOT_INITIALIZED, "kfa_initialize", "a call before kfa_initialize");
  expect_success(kfa_initialize(), "kfa_initialize");
  expect_success(kfa_initialize(), "kfa_initialize again");

  kfa_attention_options causal;
  kfa_attention_options_default(&causal);
  causal.causal = 1;
  kfa_attention_options variants;
  kfa_attention_options_default(&variants);
  variants.window_left = 9;
  variants.window_right = 4;
  variants.softcap = 5;
  variants.dropout_p = 0.2;
  variants.dropout_seed = 11;
  variants.softmax_scale = 0.3;
  variants.deterministic = 1;
  const kfa_dtype dtypes[4] = {KFA_F64, KFA_F32, KFA_BF16, KFA_F16};
  const int n_dtypes = kfa_test_f16_available() ? 4 : 3;
  if (n_dtypes == 3) printf("--  f16 not in this build (kfa::half is float): skipped\n");
  for (int space = KFA_SPACE_DEFAULT; space <= KFA_SPACE_HOST; ++space) {
    for (int t = 0; t < n_dtypes; ++t) {
      test_attention(dtypes[t], (kfa_space)space, NULL, "defaults");
      test_attention(dtypes[t], (kfa_space)space, &causal, "causal");
    }
    test_attention(KFA_F32, (kfa_space)space, &variants, "window+softcap+dropout+scale");
  }
  test_attention_errors();

  kfa_block_options gelu;
  small_block(&gelu);
  gelu.dropout_p = 0.1;
  gelu.attention.dropout_p = 0.1;
  gelu.init_seed = 5;
  kfa_block_options llama;
  small_block(&llama);
  llama.kv_heads = 1;
  llama.norm = KFA_RMS_NORM;
  llama.activation = KFA_SWIGLU;
  llama.bias = 0;
  llama.fused_qkv = 0;
  llama.rotary = 1;
  llama.rotary_style = KFA_ROTARY_INTERLEAVED;
  llama.attention.causal = 1;
  for (int space = KFA_SPACE_DEFAULT; space <= KFA_SPACE_HOST; ++space) {
    test_block(KFA_F32, (kfa_space)space, &gelu, "layer_norm gelu dropout");
    test_block(KFA_F64, (kfa_space)space, &llama, "rms_norm swiglu rotary gqa causal");
  }
  test_block_errors();

  expect_success(kfa_finalize(), "kfa_finalize");
  expect_error(kfa_attention_forward(KFA_SPACE_HOST, NULL, KFA_F32, &x, &x, &x, &x, &x, 1, 1, 1,
                                     1, 1, 1, NULL),
               KFA_ERROR_NOT_INITIALIZED, "not initialised", "a call after kfa_finalize");
  expect_error(kfa_initialize(), KFA_ERROR_INVALID_STATE, "cannot be initialised again",
               "kfa_initialize after kfa_finalize");
  printf("%s: %d failure(s)\n", failures ? "FAILED" : "ok", failures);
  return failures ? 1 : 0;
}
