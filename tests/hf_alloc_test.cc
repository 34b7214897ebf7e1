// What loading a Hugging Face checkpoint allocates: a bf16 checkpoint loaded into a bf16 layer is
// copied once in bf16 (no f32 copy of any matrix on the way), and the checkpoint's other layers
// are never read into memory. Counted with tests/alloc_counter.h (every malloc and operator new
// of the process while counting).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "mha/mha.hpp"
#include "runtime/safetensors.h"
#include "tests/alloc_counter.h"

namespace mha {
namespace {

// A Llama-shaped checkpoint: hidden 512, 8 heads of 64, 4 kv heads, `layers` layers, bf16.
// Returns the bytes of one layer's four attention matrices stored as f32.
size_t WriteLlama(const std::string& dir, int layers) {
  constexpr int64_t kHidden = 512, kHeads = 8, kKvHeads = 4, kHd = 64;
  std::ofstream(dir + "/config.json")
      << "{\"model_type\": \"llama\", \"hidden_size\": " << kHidden
      << ", \"num_attention_heads\": " << kHeads << ", \"num_key_value_heads\": " << kKvHeads
      << ", \"num_hidden_layers\": " << layers << ", \"rope_theta\": 500000.0}";
  SafeTensorsWriter w;
  const int64_t shapes[4][2] = {{kHeads * kHd, kHidden},
                                {kKvHeads * kHd, kHidden},
                                {kKvHeads * kHd, kHidden},
                                {kHidden, kHeads * kHd}};
  const char* names[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
  size_t f32_bytes = 0;
  std::vector<uint16_t> bits;
  for (int l = 0; l < layers; ++l) {
    for (int m = 0; m < 4; ++m) {
      const size_t n = static_cast<size_t>(shapes[m][0] * shapes[m][1]);
      bits.assign(n, 0);
      for (size_t i = 0; i < n; ++i) bits[i] = static_cast<uint16_t>(0x3c00 + (i * 7 + l) % 256);
      const std::string name =
          "model.layers." + std::to_string(l) + ".self_attn." + names[m] + ".weight";
      EXPECT_TRUE(w.Add(name, DType::kBF16, {shapes[m][0], shapes[m][1]}, bits.data()).ok());
      if (l == 0) f32_bytes += n * sizeof(float);
    }
  }
  EXPECT_TRUE(w.WriteFile(dir + "/model.safetensors").ok());
  return f32_bytes;
}

TEST(HfAllocTest, Bf16CheckpointIntoBf16LayerMakesNoF32Copy) {
#ifdef MHA_SANITIZED
  GTEST_SKIP() << "the sanitizer owns the allocator: nothing is counted";
#else
  std::string dir = ::testing::TempDir() + "mha_hf_alloc_XXXXXX";
  ASSERT_NE(mkdtemp(&dir[0]), nullptr);
  constexpr int kLayers = 6;
  const size_t f32_bytes = WriteLlama(dir, kLayers);
  HfOptions options;
  options.weight_dtype = DType::kBF16;
  options.prepack = WeightPrepack::kOff;  // the layer keeps exactly its bf16 weights
  std::unique_ptr<MultiheadAttention> layer;
  g_allocated_bytes = 0;
  g_counting = true;
  const Status s = MultiheadAttention::CreateFromHuggingFace(dir, 3, options, &layer);
  g_counting = false;
  ASSERT_TRUE(s.ok()) << s.ToString();
  // The layer's bf16 copy is half the f32 bytes; one f32 matrix on the way (or reading a whole
  // file of 6 layers) would take more than the other half.
  const size_t allocated = g_allocated_bytes;
  std::printf("allocated %zu bytes loading one layer (bf16 copy %zu, f32 would be %zu)\n",
              allocated, f32_bytes / 2, f32_bytes);
  EXPECT_GE(allocated, f32_bytes / 2);
  EXPECT_LT(allocated, f32_bytes / 2 + f32_bytes / 8);
  for (const char* f : {"/config.json", "/model.safetensors"}) std::remove((dir + f).c_str());
  rmdir(dir.c_str());
#endif
}

}  // namespace
}  // namespace mha
