// mha-bench's decode and prefill cases (tools/bench_decode.h).
#include "tools/bench_decode.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/quant.h"
#include "mha/kv_cache.hpp"
#include "runtime/context_internal.h"
#include "runtime/layer_weights.h"
#include "runtime/trace.h"
#include "tools/bench_output.h"
#include "tools/bench_workload.h"
#include "tools/weights_dtype.h"

namespace mha {
namespace bench {

namespace {

// Rounds *w to `dtype` (bf16 or f16, nearest even, as a kCopy layer stores it) and back to f32.
void RoundWeights(DType dtype, std::vector<float>* w) {
  std::vector<uint16_t> bits(w->size());
  if (dtype == DType::kBF16) {
    kernels::F32ToBF16(w->data(), bits.data(), w->size());
    kernels::BF16ToF32(bits.data(), w->data(), w->size());
  } else {
    kernels::F32ToF16(w->data(), bits.data(), w->size());
    kernels::F16ToF32(bits.data(), w->data(), w->size());
  }
}

// Replaces each row of a quantized layer's matrix ([rows, w->size() / rows]) by its dequantized
// weights (kernels/quant.h), the values the layer multiplies.
void DequantizeWeights(DType dtype, size_t block, int64_t rows, std::vector<float>* w) {
  const size_t in = w->size() / static_cast<size_t>(rows);
  std::vector<uint8_t> codes(kernels::QuantRowBytes(dtype, block, in));
  std::vector<float> scales(kernels::QuantScalesPerRow(dtype, block, in));
  const kernels::QuantMatrix row{codes.data(), scales.data(), dtype,        block, 1,
                                 in,           codes.size(),  scales.size()};
  for (int64_t r = 0; r < rows; ++r) {
    float* x = w->data() + static_cast<size_t>(r) * in;
    kernels::QuantizeRow(x, in, dtype, block, codes.data(), scales.data());
    for (size_t p = 0; p < in; ++p) x[p] = kernels::DequantizedWeight(row, 0, p);
  }
}

// Bytes of a rows x in weight matrix as the layer's products stream it: in its storage dtype,
// its bf16 packing with bf16 compute, quantized: codes and f32 scales.
double MatrixBytes(const AttentionConfig& c, int64_t rows, int64_t in) {
  const double n = static_cast<double>(rows);
  if (c.compute == Compute::kBF16) return 2.0 * n * static_cast<double>(in);
  if (IsQuantized(c.weight_dtype)) {
    const size_t block = static_cast<size_t>(c.weight_block);
    const size_t i = static_cast<size_t>(in);
    return n * static_cast<double>(kernels::QuantRowBytes(c.weight_dtype, block, i) +
                                   4 * kernels::QuantScalesPerRow(c.weight_dtype, block, i));
  }
  return n * static_cast<double>(in) * static_cast<double>(DTypeSize(c.weight_dtype));
}

// One peer's result over --rounds: the median of its rounds' medians, the extremes of their
// deciles, the largest error; a peer no round timed keeps the first round's note.
PeerResult CombinePeerRounds(const std::vector<PeerResult>& rounds) {
  std::vector<double> medians;
  PeerResult c;
  for (const PeerResult& p : rounds) {
    if (!p.timed) continue;
    if (!c.timed) {
      c = p;
    } else {
      c.p10_ms = std::min(c.p10_ms, p.p10_ms);
      c.p90_ms = std::max(c.p90_ms, p.p90_ms);
      c.runs += p.runs;
      if (!(p.max_abs_err <= c.max_abs_err)) c.max_abs_err = p.max_abs_err;  // NaN stays
    }
    medians.push_back(p.median_ms);
  }
  if (!c.timed) return rounds.front();
  std::sort(medians.begin(), medians.end());
  c.median_ms = Percentile(medians, 0.5);
  return c;
}

}  // namespace

double CacheRowBytes(DType dtype, int64_t hd) {
  return dtype == DType::kI8 ? static_cast<double>(hd + 4)
                             : static_cast<double>(hd) * static_cast<double>(DTypeSize(dtype));
}

Status MakeDecodeModel(int64_t embed, int64_t heads, int64_t kv_heads, int64_t max_batch,
                       int64_t max_context, uint64_t seed, DType weights, int64_t weight_block,
                       Compute compute, DecodeModel* m) {
  const int64_t E = embed, hd = E / heads, kvE = kv_heads * hd;
  Random rng(seed + static_cast<uint64_t>(kv_heads));
  const float bound = 1.0f / std::sqrt(static_cast<float>(E));
  m->embed = embed;
  m->heads = heads;
  m->kv_heads = kv_heads;
  m->head_dim = hd;
  m->wq.resize(E * E);
  m->wk.resize(kvE * E);
  m->wv.resize(kvE * E);
  m->bias.resize(E + 2 * kvE);
  m->wo.resize(E * E);
  m->bo.resize(E);
  for (auto* w : {&m->wq, &m->wk, &m->wv, &m->bias, &m->wo, &m->bo}) rng.Fill(w, bound);
  const bool quantized = IsQuantized(weights);
  if (weights != DType::kF32 && !quantized) {
    // Biases stay f32 in a 16-bit layer.
    for (auto* w : {&m->wq, &m->wk, &m->wv, &m->wo}) RoundWeights(weights, w);
  }
  AttentionConfig c;
  c.embed_dim = E;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.batch_first = true;
  c.weight_dtype = weights;
  c.weight_block = weight_block;
  c.compute = compute;
  AttentionWeights w;
  w.q_proj_weight = m->wq.data();
  w.k_proj_weight = m->wk.data();
  w.v_proj_weight = m->wv.data();
  w.in_proj_bias = m->bias.data();
  w.out_proj_weight = m->wo.data();
  w.out_proj_bias = m->bo.data();
  m->max_batch = max_batch;
  m->max_context = max_context;
  m->kv.resize(2 * static_cast<size_t>(max_batch * kv_heads * max_context * hd));
  rng.Fill(&m->kv, 1.0f);
  // kCopy: a 16-bit layer stores the (already rounded, so unchanged) weights in 16 bits; a
  // quantized one quantizes them, and the model then keeps their dequantized values.
  const Status st = MultiheadAttention::Create(c, w, WeightBinding::kCopy, &m->layer);
  if (st.ok() && quantized) {
    const size_t block = static_cast<size_t>(m->layer->config().weight_block);
    DequantizeWeights(weights, block, E, &m->wq);
    DequantizeWeights(weights, block, kvE, &m->wk);
    DequantizeWeights(weights, block, kvE, &m->wv);
    DequantizeWeights(weights, block, E, &m->wo);
  }
  return st;
}

void MakeDecodeModelForLayer(std::unique_ptr<MultiheadAttention> layer, int64_t embed,
                             int64_t max_batch, int64_t max_context, uint64_t seed,
                             DecodeModel* m) {
  const AttentionConfig& c = layer->config();
  m->embed = embed;
  m->heads = c.num_heads;
  m->kv_heads = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads;
  m->head_dim = layer->head_dim();
  m->layer = std::move(layer);
  m->max_batch = max_batch;
  m->max_context = max_context;
  Random rng(seed + static_cast<uint64_t>(m->kv_heads));
  m->kv.resize(2 * static_cast<size_t>(max_batch * m->kv_heads * max_context * m->head_dim));
  rng.Fill(&m->kv, 1.0f);
}

DecodeResult RunDecodeCase(const DecodeModel& m, int64_t context, int64_t batch, CacheKind kind,
                           size_t threads, const BenchOptions& o, PeerComparison* peers,
                           const std::function<void(const std::string&)>& status) {
  DecodeResult r;
  r.context = context;
  r.batch = batch;
  r.kv_heads = m.kv_heads;
  const DType dtype = kind.dtype;
  r.dtype = dtype;
  r.int8_attention = kind.int8_attention;
  r.weights = m.layer->config().weight_dtype;
  r.weight_block = m.layer->config().weight_block;
  r.threads = threads;
  r.embed = m.embed;
  r.heads = m.heads;
  r.head_dim = m.head_dim;
  const int64_t E = m.embed, hd = m.head_dim, kvh = m.kv_heads, A = m.heads * hd;
  // Cached positions: context - 1 per entry, from the model's random keys/values (a strided view
  // of them).
  const int64_t prior = context - 1;
  const int64_t batch_stride = kvh * m.max_context * hd, head_stride = m.max_context * hd;
  const float* keys = m.kv.data();
  const float* values = keys + m.kv.size() / 2;
  std::vector<float> x(batch * E), out(batch * E);
  Random rng(o.seed);
  rng.Fill(&x, 1.0f);
  const int64_t xs[3] = {batch, 1, E};
  TensorView xv, ov;
  Status st = TensorView::Dense(x.data(), DType::kF32, 3, xs, &xv, "x");
  if (st.ok()) st = TensorView::Dense(out.data(), DType::kF32, 3, xs, &ov, "output");
  std::unique_ptr<Context> ctx;
  std::unique_ptr<KvCache> cache;
  const auto rewind = [&]() -> Status {
    Status s;
    for (int64_t n = 0; n < batch && s.ok(); ++n) s = cache->Truncate(n, prior);
    return s;
  };
  // The context and the filled cache, with two untimed steps: the arena grows to the plan,
  // caches and pages settle.
  const auto prepare = [&]() -> Status {
    ContextOptions co;
    co.num_threads = threads;
    Status s = Context::Create(co, &ctx);
    if (s.ok()) {
      KvCacheOptions co = KvCacheOptions::ForLayer(*m.layer, batch, context, dtype);
      co.int8_attention = kind.int8_attention;
      s = KvCache::Create(co, &cache);
    }
    if (s.ok() && prior > 0) {
      const int64_t shape[4] = {batch, kvh, prior, hd};
      const int64_t strides[4] = {batch_stride, head_stride, hd, 1};
      TensorView kt, vt;
      s = TensorView::Strided(const_cast<float*>(keys), DType::kF32, 4, shape, strides, &kt, "k");
      if (s.ok()) {
        s = TensorView::Strided(const_cast<float*>(values), DType::kF32, 4, shape, strides, &vt,
                                "v");
      }
      if (s.ok()) s = cache->AppendProjected(kt, vt);
    }
    for (int i = 0; i < 2 && s.ok(); ++i) {
      s = cache->Step(*ctx, *m.layer, xv, ov);
      if (s.ok()) s = rewind();
    }
    return s;
  };
  if (st.ok()) st = prepare();
  if (!st.ok()) {
    r.error = st.ToString();
    return r;
  }
  // The peers time an f32 cache's step only (the other cache types' rows repeat it).
  const bool with_peers = peers != nullptr && dtype == DType::kF32 && !m.wq.empty();
  DecodePeerCase pc;
  if (with_peers) {
    pc.batch = batch;
    pc.context = context;
    pc.embed = E;
    pc.heads = m.heads;
    pc.kv_heads = kvh;
    pc.q_weight = m.wq.data();
    pc.k_weight = m.wk.data();
    pc.v_weight = m.wv.data();
    pc.in_bias = m.bias.data();
    pc.out_weight = m.wo.data();
    pc.out_bias = m.bo.data();
    pc.keys = keys;
    pc.values = values;
    pc.batch_stride = batch_stride;
    pc.head_stride = head_stride;
    pc.x = x.data();
    // `out` holds the first round's last step: every step attends the same cache and token, and
    // mha's output is the same for any thread count.
    pc.output = out.data();
    const AttentionConfig& lc = m.layer->config();
    if (IsQuantized(lc.weight_dtype)) {
      pc.quantized = WeightsDtypeName(lc.weight_dtype, lc.weight_block);
    }
  }
  // --rounds N (default 1): mha's step for 1/N of --min-time and --min-runs, then each peer's
  // for the same share, N times. A shared machine's bandwidth moves by tens of percent within
  // seconds; a peer timed only after all of mha's runs compares two different machines.
  const int64_t rounds = o.rounds_given ? o.rounds : 1;
  const RoundShare share = RoundShareOf(o, rounds);
  const int64_t round_min_runs = share.min_runs;
  const int64_t round_min_ns = static_cast<int64_t>(share.min_time_s * 1e9);
  const int64_t round_max_runs = std::max<int64_t>(kMaxRuns / rounds, 1);
  std::vector<double> samples_ms, attn_samples_ms, round_ms;
  std::map<std::string, std::vector<PeerResult>> peer_rounds;  // per peer, its rounds' results
  // The attention tasks of one step record events here (at most batch * kv_heads * chunks
  // + batch * heads of them; generously sized, never reallocated while timing).
  TraceRecorder recorder(static_cast<size_t>(4 * batch * m.heads * (context / 64 + 2)));
  for (int64_t round = 0; round < rounds; ++round) {
    if (ctx == nullptr) st = prepare();  // the peers' round released them
    if (!st.ok()) {
      r.error = st.ToString();
      return r;
    }
    SetTrace(*ctx, &recorder);
    round_ms.clear();
    const int64_t start_ns = TraceRecorder::NowNs();
    for (;;) {
      recorder.Clear();
      const int64_t t0 = TraceRecorder::NowNs();
      st = cache->Step(*ctx, *m.layer, xv, ov);
      const int64_t t1 = TraceRecorder::NowNs();
      if (st.ok()) st = rewind();
      if (!st.ok()) {
        r.error = "KvCache::Step: " + st.ToString();
        return r;
      }
      round_ms.push_back(static_cast<double>(t1 - t0) * 1e-6);
      samples_ms.push_back(round_ms.back());
      int64_t first = 0, last = 0;
      for (size_t i = 0; i < recorder.size(); ++i) {
        const TraceEvent& e = recorder.events[i];
        if (e.stage != Stage::kCacheAttention) continue;
        first = first == 0 ? e.begin_ns : std::min(first, e.begin_ns);
        last = std::max(last, e.end_ns);
      }
      attn_samples_ms.push_back(static_cast<double>(last - first) * 1e-6);
      const int64_t runs = static_cast<int64_t>(round_ms.size());
      if ((runs >= round_min_runs && t1 - start_ns >= round_min_ns) || runs >= round_max_runs) {
        break;
      }
    }
    SetTrace(*ctx, nullptr);
    std::sort(round_ms.begin(), round_ms.end());
    r.rounds.push_back({Percentile(round_ms, 0.5), {}});
    if (!with_peers) continue;
    // mha's threads and cache go first: the peers get the machine as mha had it.
    ctx.reset();
    cache.reset();
    if (round == 0) peers->WriteDecode(pc);
    std::map<std::string, PeerResult> got;
    peers->TimeDecode(pc, threads, rounds, status, &got);
    for (auto& [name, p] : got) {
      if (p.timed) r.rounds.back().peer_ms[name] = p.median_ms;
      peer_rounds[name].push_back(std::move(p));
    }
  }
  r.runs = static_cast<int64_t>(samples_ms.size());
  std::sort(samples_ms.begin(), samples_ms.end());
  r.median_ms = Percentile(samples_ms, 0.5);
  r.p10_ms = Percentile(samples_ms, 0.1);
  r.p90_ms = Percentile(samples_ms, 0.9);
  std::sort(attn_samples_ms.begin(), attn_samples_ms.end());
  r.attn_ms = Percentile(attn_samples_ms, 0.5);
  const double sec = r.median_ms * 1e-3;
  r.tokens_per_s = static_cast<double>(batch) / sec;
  r.cache_bytes = 2.0 * static_cast<double>(batch * kvh * context) * CacheRowBytes(dtype, hd);
  // The weights a step streams: as stored, or their bf16 packing with bf16 compute; q_proj
  // [A, E], k/v_proj [kvh * hd, E], o_proj [E, A].
  const AttentionConfig& c = m.layer->config();
  r.weight_bytes = MatrixBytes(c, A, E) + MatrixBytes(c, E, A) + 2 * MatrixBytes(c, kvh * hd, E);
  r.cache_gbs = r.cache_bytes / sec * 1e-9;
  r.attn_gbs = r.attn_ms > 0 ? r.cache_bytes / (r.attn_ms * 1e-3) * 1e-9 : 0.0;
  r.total_gbs = (r.cache_bytes + r.weight_bytes) / sec * 1e-9;
  for (auto& [name, results] : peer_rounds) r.peers[name] = CombinePeerRounds(results);
  return r;
}

PrefillResult RunPrefillCase(const DecodeModel& m, int64_t tokens, int64_t batch, size_t threads,
                             const BenchOptions& o) {
  PrefillResult r;
  r.tokens = tokens;
  r.batch = batch;
  r.embed = m.embed;
  r.heads = m.heads;
  r.kv_heads = m.kv_heads;
  r.threads = threads;
  const int64_t E = m.embed;
  ContextOptions co;
  co.num_threads = threads;
  std::unique_ptr<Context> ctx;
  Status st = Context::Create(co, &ctx);
  std::unique_ptr<KvCache> cache;
  if (st.ok()) {
    st = KvCache::Create(KvCacheOptions::ForLayer(*m.layer, batch, tokens, DType::kF32), &cache);
  }
  const size_t n = static_cast<size_t>(batch * tokens * E);
  std::vector<float> x(n), step_out(n), forward_out(n);
  Random rng(o.seed);
  rng.Fill(&x, 1.0f);
  const int64_t shape[3] = {batch, tokens, E};
  AttentionInputs in;
  in.causal = true;
  AttentionOutputs forward_outputs;
  TensorView step_view;
  if (st.ok()) st = TensorView::Dense(x.data(), DType::kF32, 3, shape, &in.query, "x");
  if (st.ok()) {
    st = TensorView::Dense(step_out.data(), DType::kF32, 3, shape, &step_view, "step output");
  }
  if (st.ok()) {
    st = TensorView::Dense(forward_out.data(), DType::kF32, 3, shape, &forward_outputs.output,
                           "forward output");
  }
  // One call of either; the step always starts from an empty cache.
  const char* op = "prefill";
  const auto call = [&](bool step) {
    op = step ? "KvCache::Step" : "MultiheadAttention::Forward";
    if (!step) return m.layer->Forward(*ctx, in, forward_outputs);
    cache->Reset();
    return cache->Step(*ctx, *m.layer, in.query, step_view);
  };
  // Warm-up, one of each: the arena grows to the larger plan, pages settle.
  if (st.ok()) st = call(true);
  if (st.ok()) st = call(false);
  std::vector<double> step_ms, forward_ms;
  const int64_t min_time_ns = static_cast<int64_t>(o.min_time_s * 1e9);
  const int64_t start_ns = TraceRecorder::NowNs();
  for (int64_t run = 0; st.ok(); ++run) {
    // A/B alternating: the step first on even runs, the forward first on odd ones, so that
    // neither always follows the other (warm caches, the machine's drift within seconds).
    for (int k = 0; k < 2 && st.ok(); ++k) {
      const bool step = (k == 0) == (run % 2 == 0);
      const int64_t t0 = TraceRecorder::NowNs();
      st = call(step);
      (step ? step_ms : forward_ms)
          .push_back(static_cast<double>(TraceRecorder::NowNs() - t0) * 1e-6);
    }
    const int64_t runs = run + 1;
    if ((runs >= o.min_runs && TraceRecorder::NowNs() - start_ns >= min_time_ns) ||
        runs >= kMaxRuns) {
      break;
    }
  }
  if (!st.ok()) {
    r.error = std::string(op) + ": " + st.ToString();
    return r;
  }
  r.runs = static_cast<int64_t>(step_ms.size());
  std::sort(step_ms.begin(), step_ms.end());
  std::sort(forward_ms.begin(), forward_ms.end());
  r.step_ms = Percentile(step_ms, 0.5);
  r.step_p10_ms = Percentile(step_ms, 0.1);
  r.step_p90_ms = Percentile(step_ms, 0.9);
  r.forward_ms = Percentile(forward_ms, 0.5);
  r.forward_p10_ms = Percentile(forward_ms, 0.1);
  r.forward_p90_ms = Percentile(forward_ms, 0.9);
  for (size_t i = 0; i < n; ++i) {
    r.max_abs_diff =
        std::max(r.max_abs_diff, static_cast<double>(std::fabs(step_out[i] - forward_out[i])));
  }
  return r;
}

}  // namespace bench
}  // namespace mha
