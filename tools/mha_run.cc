// mha-run: one attention forward pass (eval mode) from safetensors files: an
// nn.MultiheadAttention state_dict, or one attention layer of a Hugging Face checkpoint folder.
//
//   mha-run --hf DIR (--layer I | --prefix P) --inputs I.safetensors --output O.safetensors
//           [--weights-dtype T] [--compute f32|bf16|int8] [--kv-dtype T] [--threads N]
//           [--need-weights] [--no-average-weights] [--weights-png FILE]
//   mha-run --weights W.safetensors [--prefix P] --num-heads H --inputs I.safetensors
//           --output O.safetensors [--batch-first] [--need-weights] [--no-average-weights]
//           [--causal] [--add-zero-attn] [--qkv-layout pytorch|per-head] [--kv-heads K]
//           [--scale F] [--weights-dtype f32|bf16|f16|i8|i4|i4-128] [--compute f32|bf16|int8]
//           [--kv-dtype f32|bf16|f16|int8|int8dot] [--kv-ring]
//           [--rope neox|gptj] [--rope-theta F] [--rotary-dim N] [--rope-scale F] [--alibi]
//           [--window W] [--softcap F] [--qk-norm-eps F] [--qk-norm-add-one] [--threads N]
//           [--weights-png FILE] [--version] [--help]
//
// With --kv-dtype the query is decoded token by token through a KV cache of that storage type
// (self-attention, causal), as an application generating text would run the layer.
//
// --hf reads everything from the checkpoint's config.json (MultiheadAttention::
// CreateFromHuggingFace): inputs are batch-first, `query` [N, L, hidden], optional `positions`
// [N, L], `key_padding_mask` [N, L] and, for a cross-attention module (--prefix of Whisper's
// encoder_attn), `key` [N, S, hidden] (ignored by a self-attention module, so that one inputs
// file serves every module); a decoder's self-attention runs causal. The flags that
// would restate the config (--num-heads, the variants, --causal, ...) are refused with it.
//
// Weights are read by state_dict name (MultiheadAttention::CreateFromSafeTensors, with the
// variants' `sinks`, `alibi_slopes`, `q_norm.weight`, `k_norm.weight`); inputs by name: `query`,
// optional `key` and `value`, `attn_mask`, `key_padding_mask`, and the int32/int64 `positions`
// and `key_positions`. Other tensors in either file are ignored,
// so one file may hold weights, inputs and expected outputs (tests/data/golden/). The output
// file holds `attn_output` and, with --need-weights, `attn_output_weights`.
//
// Errors: exit code 1 (run failed) or 2 (bad command line), one line on stderr, and no output
// file left behind: the safetensors writer and the PNG writer both write a temporary file and
// rename it into place only when everything succeeded.
//
// The command line is parsed by hand (as mha-bench's is) rather than with CLI11: the tool needs a
// dozen flags, and a small parser keeps mha-run buildable wherever the library builds (no extra
// package), with error lines and exit codes in the project's format.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "runtime/safetensors.h"
#include "tools/variant_flags.h"
#include "tools/weights_dtype.h"

#ifdef MHA_HAVE_PNG
#include <png.h>

#include <csetjmp>
#endif

