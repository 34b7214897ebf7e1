/* Embedding mha in a C application: load an nn.MultiheadAttention's weights from a safetensors
 * file, run one self-attention forward pass on a small input, print the result; then decode the
 * same tokens incrementally through a KV cache and check that it gives the same outputs.
 *
 *   embed WEIGHTS.safetensors NUM_HEADS [PREFIX]
 *
 * The input is a deterministic query of L = 3 tokens, batch N = 1, [L, N, E] (sequence-first,
 * nn.MultiheadAttention's default layout). Prints the output [L, N, E] one token per line and
 * the averaged attention weights [N, L, L]. The KV cache (mha_kv_cache) takes a prefill of the
 * first 2 tokens, then the last token alone; then that token is rolled back (as a rejected
 * speculative token would be) and decoded again. Prints the largest difference from the causal
 * forward's output, relative to 1 + |output|, and fails when it exceeds 1e-5. Uses the public C
 * API (mha/mha.h) only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "mha/mha.h"

/* Prints the failing call's status and message and returns 1 from main. */
#define CHECK(call)                                                                    \
  do {                                                                                 \
    mha_status status_ = (call);                                                       \
    if (status_ != MHA_STATUS_OK) {                                                    \
      fprintf(stderr, "embed: %s: %s\n", mha_status_name(status_), mha_last_error_message()); \
      goto done;                                                                       \
    }                                                                                  \
  } while (0)

/* Self-attention step of tokens first .. first + count - 1 through the cache. With N = 1 the
 * sequence-first [L, 1, features] arrays are also the batch-first [1, L, features] the cache
 * takes, so those tokens are the dense [1, count, features] tensors at row `first`. */
static mha_status Step(mha_kv_cache* cache, const mha_layer* layer, mha_context* context,
                       float* query, int64_t q_dim, float* output, int64_t E, int64_t first,
                       int64_t count) {
  mha_tensor x = {0}, out = {0};
  x.data = query + first * q_dim;
  x.dtype = MHA_DTYPE_F32;
  x.rank = 3;
  x.shape[0] = 1;
  x.shape[1] = count;
  x.shape[2] = q_dim;
  out = x;
  out.data = output + first * E;
  out.shape[2] = E;
  return mha_kv_cache_step(cache, layer, context, &x, &out, NULL);
}

int main(int argc, char** argv) {
  enum { L = 3, N = 1 };
  int rc = 1;
  mha_layer* layer = NULL;
  mha_context* context = NULL;
  mha_kv_cache* cache = NULL;
  float* query = NULL;
  float* output = NULL;
  float* decoded = NULL; /* the KV cache's outputs [L, N, E] */
  float weights[N * L * L];
  mha_load_options load = {0};
  mha_context_options options = {0};
  mha_layer_config config;
  mha_attention_inputs inputs = {0};
  mha_tensor out = {0};
  mha_tensor attn = {0};
  mha_kv_cache_options cache_options = {0};
  int64_t E, i, j;
  double worst = 0.0;

  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: embed WEIGHTS.safetensors NUM_HEADS [PREFIX]\n");
    return 2;
  }
  load.num_heads = atoi(argv[2]);
  CHECK(mha_layer_create_from_safetensors(argv[1], argc == 4 ? argv[3] : "", &load, &layer));
  /* The embedding width comes from the file. */
  CHECK(mha_layer_get_config(layer, &config));
  E = config.embed_dim;

  options.num_threads = 1; /* a context per application thread; 1 worker is plenty here */
  CHECK(mha_context_create(&options, &context));

  query = malloc(sizeof(float) * L * N * (size_t)config.q_dim);
  output = malloc(sizeof(float) * L * N * (size_t)E);
  decoded = malloc(sizeof(float) * L * N * (size_t)E);
  if (query == NULL || output == NULL || decoded == NULL) {
    fprintf(stderr, "embed: out of memory\n");
    goto done;
  }
  for (i = 0; i < L * N * config.q_dim; ++i) query[i] = (float)sin(0.1 * (double)(i + 1));

  /* Dense tensors: zero strides. Self-attention: key and value stay absent (data == NULL). */
  inputs.query.data = query;
  inputs.query.dtype = MHA_DTYPE_F32;
  inputs.query.rank = 3;
  inputs.query.shape[0] = L;
  inputs.query.shape[1] = N;
  inputs.query.shape[2] = config.q_dim;
  out.data = output;
  out.dtype = MHA_DTYPE_F32;
  out.rank = 3;
  out.shape[0] = L;
  out.shape[1] = N;
  out.shape[2] = E;
  attn.data = weights;
  attn.dtype = MHA_DTYPE_F32;
  attn.rank = 3;
  attn.shape[0] = N;
  attn.shape[1] = L;
  attn.shape[2] = L + config.add_bias_kv + config.add_zero_attn;
  if (attn.shape[2] != L) {
    fprintf(stderr, "embed: this example expects a layer without bias_k/bias_v\n");
    goto done;
  }

  CHECK(mha_layer_forward(layer, context, &inputs, &out, &attn, MHA_FORWARD_CAUSAL));

  printf("mha %s (%s, BLIS %s): E %lld, %lld heads, causal self-attention, L %d\n",
         mha_version(), mha_simd_target(), mha_blas_arch(), (long long)E,
         (long long)config.num_heads, L);
  for (i = 0; i < L; ++i) {
    printf("attn_output[%lld] =", (long long)i);
    for (j = 0; j < E; ++j) printf(" %.6f", output[i * E + j]);
    printf("\n");
  }
  for (i = 0; i < L; ++i) {
    printf("attn_weights[%lld] =", (long long)i);
    for (j = 0; j < L; ++j) printf(" %.6f", weights[i * L + j]);
    printf("\n");
  }

  /* Incremental decoding: a KV cache for N sequences of up to L positions (f32, owned). */
  cache_options.batch = N;
  cache_options.capacity = L;
  cache_options.dtype = MHA_DTYPE_F32;
  CHECK(mha_kv_cache_create(layer, &cache_options, &cache));
  CHECK(Step(cache, layer, context, query, config.q_dim, decoded, E, 0, L - 1)); /* prefill */
  CHECK(Step(cache, layer, context, query, config.q_dim, decoded, E, L - 1, 1)); /* decode */
  CHECK(mha_kv_cache_truncate(cache, 0, L - 1)); /* roll the last token back ... */
  CHECK(Step(cache, layer, context, query, config.q_dim, decoded, E, L - 1, 1)); /* ... again */
  for (i = 0; i < L * N * E; ++i) {
    const double err = fabs((double)decoded[i] - output[i]) / (1.0 + fabs(output[i]));
    if (!(err <= worst)) worst = err; /* NaN sticks */
  }
  printf("kv_cache: max |decoded - attn_output| / (1 + |attn_output|) = %.3g\n", worst);
  if (!(worst <= 1e-5)) {
    fprintf(stderr, "embed: the KV cache's outputs differ from the causal forward's\n");
    goto done;
  }
  rc = 0;

done:
  free(query);
  free(output);
  free(decoded);
  mha_kv_cache_destroy(cache);
  mha_context_destroy(context);
  mha_layer_destroy(layer);
  return rc;
}
