// Masks of the attention tasks (masks.h).
#include "runtime/masks.h"

namespace mha {

namespace {

using kernels::kNegInf;

MaskInput Unpadded(const MaskShape& shape, const void* data) {
  MaskInput mi;
  mi.type = shape.type;
  mi.data = data;
  mi.per_head = shape.per_head;
  mi.stride0 = shape.stride0;
  mi.row_stride = shape.row_stride;
  return mi;
}

}  // namespace

AttentionMasks PrepareMasks(const LayerWeights& m, const ForwardArgs& args, const ForwardPlan& ws,
                            const ForwardBuffers& buf) {
  const ForwardShapes& sh = args.shapes;
  const int64_t H = m.H;
  const LayerVariants& var = m.variants;
  AttentionMasks masks;
  masks.H = H;
  masks.softcap = var.softcap;
  masks.window = var.window;
  masks.alibi_slopes = var.alibi_slopes.empty() ? nullptr : var.alibi_slopes.data();
  masks.sinks = var.sinks.empty() ? nullptr : var.sinks.data();
  if (buf.q_pos != nullptr) {
    masks.q_pos = buf.q_pos;
    masks.q_pos_batch = sh.L;
    masks.k_pos = buf.k_pos != nullptr ? buf.k_pos : buf.q_pos;
    masks.k_pos_batch = buf.k_pos != nullptr ? sh.S : sh.L;
  }
  // With padded masks, causal is folded into the attn mask.
  masks.causal = sh.causal && !ws.padded_masks;
  masks.attn = Unpadded(sh.attn, args.attn_mask);
  masks.kpm = Unpadded(sh.kpm, args.key_padding_mask);
  if (!ws.padded_masks) return masks;
  MaskInput* attn = &masks.attn;
  MaskInput* kpm = &masks.kpm;
  const void* attn_data = args.attn_mask;
  const void* kpm_data = args.key_padding_mask;
  const int64_t N = sh.N, L = sh.L, S = sh.S, St = sh.St;
  if (sh.attn.type != MaskType::kNone || sh.causal) {
    // [slices, L, S'] copy; columns >= S are "allowed"; causal folded in as masked cells.
    const int64_t slices = sh.attn.per_head ? N * H : 1;
    const bool as_float = sh.attn.type == MaskType::kFloat;
    for (int64_t sl = 0; sl < slices; ++sl) {
      for (int64_t l = 0; l < L; ++l) {
        const int64_t row = (sl * L + l) * St;
        for (int64_t s = 0; s < St; ++s) {
          bool masked = sh.causal && s < S && s > l;
          float add = 0.0f;
          if (s < S && sh.attn.type != MaskType::kNone) {
            const ptrdiff_t src = sl * sh.attn.stride0 + l * sh.attn.row_stride + s;
            if (as_float) {
              add = static_cast<const float*>(attn_data)[src];
            } else {
              masked = masked || static_cast<const uint8_t*>(attn_data)[src] != 0;
            }
          }
          if (as_float) {
            reinterpret_cast<float*>(buf.attn_pad)[row + s] = masked ? kNegInf : add;
          } else {
            buf.attn_pad[row + s] = masked ? 1 : 0;
          }
        }
      }
    }
    attn->type = as_float ? MaskType::kFloat : MaskType::kBool;
    attn->data = buf.attn_pad;
    attn->stride0 = L * St;
    attn->row_stride = St;
  }
  if (sh.kpm.type != MaskType::kNone) {
    const bool as_float = sh.kpm.type == MaskType::kFloat;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t s = 0; s < St; ++s) {
        const ptrdiff_t src = n * sh.kpm.stride0 + s;
        if (as_float) {
          reinterpret_cast<float*>(buf.kpm_pad)[n * St + s] =
              s < S ? static_cast<const float*>(kpm_data)[src] : 0.0f;
        } else {
          buf.kpm_pad[n * St + s] = s < S ? (static_cast<const uint8_t*>(kpm_data)[src] != 0) : 0;
        }
      }
    }
    kpm->data = buf.kpm_pad;
    kpm->stride0 = St;
  }
  return masks;
}

kernels::SoftmaxMasks MasksFor(const AttentionMasks& masks, int64_t n, int64_t h, int64_t q0,
                               int64_t k0, bool full_row) {
  const MaskInput& attn = masks.attn;
  const MaskInput& kpm = masks.kpm;
  kernels::SoftmaxMasks m;
  int slot_add = 0, slot_bool = 0;
  auto add_mask = [&](const MaskInput& mi, ptrdiff_t offset, ptrdiff_t row_stride) {
    if (mi.type == MaskType::kFloat) {
      m.add[slot_add] = static_cast<const float*>(mi.data) + offset;
      m.add_row_stride[slot_add++] = row_stride;
    } else if (mi.type == MaskType::kBool) {
      m.masked[slot_bool] = static_cast<const uint8_t*>(mi.data) + offset;
      m.masked_row_stride[slot_bool++] = row_stride;
    }
  };
  if (attn.type != MaskType::kNone) {
    const ptrdiff_t slice = attn.per_head ? (n * masks.H + h) * attn.stride0 : 0;
    add_mask(attn, slice + q0 * attn.row_stride + k0, attn.row_stride);
  }
  if (kpm.type != MaskType::kNone) add_mask(kpm, n * kpm.stride0 + k0, 0);
  m.causal = masks.causal;
  // Also the index positions' distance offset (ALiBi, window), with or without causal.
  m.causal_offset = q0 - k0;
  m.softcap = masks.softcap;
  m.window = masks.window;
  if (masks.alibi_slopes != nullptr) m.alibi_slope = masks.alibi_slopes[h];
  if (masks.q_pos != nullptr) {
    m.q_pos = masks.q_pos + n * masks.q_pos_batch + q0;
    m.k_pos = masks.k_pos + n * masks.k_pos_batch + k0;
  }
  if (full_row && masks.sinks != nullptr) m.sink = masks.sinks[h];
  return m;
}

kernels::SoftmaxMasks AppendedKeyTerms(const AttentionMasks& masks) {
  kernels::SoftmaxMasks m;
  m.softcap = masks.softcap;
  return m;
}

}  // namespace mha
