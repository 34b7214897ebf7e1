// The multi-head attention operator's public methods: create (layer_weights), plan (validate,
// then forward_plan from the shapes alone) and forward (validate -> plan -> bind the workspace
// -> projections -> attention tasks, or the key-chunked path -> output projection). The data
// flow and the rooms are drawn in runtime/README.md. Every partition depends on the shapes
// only, so results are bitwise identical for any thread count.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/targets.h"
#include "mha/mha.hpp"
#include "runtime/arena.h"
#include "runtime/attention_impl.h"
#include "runtime/attention_tasks.h"
#include "runtime/batch_groups.h"
#include "runtime/context_internal.h"
#include "runtime/forward_plan.h"
#include "runtime/key_chunks.h"
#include "runtime/layer_weights.h"
#include "runtime/projections.h"
#include "runtime/qk_transform.h"
#include "runtime/validate.h"
#include "runtime/weights.h"

namespace mha {

struct MultiheadAttention::Impl : LayerWeights {
  // What viewed weights live in (CreateKeepingAlive: a mapped checkpoint), released with the
  // layer.
  std::shared_ptr<const void> keep_alive;
};

MultiheadAttention::MultiheadAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MultiheadAttention::~MultiheadAttention() = default;
const AttentionConfig& MultiheadAttention::config() const { return impl_->config; }
const LayerWeights& LayerWeightsOf(const MultiheadAttention& layer) { return ImplOf(layer); }
int64_t MultiheadAttention::head_dim() const { return impl_->hd; }

Status MultiheadAttention::Create(const AttentionConfig& config, const AttentionWeights& weights,
                                  WeightBinding binding, std::unique_ptr<MultiheadAttention>* out) {
  if (out == nullptr) return InvalidArgument("MultiheadAttention::Create: out is null");
  // MHA_TARGETS (kernels/targets.h) holds from the first layer on: its conversions and packing
  // dispatch.
  kernels::TargetsFromEnvironment();
  auto impl = std::make_unique<Impl>();
  const Status s = BindLayerWeights(config, weights, binding, impl.get());
  if (!s.ok()) return s;
  out->reset(new MultiheadAttention(std::move(impl)));
  return Status::Ok();
}

Status CreateKeepingAlive(const AttentionConfig& config, const AttentionWeights& weights,
                          WeightBinding binding, std::shared_ptr<const void> keep_alive,
                          std::unique_ptr<MultiheadAttention>* out) {
  std::unique_ptr<MultiheadAttention> layer;
  const Status s = MultiheadAttention::Create(config, weights, binding, &layer);
  if (!s.ok()) return s;
  InternalAccess::Of(*layer).keep_alive = std::move(keep_alive);
  *out = std::move(layer);
  return Status::Ok();
}

Status MultiheadAttention::Plan(const AttentionInputs& inputs, const AttentionOutputs& outputs,
                                size_t num_threads, size_t* workspace_bytes) const {
  if (workspace_bytes == nullptr) return InvalidArgument("Plan: workspace_bytes is null");
  ForwardArgs args;
  const Status s = ValidateForward(*impl_, inputs, &outputs, &args);
  if (!s.ok()) return s;
  *workspace_bytes =
      ArenaBytesFor(PlanForwardBound(*impl_, args.shapes, std::max<size_t>(num_threads, 1)));
  return Status::Ok();
}

Status ForwardPlanForTesting(const MultiheadAttention& layer, const AttentionInputs& inputs,
                             const AttentionOutputs& outputs, size_t num_threads,
                             ForwardPlan* plan) {
  ForwardArgs args;
  const Status s = ValidateForward(ImplOf(layer), inputs, &outputs, &args);
  if (!s.ok()) return s;
  *plan = PlanForward(ImplOf(layer), args.shapes, args.aliasing, std::max<size_t>(num_threads, 1),
                      CurrentBatchGrouping());
  return Status::Ok();
}

Status ForwardPlanForTesting(const MultiheadAttention& layer, const Context& context,
                             const AttentionInputs& inputs, const AttentionOutputs& outputs,
                             ForwardPlan* plan) {
  ForwardArgs args;
  const Status s = ValidateForward(ImplOf(layer), inputs, &outputs, &args);
  if (!s.ok()) return s;
  *plan = PlanForward(ImplOf(layer), args.shapes, args.aliasing, context.num_threads(),
                      GroupingOf(context));
  return Status::Ok();
}

Status ForwardWorkspaceBytesForTesting(const MultiheadAttention& layer,
                                       const AttentionInputs& inputs,
                                       const AttentionOutputs& outputs, size_t num_threads,
                                       size_t* bytes) {
  ForwardPlan plan;
  const Status s = ForwardPlanForTesting(layer, inputs, outputs, num_threads, &plan);
  if (s.ok()) *bytes = plan.total;
  return s;
}

Status ForwardBatchGroupForTesting(const MultiheadAttention& layer, const AttentionInputs& inputs,
                                   const AttentionOutputs& outputs, size_t num_threads,
                                   size_t* batch_group) {
  ForwardPlan plan;
  const Status s = ForwardPlanForTesting(layer, inputs, outputs, num_threads, &plan);
  if (s.ok()) *batch_group = plan.batch_group;
  return s;
}

namespace {

// Forward's body; `sink` (optional) gets the projected keys and values.
Status RunForward(const LayerWeights& m, Context& ctx, const AttentionInputs& inputs,
                  const AttentionOutputs& outputs, KvSinkFn sink, void* user) {
  ForwardArgs args;
  Status s = ValidateForward(m, inputs, &outputs, &args);
  if (!s.ok()) return s;
  // The plan of these shapes on this context: made once, then reused (plan_cache.h).
  ForwardPlanKey key;
  key.layer = m.id;
  key.epoch = PlanSettingsEpoch();
  key.shapes = args.shapes;
  key.aliasing = args.aliasing;
  key.threads = ctx.num_threads();
  // A prefill's keys and values go to the sink before attention reads them: stage by stage.
  if (sink == nullptr) key.grouping = GroupingOf(ctx);
  const ForwardPlan& plan = ForwardPlansOf(ctx).Get(
      key, [&] { return PlanForward(m, args.shapes, args.aliasing, key.threads, key.grouping); });
  uint8_t* base = nullptr;
  s = TakeWorkspace(ctx, plan.total, "forward workspace", &base);
  if (!s.ok()) return s;
  ForwardBuffers buf = BindForwardPlan(plan, m, args, base);

  FillPositions(args, buf.q_pos, buf.k_pos);
  buf.rope_len = RopeCallLength(m, args.shapes, buf.q_pos, buf.k_pos);
  if (plan.batch_group > 0) {
    RunBatchGroups(ctx, m, args, plan, buf);
    return TakeDispatchError(ctx);
  }
  RunInputProjections(ctx, m, args, plan, buf, nullptr);
  // QK-norm and RoPE before anything reads Q or K (the sink stores rotated keys).
  RunForwardQkTransform(ctx, m, args, plan, buf, nullptr);
  if (plan.chunked()) {
    RunKeyChunks(ctx, m, args, plan, buf, sink, user);
    return TakeDispatchError(ctx);
  }
  const ForwardShapes& sh = args.shapes;
  SinkProjectedKv(ctx, plan, buf, 0, sh.S, sink, user);
  RunAttentionTasks(ctx, m, args, plan, buf, KeyChunk{0, sh.St, true});
  const GemmJob job =
      OutputProjectionJob(m, buf.concat, buf.concat_layout, args.out, sh.out_layout, sh.N, sh.L);
  ParallelGemm(PoolOf(ctx), &job, 1, buf.scratch, plan.scratch_per_worker, Bf16KernelOf(ctx),
               TraceOf(ctx), buf.packed_w, plan.packed_w_bytes);
  return TakeDispatchError(ctx);
}

}  // namespace

Status MultiheadAttention::Forward(Context& ctx, const AttentionInputs& inputs,
                                   const AttentionOutputs& outputs) const {
  return RunForward(*impl_, ctx, inputs, outputs, nullptr, nullptr);
}

Status ForwardWithKvSink(const MultiheadAttention& layer, Context& ctx,
                         const AttentionInputs& inputs, const AttentionOutputs& outputs,
                         KvSinkFn sink, void* user) {
  return RunForward(ImplOf(layer), ctx, inputs, outputs, sink, user);
}

Status MultiheadAttention::PlanProject(const AttentionInputs& inputs,
                                       const ProjectionOutputs& outputs, size_t num_threads,
                                       size_t* workspace_bytes) const {
  if (workspace_bytes == nullptr) return InvalidArgument("PlanProject: workspace_bytes is null");
  ForwardArgs args;
  const Status s = ValidateProject(*impl_, inputs, outputs, &args);
  if (!s.ok()) return s;
  *workspace_bytes = ArenaBytesFor(PlanProjectWorkspace(*impl_, args.shapes, num_threads).total);
  return Status::Ok();
}

Status MultiheadAttention::Project(Context& ctx, const AttentionInputs& inputs,
                                   const ProjectionOutputs& outputs) const {
  ForwardArgs args;
  Status s = ValidateProject(*impl_, inputs, outputs, &args);
  if (!s.ok()) return s;
  const ProjectPlan plan = PlanProjectWorkspace(*impl_, args.shapes, ctx.num_threads());
  uint8_t* base = nullptr;
  s = TakeWorkspace(ctx, plan.total, "projection workspace", &base);
  if (!s.ok()) return s;
  RunHeadProjections(ctx, *impl_, args, outputs, base, plan.scratch_per_worker);
  int32_t* q_pos = nullptr;
  int32_t* k_pos = nullptr;
  if (args.shapes.has_positions) {
    q_pos = reinterpret_cast<int32_t*>(base + plan.q_pos);
    k_pos = reinterpret_cast<int32_t*>(base + plan.k_pos);
    FillPositions(args, q_pos, k_pos);
  }
  // q and k as attention uses them: QK-norm and RoPE applied (ProjectionOutputs).
  RunProjectQkTransform(ctx, *impl_, args, outputs, q_pos, k_pos, base + plan.qk_scratch);
  return TakeDispatchError(ctx);
}

// ---------------------------------------------------------------------------------------------
// Loading from a safetensors file (the operator's entry; the parsing is runtime/weights.cc, which
// the fuzzer builds on its own).

Status MultiheadAttention::CreateFromSafeTensors(const std::string& path, const std::string& prefix,
                                                 const LoadOptions& options,
                                                 std::unique_ptr<MultiheadAttention>* out) {
  if (out == nullptr) return InvalidArgument("CreateFromSafeTensors: out is null");
  if (options.num_heads <= 0) {
    return InvalidArgument("options.num_heads: expected > 0, got " +
                           std::to_string(options.num_heads));
  }
  const DType st = options.weight_dtype;
  if (st != DType::kF32 && st != DType::kBF16 && st != DType::kF16 && !IsQuantized(st)) {
    return InvalidArgument(
        std::string("options.weight_dtype: expected F32, BF16, F16, I8 or I4, got ") +
        DTypeName(st));
  }
  if (options.num_kv_heads < 0) {
    return InvalidArgument("options.num_kv_heads: expected >= 0 (0 = from the file), got " +
                           std::to_string(options.num_kv_heads));
  }
  SafeTensorsFile file;
  Status s = SafeTensorsFile::Open(path, &file);
  if (!s.ok()) return s;
  MhaWeights mw;
  s = LoadMhaWeights(file, prefix, &mw, st);
  if (!s.ok()) return s;
  const std::string where = path + " (prefix \"" + prefix + "\"): ";
  // Grouped-query layers: k/v have kvE = num_kv_heads * head_dim rows.
  int64_t kv_heads = options.num_heads;
  if (mw.kv_rows != mw.embed_dim) {
    const int64_t hd = mw.embed_dim % options.num_heads == 0 ? mw.embed_dim / options.num_heads : 0;
    if (hd == 0 || mw.kv_rows % hd != 0) {
      return FormatError(where + "tensor '" + prefix + "k_proj_weight': expected a multiple of " +
                         "head_dim (embed_dim " + std::to_string(mw.embed_dim) + " / num_heads " +
                         std::to_string(options.num_heads) + ") rows, got " +
                         std::to_string(mw.kv_rows));
    }
    kv_heads = mw.kv_rows / hd;
  }
  if (options.num_kv_heads != 0 && options.num_kv_heads != kv_heads) {
    return InvalidArgument(where + "options.num_kv_heads: expected " + std::to_string(kv_heads) +
                           " (k_proj_weight has " + std::to_string(mw.kv_rows) +
                           " rows) or 0, got " + std::to_string(options.num_kv_heads));
  }

  AttentionConfig c;
  c.embed_dim = mw.embed_dim;
  c.num_heads = options.num_heads;
  c.num_kv_heads = kv_heads;
  c.q_dim = mw.q_dim;
  c.kdim = mw.kdim;
  c.vdim = mw.vdim;
  c.bias = mw.bias;
  c.add_bias_kv = mw.add_bias_kv;
  c.add_zero_attn = options.add_zero_attn;
  c.batch_first = options.batch_first;
  c.scale = options.scale;
  c.weight_dtype = st;
  c.weight_block = options.weight_block;
  c.prepack = options.prepack;
  c.compute = options.compute;

  // Every weight matrix in one dtype `src`: the storage dtype, whose 16-bit tensors the loader
  // kept as they are (the others, f32 or the other 16-bit type, are converted here); for
  // quantized storage the tensors' own dtype when they share one (Create quantizes them row by
  // row), else f32.
  DType src = st;
  if (IsQuantized(st)) {
    src = mw.w_out.dtype;
    for (const WeightTensor* t : {&mw.in_proj_weight, &mw.w_q, &mw.w_k, &mw.w_v}) {
      if (t->size() != 0 && t->dtype != src) src = DType::kF32;
    }
  }
  std::vector<std::vector<uint8_t>> converted;
  auto as_storage = [&](const WeightTensor& t) -> const void* {
    if (t.dtype == src) return t.data();
    converted.emplace_back(t.size() * DTypeSize(src));
    ConvertElements(t.data(), t.dtype, converted.back().data(), src, t.size());
    return converted.back().data();
  };
  converted.reserve(5);
  AttentionWeights w;
  w.dtype = src;
  // Separate projections keep PyTorch's one in_proj_bias [E + 2 kvE] in q, k, v order.
  std::vector<float> bias_qkv;
  w.qkv_layout = options.qkv_layout;
  if (mw.packed_in_proj) {
    w.in_proj_weight = as_storage(mw.in_proj_weight);
    if (mw.bias) w.in_proj_bias = mw.in_proj_bias.data();
  } else {
    w.q_proj_weight = as_storage(mw.w_q);
    w.k_proj_weight = as_storage(mw.w_k);
    w.v_proj_weight = as_storage(mw.w_v);
    if (mw.bias) {
      bias_qkv = mw.b_q;
      bias_qkv.insert(bias_qkv.end(), mw.b_k.begin(), mw.b_k.end());
      bias_qkv.insert(bias_qkv.end(), mw.b_v.begin(), mw.b_v.end());
      w.in_proj_bias = bias_qkv.data();
    }
  }
  if (mw.add_bias_kv) {
    w.bias_k = mw.bias_k.data();
    w.bias_v = mw.bias_v.data();
  }
  w.out_proj_weight = as_storage(mw.w_out);
  if (mw.bias) w.out_proj_bias = mw.b_out.data();
  VariantTensors variants;
  s = LoadVariants(file, prefix, options, &variants, &c, &w);
  if (!s.ok()) return s;
  // Copy: the loaded vectors are freed when this call returns.
  s = Create(c, w, WeightBinding::kCopy, out);
  if (!s.ok()) return Status(s.code(), where + s.message());
  return Status::Ok();
}

}  // namespace mha