namespace mha {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // a file could not be read or written, or the forward failed
constexpr int kExitUsage = 2;    // bad command line

const char kHelp[] =
    "usage: mha-run --hf DIR (--layer I | --prefix P) --inputs I.safetensors\n"
    "               --output O.safetensors [options]\n"
    "       mha-run --weights W.safetensors [--prefix P] --num-heads H\n"
    "               --inputs I.safetensors --output O.safetensors [options]\n"
    "\n"
    "Runs one attention forward pass (eval mode) with mha: of a Hugging Face checkpoint's\n"
    "layer, or of a torch.nn.MultiheadAttention state_dict.\n"
    "\n"
    "  --hf DIR              a Hugging Face checkpoint folder (config.json and\n"
    "                        model.safetensors or a sharded index); every setting comes\n"
    "                        from config.json (README \"Hugging Face checkpoints\")\n"
    "  --layer I             with --hf: layer I's self-attention (the decoder's in an\n"
    "                        encoder-decoder model), causal in a decoder\n"
    "  --prefix P            with --hf: the attention module by state_dict prefix, e.g.\n"
    "                        'model.decoder.layers.0.encoder_attn.' (cross-attention:\n"
    "                        the inputs hold 'key' [N, S, hidden]). Inputs with --hf are\n"
    "                        batch-first: 'query' [N, L, hidden], optional 'positions'\n"
    "                        [N, L] and 'key_padding_mask' [N, L]\n"
    "\n"
    "  --weights FILE        safetensors file with the module's state_dict tensors\n"
    "                        (in_proj_weight or q/k/v_proj_weight, in_proj_bias,\n"
    "                        out_proj.weight, out_proj.bias, bias_k, bias_v; F32/F16/BF16)\n"
    "                        and, when present, the attention variants' sinks [H],\n"
    "                        alibi_slopes [H] (turns ALiBi on), q_norm.weight and\n"
    "                        k_norm.weight ([head_dim] per head, or [E] and [kvE])\n"
    "  --prefix P            name prefix of those tensors, e.g. 'encoder.layers.0.self_attn.'\n"
    "  --num-heads H         number of heads (must divide embed_dim)\n"
    "  --inputs FILE         safetensors file with 'query' and optional 'key', 'value'\n"
    "                        (absent: self-attention; 'value' absent: value = key),\n"
    "                        'attn_mask' [L, S] or [N*H, L, S] and 'key_padding_mask' [N, S]\n"
    "                        (BOOL/U8: nonzero = masked; F32: added to the scores),\n"
    "                        'positions' [N, L] or [L] and 'key_positions' [N, S] or [S]\n"
    "                        (I32/I64 token positions for RoPE, ALiBi and --window;\n"
    "                        default 0..L-1, keys as the queries in self-attention)\n"
    "                        query [L, N, E] ([N, L, E] with --batch-first) or [L, E]\n"
    "  --output FILE         safetensors file to write: 'attn_output' (the query's layout)\n"
    "                        and, with --need-weights, 'attn_output_weights'\n"
    "  --batch-first         batched inputs are [N, L, E] instead of [L, N, E]\n"
    "  --need-weights        also write the attention weights [N, L, S'] (averaged)\n"
    "  --no-average-weights  per-head weights [N, H, L, S'] (needs --need-weights)\n"
    "  --causal              mask key j for query i when j > i (top-left aligned)\n"
    "  --add-zero-attn       append a zero key/value position (the module's add_zero_attn)\n"
    "  --qkv-layout L        row order of a packed in_proj_weight: 'pytorch' (q rows, k rows,\n"
    "                        v rows; default) or 'per-head' (per head: q, k, v rows)\n"
    "  --kv-heads K          key/value heads of a grouped-query layer (k/v_proj_weight with\n"
    "                        K * head_dim rows); default: read from those rows. Given, it\n"
    "                        must agree with them\n"
    "  --weights-dtype T     how the layer stores its weight matrices: f32 (default), bf16\n"
    "                        or f16 (BF16/F16 tensors of that type are used as stored;\n"
    "                        others are rounded, nearest even), or quantized at creation\n"
    "                        from the stored tensors: i8 (a scale per output row), i4 (a\n"
    "                        scale per 32 inputs of a row) or i4-128 (per 128; README\n"
    "                        \"Quantized weights\"). Arithmetic is f32 (bf16 or int8\n"
    "                        with --compute bf16 / int8)\n"
    "  --scale F             score scale (default 1 / sqrt(head_dim))\n"
    "  --compute T           the products' arithmetic: f32 (default) or bf16 (inputs of\n"
    "                        each product rounded to bf16, f32 sums; README \"bf16\n"
    "                        compute\"; --version names the kernel), or int8 with i8/i4\n"
    "                        weights (activations quantized to int8, integer dots)\n"
    "  --kv-dtype T          decode the query one token at a time through a KV cache\n"
    "                        stored as T: f32, bf16, f16 or int8 (per-row scaled codes),\n"
    "                        or int8dot (int8 with integer dot products:\n"
    "                        KvCacheOptions::int8_attention).\n"
    "                        Self-attention, causal (implies --causal); no masks, key,\n"
    "                        value or --need-weights\n"
    "  --kv-ring             with --kv-dtype and --window W: the cache keeps only the\n"
    "                        last W positions (a ring, memory O(W))\n"
    "\n"
    "Attention variants (README \"Attention variants\" gives each formula):\n"
    "  --rope S              rotary embedding of q and k: 'neox' (HF rotate_half: Llama,\n"
    "                        Mistral, Qwen, Gemma) or 'gptj' (interleaved pairs)\n"
    "  --rope-theta F        RoPE base (default 10000)\n"
    "  --rotary-dim N        rotated components per head, even (default head_dim)\n"
    "  --rope-scale F        linear position interpolation: angles use p / F (default 1)\n"
    "  --alibi               ALiBi with the paper's slopes (or the file's alibi_slopes)\n"
    "  --window W            sliding window: with --causal, key j visible to query i iff\n"
    "                        p_i - W < p_j <= p_i (HF sliding_window = W)\n"
    "  --softcap F           scores = F * tanh(scores / F), before masks\n"
    "  --qk-norm-eps F       QK-norm RMSNorm epsilon (default 1e-6)\n"
    "  --qk-norm-add-one     Gemma's norm weights: scale by (1 + w)\n"
    "  --threads N           worker threads including the caller; 0 = all (default)\n"
    "  --weights-png FILE    draw the attention weights as a PNG heatmap (needs\n"
    "                        --need-weights): one panel per batch item and head (one per\n"
    "                        batch item when averaged), each scaled to its own maximum\n"
    "  --version             print the mha version, SIMD target, BLAS architecture and\n"
    "                        the bf16 kernel\n"
    "  --help                print this help\n"
    "\n"
    "A query row with no allowed key gets zero weights and contributes zero (PyTorch: NaN).\n"
    "Exit codes: 0 success, 1 failure (files, shapes, forward), 2 bad command line.\n"
    "Errors print one line on stderr and leave no output file.\n";

// The attention variants' shared flags (tools/variant_flags.h) and mha-run's own.
struct RunOptions : tools::VariantFlags {
  std::string weights, prefix, inputs, output, weights_png;
  int64_t num_heads = 0;
  bool batch_first = false;
  bool need_weights = false;
  bool average_weights = true;
  bool causal = false;
  bool add_zero_attn = false;
  QkvLayout qkv_layout = QkvLayout::kPyTorch;
  DType weights_dtype = DType::kF32;
  int64_t weight_block = 0;  // kI4: inputs per scale (0: 32)
  Compute compute = Compute::kF32;
  bool decode = false;  // --kv-dtype given
  DType kv_dtype = DType::kF32;
  bool kv_int8_attention = false;  // --kv-dtype int8dot
  bool kv_ring = false;
  size_t threads = 0;
  // With the variant flags (kv_heads 0: from the file), LoadOptions' fields of those names.
  float scale = 0.0f;  // score scale; 0 = 1 / sqrt(head_dim)
  bool qk_norm_add_one = false;
  // --hf: a Hugging Face checkpoint folder and the layer whose attention runs (or --prefix).
  std::string hf;
  int64_t layer = -1;
  bool have_prefix = false;
  // Flags given that restate what --hf reads from config.json (refused with --hf).
  std::vector<std::string> config_flags;
};

enum class Action { kRun, kHelp, kVersion };

bool ParseInt(const std::string& text, int64_t lo, int64_t hi, int64_t* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// A finite float > 0 (or >= 0 when `allow_zero`).
bool ParsePositiveFloat(const std::string& text, bool allow_zero, float* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const float v = std::strtof(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v) || v < 0.0f || (v == 0.0f && !allow_zero)) {
    return false;
  }
  *out = v;
  return true;
}

// Parses argv; on error returns InvalidArgument naming the flag, the expected and actual value.
Status ParseArgs(int argc, char** argv, RunOptions* o, Action* action) {
  *action = Action::kRun;
  bool have_heads = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool inline_value = false;
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        inline_value = true;
      }
    }
    auto take = [&](std::string* dst) -> Status {
      if (!inline_value) {
        if (i + 1 >= argc) return InvalidArgument(arg + ": expected a value, got end of arguments");
        value = argv[++i];
      }
      if (value.empty()) return InvalidArgument(arg + ": expected a non-empty value");
      *dst = value;
      return Status::Ok();
    };
    auto flag = [&](bool* dst, bool v) -> Status {
      if (inline_value) return InvalidArgument(arg + ": takes no value, got '" + value + "'");
      *dst = v;
      return Status::Ok();
    };
    Status s;
    std::string text;
    static const char* const kConfigFlags[] = {
        "--num-heads", "--kv-heads",  "--qkv-layout", "--rope",          "--rope-theta",
        "--rope-scale", "--rotary-dim", "--alibi",    "--window",        "--softcap",
        "--qk-norm-eps", "--qk-norm-add-one", "--scale", "--add-zero-attn", "--causal",
        "--batch-first", "--kv-ring"};
    for (const char* f : kConfigFlags) {
      if (arg == f) o->config_flags.push_back(arg);
    }
    if (arg == "--help" || arg == "-h") {
      *action = Action::kHelp;
      return Status::Ok();
    } else if (arg == "--version") {
      *action = Action::kVersion;
      return Status::Ok();
    } else if (arg == "--weights") {
      s = take(&o->weights);
    } else if (arg == "--hf") {
      s = take(&o->hf);
    } else if (arg == "--layer") {
      s = take(&text);
      if (s.ok() && !ParseInt(text, 0, int64_t{1} << 20, &o->layer)) {
        return InvalidArgument("--layer: expected an integer in 0..1048576, got '" + text + "'");
      }
    } else if (arg == "--prefix") {
      o->have_prefix = true;
      if (!inline_value) {
        if (i + 1 >= argc) return InvalidArgument(arg + ": expected a value, got end of arguments");
        value = argv[++i];
      }
      o->prefix = value;  // may be empty
    } else if (arg == "--inputs") {
      s = take(&o->inputs);
    } else if (arg == "--output") {
      s = take(&o->output);
    } else if (arg == "--weights-png") {
      s = take(&o->weights_png);
    } else if (arg == "--num-heads") {
      s = take(&text);
      if (s.ok() && !ParseInt(text, 1, int64_t{1} << 24, &o->num_heads)) {
        return InvalidArgument("--num-heads: expected an integer in 1..16777216, got '" + text +
                               "'");
      }
      have_heads = true;
    } else if (const tools::VariantFlagKind kind = tools::VariantFlagKindOf(arg);
               kind != tools::VariantFlagKind::kNotVariant) {
      if (kind == tools::VariantFlagKind::kTakesValue) {
        s = take(&text);
      } else {
        s = flag(&o->alibi, true);
      }
      std::string error;
      if (s.ok() && !tools::ParseVariantFlag(arg, text, o, &error)) return InvalidArgument(error);
    } else if (arg == "--weights-dtype") {
      s = take(&text);
      if (s.ok() && !ParseWeightsDtype(text, &o->weights_dtype, &o->weight_block)) {
        return InvalidArgument(std::string("--weights-dtype: expected ") + WeightsDtypeNames() +
                               ", got '" + text + "'");
      }
    } else if (arg == "--compute") {
      s = take(&text);
      if (s.ok()) {
        if (text == "f32" || text == "bf16" || text == "int8") {
          o->compute = text == "bf16"   ? Compute::kBF16
                       : text == "int8" ? Compute::kInt8
                                        : Compute::kF32;
        } else {
          return InvalidArgument("--compute: expected 'f32', 'bf16' or 'int8', got '" + text + "'");
        }
      }
    } else if (arg == "--kv-dtype") {
      s = take(&text);
      if (s.ok()) {
        o->decode = true;
        o->causal = true;
        if (text == "f32") {
          o->kv_dtype = DType::kF32;
        } else if (text == "bf16") {
          o->kv_dtype = DType::kBF16;
        } else if (text == "f16") {
          o->kv_dtype = DType::kF16;
        } else if (text == "int8") {
          o->kv_dtype = DType::kI8;
        } else if (text == "int8dot") {
          o->kv_dtype = DType::kI8;
          o->kv_int8_attention = true;
        } else {
          return InvalidArgument(
              "--kv-dtype: expected 'f32', 'bf16', 'f16', 'int8' or 'int8dot', got '" + text + "'");
        }
      }
    } else if (arg == "--scale") {
      s = take(&text);
      if (s.ok() && !ParsePositiveFloat(text, /*allow_zero=*/false, &o->scale)) {
        return InvalidArgument("--scale: expected a finite number > 0, got '" + text + "'");
      }
    } else if (arg == "--qk-norm-add-one") {
      s = flag(&o->qk_norm_add_one, true);
    } else if (arg == "--kv-ring") {
      s = flag(&o->kv_ring, true);
    } else if (arg == "--threads") {
      s = take(&text);
      int64_t t = 0;
      if (s.ok() && !ParseInt(text, 0, 1024, &t)) {
        return InvalidArgument("--threads: expected an integer in 0..1024, got '" + text + "'");
      }
      o->threads = static_cast<size_t>(t);
    } else if (arg == "--qkv-layout") {
      s = take(&text);
      if (s.ok()) {
        if (text == "pytorch") {
          o->qkv_layout = QkvLayout::kPyTorch;
        } else if (text == "per-head" || text == "per_head") {
          o->qkv_layout = QkvLayout::kPerHead;
        } else {
          return InvalidArgument("--qkv-layout: expected 'pytorch' or 'per-head', got '" + text +
                                 "'");
        }
      }
    } else if (arg == "--batch-first") {
      s = flag(&o->batch_first, true);
    } else if (arg == "--need-weights") {
      s = flag(&o->need_weights, true);
    } else if (arg == "--no-average-weights") {
      s = flag(&o->average_weights, false);
    } else if (arg == "--causal") {
      s = flag(&o->causal, true);
    } else if (arg == "--add-zero-attn") {
      s = flag(&o->add_zero_attn, true);
    } else {
      return InvalidArgument("unknown argument '" + arg + "' (see --help)");
    }
    if (!s.ok()) return s;
  }
  if (!o->hf.empty()) {
    if (!o->weights.empty()) {
      return InvalidArgument("--weights: not with --hf (the checkpoint folder holds the weights)");
    }
    if (!o->config_flags.empty()) {
      return InvalidArgument(o->config_flags[0] +
                             ": not with --hf (the checkpoint's config.json decides it)");
    }
    if ((o->layer >= 0) == o->have_prefix) {
      return InvalidArgument(std::string("--layer, --prefix: expected exactly one with --hf, got ") +
                             (o->have_prefix ? "both" : "neither"));
    }
    o->batch_first = true;
  } else if (o->layer >= 0) {
    return InvalidArgument("--layer: needs --hf DIR");
  }
  const std::pair<const std::string*, const char*> required[] = {
      {o->hf.empty() ? &o->weights : &o->hf, "--weights"},
      {&o->inputs, "--inputs"},
      {&o->output, "--output"}};
  for (const auto& r : required) {
    if (r.first->empty()) return InvalidArgument(std::string(r.second) + ": required, not given");
  }
  if (!have_heads && o->hf.empty()) return InvalidArgument("--num-heads: required, not given");
  if (!o->average_weights && !o->need_weights) {
    return InvalidArgument("--no-average-weights: needs --need-weights");
  }
  if (o->kv_ring && (!o->decode || o->window == 0)) {
    return InvalidArgument(
        "--kv-ring: needs --kv-dtype and --window (the ring holds the last "
        "W positions)");
  }
  if (std::string error; !tools::CheckVariantFlags(*o, &error)) return InvalidArgument(error);
  if (!o->weights_png.empty() && !o->need_weights) {
    return InvalidArgument("--weights-png: needs --need-weights (the heatmap draws the weights)");
  }
  if (!o->weights_png.empty() && o->weights_png == o->output) {
    return InvalidArgument("--weights-png: expected a file other than --output, got '" +
                           o->weights_png + "' for both");
  }
  return Status::Ok();
}

