/* Running mha on an application's own thread pool: the application already has worker threads
 * (here a minimal POSIX-threads pool, 2 threads plus the calling thread), so it gives them to mha
 * through an mha_executor instead of letting the context start threads of its own.
 *
 *   host_pool
 *
 * Runs a causal self-attention forward (with averaged attention weights) and a KV-cache prefill
 * plus decode steps on the application's pool, then the same on a context with mha's own pool,
 * and checks that the outputs are bitwise identical (the executor contract promises it). Prints
 * how many parallel loops mha handed to the application's pool. Exits 1 on any mha error or
 * difference. Uses the public C API (mha/mha.h) only; the layer's weights are generated. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mha/mha.h"

/* ---- The application's pool ------------------------------------------------------------------ */

enum { kPoolThreads = 2 };

/* Worker threads 1..kPoolThreads wait for a job; the thread calling app_parallel_for takes part
 * as worker 0. Tasks are claimed one at a time under the mutex (mha's tasks are coarse: a block
 * of query rows of one head, a panel of a projection). */
typedef struct app_pool {
  pthread_mutex_t mu;
  pthread_cond_t wake;     /* a new job, or stop */
  pthread_cond_t all_done; /* the job's last task finished */
  pthread_t threads[kPoolThreads];
  /* The current job. */
  mha_task_fn fn;
  void* arg;
  uint64_t n_tasks, next, finished;
  unsigned long generation;
  int stop;
  unsigned long jobs; /* jobs run so far */
} app_pool;

typedef struct app_worker {
  app_pool* pool;
  size_t index;
} app_worker;

static app_worker workers[kPoolThreads];

/* Runs the current job's tasks until none is left to claim, as `worker`; mu is held on entry
 * and on return. */
static void run_tasks(app_pool* p, size_t worker) {
  while (p->next < p->n_tasks) {
    const uint64_t task = p->next++;
    pthread_mutex_unlock(&p->mu);
    p->fn(p->arg, task, worker);
    pthread_mutex_lock(&p->mu);
    if (++p->finished == p->n_tasks) pthread_cond_signal(&p->all_done);
  }
}

