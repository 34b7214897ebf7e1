/* Embedding mha in a C application: load an nn.MultiheadAttention's weights from a safetensors
 * file, run one self-attention forward pass on a small input, print the result.
 *
 *   embed WEIGHTS.safetensors NUM_HEADS [PREFIX]
 *
 * The input is a deterministic query of L = 3 tokens, batch N = 1, [L, N, E] (sequence-first,
 * nn.MultiheadAttention's default layout). Prints the output [L, N, E] one token per line and
 * the averaged attention weights [N, L, L]. Uses the public C API (mha/mha.h) only. */
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

int main(int argc, char** argv) {
  enum { L = 3, N = 1 };
  int rc = 1;
  mha_layer* layer = NULL;
  mha_context* context = NULL;
  float* query = NULL;
  float* output = NULL;
  float weights[N * L * L];
  mha_load_options load = {0};
  mha_context_options options = {0};
  mha_layer_config config;
  mha_attention_inputs inputs = {0};
  mha_tensor out = {0};
  mha_tensor attn = {0};
  int64_t E, i, j;

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
  if (query == NULL || output == NULL) {
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
  rc = 0;

done:
  free(query);
  free(output);
  mha_context_destroy(context);
  mha_layer_destroy(layer);
  return rc;
}