// A tensor read from the inputs file, owned, with a view over it.
struct Loaded {
  std::vector<float> f32;
  std::vector<uint8_t> u8;
  std::vector<int64_t> i64;
  TensorView view;
};

std::string Where(const SafeTensorsFile& file, const std::string& name) {
  return "inputs '" + file.path() + "', tensor '" + name + "': ";
}

// Reads tensor `name` (absent: view stays absent) as f32, or for masks also as bool/u8.
Status LoadTensor(const SafeTensorsFile& file, const std::string& name, bool mask, Loaded* out) {
  const TensorInfo* t = file.Find(name);
  if (t == nullptr) return Status::Ok();
  if (t->rank() < 1 || t->rank() > kMaxRank) {
    return InvalidArgument(Where(file, name) + "expected 1 to 4 dimensions, got " +
                           t->ShapeString());
  }
  const bool is_float = t->supported && (t->dtype == DType::kF32 || t->dtype == DType::kF16 ||
                                         t->dtype == DType::kBF16);
  const bool is_byte = t->supported && (t->dtype == DType::kBool || t->dtype == DType::kU8);
  DType dtype = DType::kF32;
  void* data = nullptr;
  Status s;
  if (is_float) {
    s = file.GetF32(name, &out->f32);
    data = out->f32.data();
  } else if (mask && is_byte) {
    s = file.GetBool(name, &out->u8);
    dtype = t->dtype;
    data = out->u8.data();
  } else {
    return InvalidArgument(Where(file, name) + "expected dtype " +
                           (mask ? "BOOL, U8, F32, F16 or BF16" : "F32, F16 or BF16") + ", got " +
                           t->dtype_name);
  }
  if (!s.ok()) return s;
  // Empty tensors have no storage; any non-null address keeps them "present" so the operator
  // reports the empty dimension with the expected shape.
  static uint8_t empty_placeholder[8];
  if (t->num_elements == 0) data = empty_placeholder;
  return TensorView::Dense(data, dtype, t->rank(), t->shape.data(), &out->view, name.c_str(),
                           /*allow_empty=*/true);
}