static void* worker_main(void* arg) {
  const app_worker* w = (const app_worker*)arg;
  app_pool* p = w->pool;
  unsigned long seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->stop && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
    if (p->stop) break;
    seen = p->generation;
    run_tasks(p, w->index);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* mha_executor.parallel_for: every task once, returns when all have finished. */
static void app_parallel_for(void* user, uint64_t n_tasks, mha_task_fn fn, void* arg) {
  app_pool* p = (app_pool*)user;
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->arg = arg;
  p->n_tasks = n_tasks;
  p->next = 0;
  p->finished = 0;
  ++p->generation;
  ++p->jobs;
  pthread_cond_broadcast(&p->wake);
  run_tasks(p, 0); /* the calling thread is worker 0 */
  while (p->finished < p->n_tasks) pthread_cond_wait(&p->all_done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

static int app_pool_start(app_pool* p) {
  size_t i;
  memset(p, 0, sizeof(*p));
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->all_done, NULL);
  for (i = 0; i < kPoolThreads; ++i) {
    workers[i].pool = p;
    workers[i].index = i + 1;
    if (pthread_create(&p->threads[i], NULL, worker_main, &workers[i]) != 0) return 0;
  }
  return 1;
}

static void app_pool_stop(app_pool* p) {
  size_t i;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (i = 0; i < kPoolThreads; ++i) pthread_join(p->threads[i], NULL);
  pthread_cond_destroy(&p->all_done);
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->mu);
}

/* ---- mha on that pool ------------------------------------------------------------------------ */

enum { E = 64, H = 4, N = 2, L = 24, PREFILL = 20 };

/* Outputs of one context: forward output [N, L, E], weights [N, L, L], then the KV cache's
 * outputs [N, L, E] (prefill, then one token per step). */
typedef struct results {
  float output[N * L * E];
  float weights[N * L * L];
  float decoded[N * L * E];
} results;

static mha_tensor dense3(float* data, int64_t a, int64_t b, int64_t c) {
  mha_tensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = MHA_DTYPE_F32;
  t.rank = 3;
  t.shape[0] = a;
  t.shape[1] = b;
  t.shape[2] = c;
  return t;
}

/* Prints the failing call's status and message and returns 0 from the function. */
#define CHECK(call)                                                                               \
  do {                                                                                            \
    mha_status status_ = (call);                                                                  \
    if (status_ != MHA_STATUS_OK) {                                                               \
      fprintf(stderr, "host_pool: %s: %s\n", mha_status_name(status_), mha_last_error_message()); \
      goto fail;                                                                                  \
    }                                                                                             \
  } while (0)

/* x [N, L, E] batch-first. The cache takes [N, T, E] tensors: entry n's tokens t0 .. t0 + T - 1
 * are copied into `chunk` first (they are not contiguous across entries). */
static int run(const mha_layer* layer, mha_context* ctx, const float* x, results* r) {
  static float chunk_in[N * L * E], chunk_out[N * L * E];
  mha_attention_inputs in;
  mha_kv_cache_options co;
  mha_kv_cache* cache = NULL;
  mha_tensor out, w, cx, cout;
  int64_t t0, T, n;
  memset(&in, 0, sizeof(in));
  in.query = dense3((float*)x, N, L, E);
  out = dense3(r->output, N, L, E);
  w = dense3(r->weights, N, L, L);
  CHECK(mha_layer_forward(layer, ctx, &in, &out, &w, MHA_FORWARD_CAUSAL));

  memset(&co, 0, sizeof(co));
  co.batch = N;
  co.capacity = L;
  CHECK(mha_kv_cache_create(layer, &co, &cache));
  for (t0 = 0; t0 < L; t0 += T) {
    T = t0 == 0 ? PREFILL : 1;
    for (n = 0; n < N; ++n) {
      memcpy(chunk_in + n * T * E, x + (n * L + t0) * E, sizeof(float) * (size_t)(T * E));
    }
    cx = dense3(chunk_in, N, T, E);
    cout = dense3(chunk_out, N, T, E);
    CHECK(mha_kv_cache_step(cache, layer, ctx, &cx, &cout, NULL));
    for (n = 0; n < N; ++n) {
      memcpy(r->decoded + (n * L + t0) * E, chunk_out + n * T * E, sizeof(float) * (size_t)(T * E));
    }
  }
  mha_kv_cache_destroy(cache);
  return 1;
fail:
  mha_kv_cache_destroy(cache);
  return 0;
}

int main(void) {
  static float w_in[3 * E * E], b_in[3 * E], w_out[E * E], b_out[E], x[N * L * E];
  static results on_app_pool, on_own_pool;
  app_pool pool;
  mha_executor executor;
  mha_context_options options;
  mha_layer_config config;
  mha_layer_weights weights;
  mha_layer* layer = NULL;
  mha_context* app_ctx = NULL;
  mha_context* own_ctx = NULL;
  int rc = 1, i;

  for (i = 0; i < 3 * E * E; ++i) w_in[i] = (float)sin(0.37 * i) * 0.2f;
  for (i = 0; i < 3 * E; ++i) b_in[i] = (float)cos(0.11 * i) * 0.1f;
  for (i = 0; i < E * E; ++i) w_out[i] = (float)sin(0.23 * i + 1.0) * 0.2f;
  for (i = 0; i < E; ++i) b_out[i] = 0.01f * (float)i;
  for (i = 0; i < N * L * E; ++i) x[i] = (float)sin(0.05 * i);
  if (mha_layer_config_init(&config) != MHA_STATUS_OK) return 1;
  config.embed_dim = E;
  config.num_heads = H;
  config.batch_first = 1;
  memset(&weights, 0, sizeof(weights));
  weights.in_proj_weight = w_in;
  weights.in_proj_bias = b_in;
  weights.out_proj_weight = w_out;
  weights.out_proj_bias = b_out;
  if (!app_pool_start(&pool)) {
    fprintf(stderr, "host_pool: cannot start the application's threads\n");
    return 1;
  }

  /* The application's pool as an executor: kPoolThreads threads + the caller run at once. */
  executor.parallel_for = app_parallel_for;
  executor.num_workers = kPoolThreads + 1;
  executor.user = &pool;
  memset(&options, 0, sizeof(options));
  options.executor = &executor;
  CHECK(mha_layer_create(&config, &weights, MHA_WEIGHTS_VIEW, &layer));
  CHECK(mha_context_create(&options, &app_ctx));
  if (!run(layer, app_ctx, x, &on_app_pool)) goto fail;
  printf(
      "mha %s (%s): forward + KV cache (prefill %d, %d decode steps) ran as %lu parallel "
      "loops on the application's %d threads + caller\n",
      mha_version(), mha_simd_target(), PREFILL, L - PREFILL, pool.jobs, kPoolThreads);

  /* The same on mha's own pool (zero-initialized options: no executor). */
  memset(&options, 0, sizeof(options));
  options.num_threads = 2;
  CHECK(mha_context_create(&options, &own_ctx));
  if (!run(layer, own_ctx, x, &on_own_pool)) goto fail;
  if (memcmp(&on_app_pool, &on_own_pool, sizeof(results)) != 0) {
    fprintf(stderr, "host_pool: the application's pool and mha's own pool disagree\n");
    goto fail;
  }
  printf("outputs bitwise identical to mha's own pool; output[0][0][0..3] = %.6f %.6f %.6f %.6f\n",
         on_app_pool.output[0], on_app_pool.output[1], on_app_pool.output[2],
         on_app_pool.output[3]);
  rc = 0;
fail:
  mha_context_destroy(own_ctx);
  mha_context_destroy(app_ctx);
  mha_layer_destroy(layer);
  app_pool_stop(&pool);
  return rc;
}