// Reads the token positions `name` (absent: view stays absent), I32 or I64, as an int64 view.
Status LoadPositions(const SafeTensorsFile& file, const std::string& name, Loaded* out) {
  const TensorInfo* t = file.Find(name);
  if (t == nullptr) return Status::Ok();
  if (!t->supported || (t->dtype != DType::kI32 && t->dtype != DType::kI64)) {
    return InvalidArgument(Where(file, name) + "expected dtype I32 or I64, got " + t->dtype_name);
  }
  if (t->rank() < 1 || t->rank() > 2) {
    return InvalidArgument(Where(file, name) + "expected 1 or 2 dimensions, got " +
                           t->ShapeString());
  }
  Status s = file.GetInt64(name, &out->i64);
  if (!s.ok()) return s;
  static int64_t empty_placeholder[1];
  void* data = t->num_elements == 0 ? empty_placeholder : out->i64.data();
  return TensorView::Dense(data, DType::kI64, t->rank(), t->shape.data(), &out->view, name.c_str(),
                           /*allow_empty=*/true);
}

std::vector<int64_t> ShapeOf(const TensorView& v) {
  return std::vector<int64_t>(v.shape, v.shape + v.rank);
}

#ifdef MHA_HAVE_PNG

// Viridis, sampled at 9 evenly spaced points (matplotlib's colour map), linearly interpolated:
// perceptually uniform and readable in grey scale.
void Viridis(float t, uint8_t rgb[3]) {
  static const uint8_t kStops[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                       {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                       {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
  if (!(t >= 0.0f)) t = 0.0f;  // also maps NaN to the low end
  if (t > 1.0f) t = 1.0f;
  const float x = t * 8.0f;
  const int i = std::min(7, static_cast<int>(x));
  const float f = x - static_cast<float>(i);
  for (int c = 0; c < 3; ++c) {
    rgb[c] =
        static_cast<uint8_t>(std::lround(kStops[i][c] + f * (kStops[i + 1][c] - kStops[i][c])));
  }
}

struct PngFile {
  FILE* f = nullptr;
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngFile() {
    if (png != nullptr) png_destroy_write_struct(&png, info ? &info : nullptr);
    if (f != nullptr) std::fclose(f);
  }
};

// Writes `rows` (height rows of width RGB pixels) to `path`. libpng reports errors by longjmp
// back into this frame (so no destructor is skipped); `p`'s members are not modified after the
// setjmp, so they hold their values when it returns a second time.
Status WritePngRows(const std::string& path, uint32_t width, uint32_t height,
                    const std::vector<png_bytep>& rows) {
  PngFile p;
  p.f = std::fopen(path.c_str(), "wb");
  if (p.f == nullptr) {
    return IoError("--weights-png: cannot create '" + path + "': " + std::strerror(errno));
  }
  p.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  if (p.png != nullptr) p.info = png_create_info_struct(p.png);
  if (p.png == nullptr || p.info == nullptr)
    return OutOfMemory("--weights-png: libpng init failed");
  if (setjmp(png_jmpbuf(p.png))) {
    return IoError("--weights-png: libpng failed writing '" + path + "'");
  }
  png_init_io(p.png, p.f);
  png_set_IHDR(p.png, p.info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(p.png, p.info);
  png_write_image(p.png, const_cast<png_bytepp>(rows.data()));
  png_write_end(p.png, nullptr);
  if (std::fflush(p.f) != 0 || std::ferror(p.f)) {
    return IoError("--weights-png: cannot write '" + path + "': " + std::strerror(errno));
  }
  const int rc = std::fclose(p.f);
  p.f = nullptr;
  if (rc != 0)
    return IoError("--weights-png: cannot write '" + path + "': " + std::strerror(errno));
  return Status::Ok();
}

#endif  // MHA_HAVE_PNG

// Draws the weights [rows_of_panels, cols_of_panels, L, St] (batch items down, heads across) to
// `tmp_path`. Each cell is `cell` pixels square; panels are separated by a 4-pixel grey gap.
Status RenderHeatmap(const std::vector<float>& w, int64_t panel_rows, int64_t panel_cols, int64_t L,
                     int64_t St, const std::string& tmp_path) {
#ifdef MHA_HAVE_PNG
  constexpr int64_t kGap = 4;
  constexpr int64_t kMaxPixels = int64_t{1} << 26;  // 64 Mpixel: a 192 MiB RGB buffer at most
  const int64_t cell = std::max<int64_t>(1, std::min<int64_t>(16, 256 / std::max(L, St)));
  const int64_t width = panel_cols * St * cell + (panel_cols + 1) * kGap;
  const int64_t height = panel_rows * L * cell + (panel_rows + 1) * kGap;
  if (static_cast<double>(width) * static_cast<double>(height) > static_cast<double>(kMaxPixels)) {
    return InvalidArgument("--weights-png: the heatmap would be " + std::to_string(width) + " x " +
                           std::to_string(height) + " pixels, more than the limit of " +
                           std::to_string(kMaxPixels) + "; use fewer heads, batch items or tokens");
  }
  std::vector<uint8_t> image(static_cast<size_t>(width * height * 3), 200);
  for (int64_t pr = 0; pr < panel_rows; ++pr) {
    for (int64_t pc = 0; pc < panel_cols; ++pc) {
      const float* panel = w.data() + (pr * panel_cols + pc) * L * St;
      float max = 0.0f;
      for (int64_t i = 0; i < L * St; ++i) max = std::max(max, panel[i]);
      const float inv = max > 0.0f ? 1.0f / max : 0.0f;
      const int64_t x0 = kGap + pc * (St * cell + kGap);
      const int64_t y0 = kGap + pr * (L * cell + kGap);
      for (int64_t l = 0; l < L; ++l) {
        for (int64_t s = 0; s < St; ++s) {
          uint8_t rgb[3];
          Viridis(panel[l * St + s] * inv, rgb);
          for (int64_t dy = 0; dy < cell; ++dy) {
            uint8_t* px = image.data() + ((y0 + l * cell + dy) * width + x0 + s * cell) * 3;
            for (int64_t dx = 0; dx < cell; ++dx, px += 3) std::memcpy(px, rgb, 3);
          }
        }
      }
    }
  }
  std::vector<png_bytep> rows(static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y) rows[y] = image.data() + y * width * 3;
  return WritePngRows(tmp_path, static_cast<uint32_t>(width), static_cast<uint32_t>(height), rows);
#else
  (void)w, (void)panel_rows, (void)panel_cols, (void)L, (void)St, (void)tmp_path;
  return Unsupported("--weights-png: this mha-run was built without libpng (libpng-dev)");
#endif
}

// --kv-dtype: Step each token of the query [N, L, E] (any layout) through a KV cache, writing
// its output row; the cache takes batch-first [N, 1, E] views at the query's strides.
// Whether `positions` ([N, L] or [L], i32/i64) are 0..L-1 in every entry: the positions the
// KV cache gives its tokens.
bool DefaultPositions(const TensorView& positions) {
  const int64_t L = positions.shape[positions.rank - 1];
  const int64_t rows = positions.rank == 2 ? positions.shape[0] : 1;
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t l = 0; l < L; ++l) {
      const int64_t at = (positions.rank == 2 ? n * positions.strides[0] : 0) +
                         l * positions.strides[positions.rank - 1];
      const int64_t p = positions.dtype == DType::kI32 ? static_cast<const int32_t*>(positions.data)[at]
                                                       : static_cast<const int64_t*>(positions.data)[at];
      if (p != l) return false;
    }
  }
  return true;
}

Status DecodeThroughCache(const MultiheadAttention& layer, Context& ctx, const RunOptions& o,
                          const AttentionInputs& in, const AttentionOutputs& out) {
  const bool other_positions = in.positions.present() && !DefaultPositions(in.positions);
  if (in.key.present() || in.attn_mask.present() || in.key_padding_mask.present() ||
      in.need_weights || other_positions || in.key_positions.present()) {
    return InvalidArgument(
        "--kv-dtype: expected self-attention without masks, positions other than 0..L-1 or "
        "--need-weights (a KV cache decodes causally over its own keys at positions 0, 1, ...), "
        "got " +
        std::string(in.key.present()                                       ? "a 'key' tensor"
                    : in.need_weights                                      ? "--need-weights"
                    : in.positions.present() || in.key_positions.present() ? "a positions tensor"
                                                                           : "a mask tensor"));
  }
  const TensorView& q = in.query;
  const TensorView& y = out.output;
  const bool batched = q.rank == 3;
  const int bdim = o.batch_first ? 0 : 1, tdim = o.batch_first ? 1 : 0;
  const int64_t N = batched ? q.shape[bdim] : 1;
  const int64_t L = batched ? q.shape[tdim] : q.shape[0];
  std::unique_ptr<KvCache> cache;
  // A ring needs only the window's positions, however long the query.
  KvCacheOptions copts = KvCacheOptions::ForLayer(layer, N, o.kv_ring ? o.window : L, o.kv_dtype);
  copts.ring = o.kv_ring;
  copts.int8_attention = o.kv_int8_attention;
  Status s = KvCache::Create(copts, &cache);
  if (!s.ok()) return s;
  auto token = [&](const TensorView& t, int64_t i, TensorView* v) {
    const int64_t shape[3] = {N, 1, t.shape[t.rank - 1]};
    const int64_t tok = batched ? t.strides[tdim] : t.strides[0];
    const int64_t strides[3] = {batched ? t.strides[bdim] : 0, tok, 1};
    return TensorView::Strided(static_cast<float*>(t.data) + i * tok, DType::kF32, 3, shape,
                               strides, v);
  };
  for (int64_t i = 0; i < L; ++i) {
    TensorView x, o_row;
    s = token(q, i, &x);
    if (s.ok()) s = token(y, i, &o_row);
    if (s.ok()) s = cache->Step(ctx, layer, x, o_row);
    if (!s.ok()) return Status(s.code(), "--kv-dtype: " + s.message());
  }
  return Status::Ok();
}

// The flag (with its value) behind an InvalidArgument from the layer's creation: the variant
// setting or tensor the message names, --kv-heads, or else --num-heads.
std::string FlagOf(const RunOptions& o, const std::string& message) {
  auto f = [](float v) {
    char b[32];
    std::snprintf(b, sizeof(b), "%g", v);
    return std::string(b);
  };
  const std::pair<const char*, std::string> named[] = {
      {"num_kv_heads", "--kv-heads " + std::to_string(o.kv_heads)},
      {"rotary_dim", "--rotary-dim " + std::to_string(o.rotary_dim)},
      {"rope_theta", "--rope-theta " + f(o.rope_theta)},
      {"rope_scale", "--rope-scale " + f(o.rope_scale)},
      {"window", "--window " + std::to_string(o.window)},
      {"softcap", "--softcap " + f(o.softcap)},
      {"qk_norm_eps", "--qk-norm-eps " + f(o.qk_norm_eps)},
      {"scale", "--scale " + f(o.scale)},
      {"sinks", "--weights " + o.weights},
      {"alibi_slopes", "--weights " + o.weights},
      {"norm_weight", "--weights " + o.weights},
      {"rope", "--rope"},
      {"alibi", "--alibi"},
  };
  for (const auto& n : named) {
    if (message.find(n.first) != std::string::npos) return n.second;
  }
  return "--num-heads " + std::to_string(o.num_heads);
}

// The layer of a Hugging Face checkpoint (--hf), with what the loader found.
Status CreateHfLayer(const RunOptions& o, std::unique_ptr<MultiheadAttention>* layer,
                     HfLayerInfo* info) {
  HfOptions options;
  options.weight_dtype = o.weights_dtype;
  options.weight_block = o.weight_block;
  options.compute = o.compute;
  options.prefix = o.prefix;
  const Status s = MultiheadAttention::CreateFromHuggingFace(o.hf, o.have_prefix ? 0 : o.layer,
                                                             options, layer, info);
  if (!s.ok()) return Status(s.code(), "--hf " + o.hf + ": " + s.message());
  return s;
}

// The layer of an nn.MultiheadAttention state_dict (--weights).
Status CreateStateDictLayer(const RunOptions& o, std::unique_ptr<MultiheadAttention>* layer) {
  LoadOptions load;
  load.num_heads = o.num_heads;
  load.add_zero_attn = o.add_zero_attn;
  load.batch_first = o.batch_first;
  load.qkv_layout = o.qkv_layout;
  load.num_kv_heads = o.kv_heads;
  load.weight_dtype = o.weights_dtype;
  load.weight_block = o.weight_block;
  load.compute = o.compute;
  load.rope = o.rope;
  load.rope_theta = o.rope_theta;
  load.rotary_dim = o.rotary_dim;
  load.rope_scale = o.rope_scale;
  load.alibi = o.alibi;
  load.window = o.window;
  load.softcap = o.softcap;
  load.qk_norm_eps = o.qk_norm_eps;
  load.qk_norm_add_one = o.qk_norm_add_one;
  load.scale = o.scale;
  const Status s = MultiheadAttention::CreateFromSafeTensors(o.weights, o.prefix, load, layer);
  if (s.code() == StatusCode::kInvalidArgument) {
    return Status(s.code(), FlagOf(o, s.message()) + ": " + s.message());
  }
  return s;
}

Status Run(const RunOptions& o) {
  std::unique_ptr<MultiheadAttention> layer;
  HfLayerInfo hf;
  Status s = o.hf.empty() ? CreateStateDictLayer(o, &layer) : CreateHfLayer(o, &layer, &hf);
  if (!s.ok()) return s;
  const AttentionConfig& config = layer->config();

  SafeTensorsFile inputs_file;
  s = SafeTensorsFile::Open(o.inputs, &inputs_file);
  if (!s.ok()) return s;
  Loaded query, key, value, attn_mask, kpm, positions, key_positions;
  s = LoadTensor(inputs_file, "query", false, &query);
  if (s.ok()) s = LoadTensor(inputs_file, "key", false, &key);
  if (s.ok()) s = LoadTensor(inputs_file, "value", false, &value);
  if (s.ok()) s = LoadTensor(inputs_file, "attn_mask", true, &attn_mask);
  if (s.ok()) s = LoadTensor(inputs_file, "key_padding_mask", true, &kpm);
  if (s.ok()) s = LoadPositions(inputs_file, "positions", &positions);
  if (s.ok()) s = LoadPositions(inputs_file, "key_positions", &key_positions);
  if (!s.ok()) return s;
  if (!query.view.present()) {
    return InvalidArgument("inputs '" + o.inputs + "': missing tensor 'query'");
  }
  if (value.view.present() && !key.view.present()) {
    return InvalidArgument("inputs '" + o.inputs + "': tensor 'value' given without 'key'");
  }

  AttentionInputs in;
  in.query = query.view;
  in.key = key.view;
  in.value = value.view;
  in.attn_mask = attn_mask.view;
  in.key_padding_mask = kpm.view;
  in.positions = positions.view;
  in.key_positions = key_positions.view;
  in.causal = o.hf.empty() ? o.causal : hf.causal;
  if (hf.cross_attention && !in.key.present()) {
    return InvalidArgument("inputs '" + o.inputs + "': missing tensor 'key' [N, S, hidden] for " +
                           "the cross-attention module '" + hf.prefix + "'");
  }
  if (!o.hf.empty() && !hf.cross_attention) {
    // One inputs file may serve every module of a model: a self-attention module reads only
    // its query (and positions, padding).
    in.key = TensorView();
    in.value = TensorView();
  }
  in.need_weights = o.need_weights;
  in.average_attn_weights = o.average_weights;

  // Output shapes follow the query: the operator validates everything else.
  const TensorView& q = in.query;
  const bool batched = q.rank == 3;
  if (q.rank != 2 && q.rank != 3) {
    return InvalidArgument("inputs '" + o.inputs + "', tensor 'query': expected 3 dims " +
                           (o.batch_first ? "[N, L, E]" : "[L, N, E]") +
                           " or 2 dims [L, E] (unbatched), got " + q.ShapeString());
  }
  const TensorView& kv = in.key.present() ? in.key : in.query;
  const int64_t N = batched ? q.shape[o.batch_first ? 0 : 1] : 1;
  const int64_t L = batched ? q.shape[o.batch_first ? 1 : 0] : q.shape[0];
  const int64_t S = kv.rank == 3 ? kv.shape[o.batch_first ? 1 : 0] : kv.shape[0];
  const int64_t St = S + (config.add_bias_kv ? 1 : 0) + (config.add_zero_attn ? 1 : 0);
  std::vector<int64_t> out_shape = ShapeOf(q);
  out_shape.back() = config.embed_dim;
  std::vector<int64_t> w_shape;
  if (batched) w_shape.push_back(N);
  if (!o.average_weights) w_shape.push_back(config.num_heads);
  w_shape.push_back(L);
  w_shape.push_back(St);

  AttentionOutputs out;
  std::vector<float> output, attn_weights;
  int64_t out_count = 1, w_count = 1;
  for (int64_t d : out_shape) out_count *= std::max<int64_t>(d, 0);
  for (int64_t d : w_shape) w_count *= std::max<int64_t>(d, 0);
  // Plan first: it validates every shape before anything is allocated for the outputs.
  {
    AttentionOutputs shapes_only;
    static float placeholder;
    s = TensorView::Dense(&placeholder, DType::kF32, static_cast<int>(out_shape.size()),
                          out_shape.data(), &shapes_only.output, "attn_output", true);
    if (s.ok() && o.need_weights) {
      s = TensorView::Dense(&placeholder, DType::kF32, static_cast<int>(w_shape.size()),
                            w_shape.data(), &shapes_only.attn_weights, "attn_output_weights", true);
    }
    size_t bytes = 0;
    if (s.ok()) s = layer->Plan(in, shapes_only, o.threads == 0 ? 1 : o.threads, &bytes);
    if (!s.ok()) return Status(s.code(), "inputs '" + o.inputs + "': " + s.message());
  }
  output.resize(static_cast<size_t>(out_count));
  s = TensorView::Dense(output.data(), DType::kF32, static_cast<int>(out_shape.size()),
                        out_shape.data(), &out.output, "attn_output");
  if (!s.ok()) return s;
  if (o.need_weights) {
    attn_weights.resize(static_cast<size_t>(w_count));
    s = TensorView::Dense(attn_weights.data(), DType::kF32, static_cast<int>(w_shape.size()),
                          w_shape.data(), &out.attn_weights, "attn_output_weights");
    if (!s.ok()) return s;
  }

  ContextOptions copts;
  copts.num_threads = o.threads;
  std::unique_ptr<Context> ctx;
  s = Context::Create(copts, &ctx);
  if (!s.ok()) return s;
  s = o.decode ? DecodeThroughCache(*layer, *ctx, o, in, out) : layer->Forward(*ctx, in, out);
  if (!s.ok()) return s;

  SafeTensorsWriter writer;
  s = writer.Add("attn_output", DType::kF32, out_shape, output.data());
  if (s.ok() && o.need_weights) {
    s = writer.Add("attn_output_weights", DType::kF32, w_shape, attn_weights.data());
  }
  if (!s.ok()) return s;

  // The PNG goes to a temporary file first; it is renamed only after the safetensors output is
  // in place, and the safetensors output is removed if that rename fails, so a failure leaves
  // neither file.
  std::string png_tmp;
  if (!o.weights_png.empty()) {
    png_tmp = o.weights_png + ".tmp." + std::to_string(getpid());
    const int64_t panel_cols = o.average_weights ? 1 : config.num_heads;
    s = RenderHeatmap(attn_weights, N, panel_cols, L, St, png_tmp);
    if (!s.ok()) {
      std::remove(png_tmp.c_str());
      return s;
    }
  }
  s = writer.WriteFile(o.output);
  if (!s.ok()) {
    if (!png_tmp.empty()) std::remove(png_tmp.c_str());
    return s;
  }
  if (!png_tmp.empty() && std::rename(png_tmp.c_str(), o.weights_png.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    std::remove(png_tmp.c_str());
    std::remove(o.output.c_str());
    return IoError("--weights-png: cannot rename '" + png_tmp + "' to '" + o.weights_png +
                   "': " + err);
  }
  return Status::Ok();
}

int Main(int argc, char** argv) {
  RunOptions options;
  Action action = Action::kRun;
  Status s = ParseArgs(argc, argv, &options, &action);
  if (!s.ok()) {
    std::fprintf(stderr, "mha-run: error: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (action == Action::kHelp) {
    std::fputs(kHelp, stdout);
    return kExitOk;
  }
  if (action == Action::kVersion) {
    std::printf("mha-run %s\nSIMD target: %s\nBLAS arch: %s\nbf16 kernel: %s\n", Version(),
                SimdTarget(), BlasArch(), Bf16Kernel());
    return kExitOk;
  }
  try {
    s = Run(options);
  } catch (const std::bad_alloc&) {
    s = OutOfMemory("out of memory");
  }
  if (!s.ok()) {
    std::string message = s.ToString();
    // One line, whatever a message holds.
    for (char& c : message) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    std::fprintf(stderr, "mha-run: error: %s\n", message.c_str());
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace
}  // namespace mha

int main(int argc, char** argv) { return mha::Main(argc, argv); }
