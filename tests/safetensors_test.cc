// safetensors reader/writer: round trips for every dtype and rank 0..4, exact f16/bf16
// widening, zero-copy views, atomic writes, and a catalogue of malformed files that must each be
// rejected with a FormatError whose message says what is wrong.
#include "runtime/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace mha {
namespace {

std::string TempDir() {
  const char* t = std::getenv("TMPDIR");
  return t ? t : "/tmp";
}

std::string TempPath(const std::string& stem) {
  return TempDir() + "/mha_st_" + std::to_string(getpid()) + "_" + stem + ".safetensors";
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// A file made of an explicit header string and data bytes.
std::vector<uint8_t> MakeFile(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> f;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(n >> (8 * i)));
  f.insert(f.end(), header.begin(), header.end());
  f.insert(f.end(), data.begin(), data.end());
  return f;
}

std::vector<uint8_t> Zeros(size_t n) { return std::vector<uint8_t>(n, 0); }

Status ParseBytes(const std::vector<uint8_t>& bytes, SafeTensorsFile* out = nullptr) {
  SafeTensorsFile f;
  return SafeTensorsFile::FromBuffer(bytes.data(), bytes.size(), out ? out : &f, "test.st");
}

// Each element: a malformed file and a fragment its error message must contain.
struct BadCase {
  const char* what;
  std::vector<uint8_t> bytes;
  const char* expected;
};

std::vector<BadCase> BadCases() {
  std::vector<BadCase> c;
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  // 1. empty file
  c.push_back({"empty file", {}, "file is 0 bytes, expected at least 8"});
  // 2. 7-byte file (truncated header length)
  c.push_back({"7-byte file", std::vector<uint8_t>(7, 1), "file is 7 bytes, expected at least 8"});
  // 3. header length beyond the file
  {
    std::vector<uint8_t> f = MakeFile("{}", {});
    f[0] = 200;
    c.push_back({"header length beyond file", f, "header length is 200 bytes, but only 2 bytes"});
  }
  // 4. huge claimed header: nothing may be allocated for it
  {
    std::vector<uint8_t> f = MakeFile("{}", {});
    for (int i = 0; i < 8; ++i) f[i] = 0xFF;
    c.push_back({"huge header length", f,
                 "header length is 18446744073709551615 bytes, expected "
                 "at most 100000000"});
  }
  {
    std::vector<uint8_t> f = MakeFile("{}", {});
    f[0] = 0x01;
    f[1] = 0xE1;
    f[2] = 0xF5;
    f[3] = 0x05;  // 100,000,001
    c.push_back({"header just above 100 MB", f, "header length is 100000001 bytes"});
  }
  // 5. not JSON
  c.push_back({"header not JSON", MakeFile("{not json}", {}), "header is not valid JSON"});
  // 6. array instead of object
  c.push_back({"JSON array", MakeFile("[1, 2]", {}),
               "header must start with '{' (a JSON object), got '['"});
  // 7. non-UTF-8 header
  c.push_back({"non-UTF-8", MakeFile("{\"a\xff\":{}}", {}), "header is not valid UTF-8"});
  c.push_back({"overlong UTF-8", MakeFile("{\"\xc0\xaf\":{}}", {}), "not valid UTF-8"});
  // 8. deep nesting: 100000 '[' inside a shape
  {
    std::string h = R"({"a":{"dtype":"F32","shape":)" + std::string(100000, '[');
    c.push_back(
        {"deep nesting", MakeFile(h, {}), "tensor 'a': shape: nesting deeper than 3 levels"});
    std::string h2 = "{\"a\":" + std::string(100000, '[');
    c.push_back(
        {"deep nesting at top", MakeFile(h2, {}), "tensor 'a': expected an object, got an array"});
    std::string h3 = R"({"a":{"dtype":"F32","shape":[{"x":1}]}})";
    c.push_back({"object in shape", MakeFile(h3, {}), "nesting deeper than 3 levels"});
  }
  // 9. unknown dtype
  c.push_back({"unknown dtype",
               MakeFile(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", Zeros(8)),
               "tensor 'a': unknown dtype \"F33\""});
  // 10. negative dim
  c.push_back({"negative dim",
               MakeFile(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", Zeros(8)),
               "tensor 'a': shape must hold non-negative integers, got -2"});
  // 11. non-integer dim
  c.push_back({"non-integer dim",
               MakeFile(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", Zeros(8)),
               "tensor 'a': shape must hold non-negative integers, got 2.5"});
  c.push_back({"string dim",
               MakeFile(R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", Zeros(8)),
               "tensor 'a': shape must hold non-negative integers, got a string"});
  c.push_back({"shape not array",
               MakeFile(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", Zeros(8)),
               "tensor 'a': shape must be an array of integers, got an integer"});
  c.push_back(
      {"dim >= 2^63",
       MakeFile(R"({"a":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})",
                Zeros(8)),
       "shape dimension 0 is 9223372036854775808, expected < 2^63"});
  // 12. shape overflow
  c.push_back(
      {"element count overflow",
       MakeFile(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                Zeros(8)),
       "element count of shape [4294967296, 4294967296] overflows 64 bits"});
  c.push_back(
      {"byte size overflow",
       MakeFile(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})",
                Zeros(8)),
       "byte size of shape [4611686018427387904] F64 overflows 64 bits"});
  // 13. offsets reversed
  c.push_back({"offsets reversed",
               MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", Zeros(8)),
               "data_offsets [8, 0] must be ascending"});
  // 14. offsets beyond data
  c.push_back({"offsets beyond data",
               MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", Zeros(8)),
               "data_offsets [4, 12] extend beyond the data region of 8 bytes"});
  // 15. byte count != shape x dtype
  c.push_back({"byte count mismatch",
               MakeFile(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", Zeros(8)),
               "data_offsets [0, 8] span 8 bytes, expected 12 for shape [3] F32"});
  // 16. overlap
  c.push_back({"overlap",
               MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        Zeros(12)),
               "tensor 'b' (bytes [4, 12)) overlaps tensor 'a' which ends at 8"});
  // 17. hole in the data region, and trailing bytes
  c.push_back({"hole",
               MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                        Zeros(12)),
               "hole in the data region: bytes [4, 8) belong to no tensor"});
  c.push_back({"hole at start",
               MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", Zeros(8)),
               "hole in the data region: bytes [0, 4)"});
  c.push_back({"trailing garbage", MakeFile("{" + ok_entry + "}", Zeros(12)),
               "data region is 12 bytes but the tensors cover only 8"});
  c.push_back({"trailing garbage in header", MakeFile("{" + ok_entry + "} x", Zeros(8)),
               "header is not valid JSON"});
  // 18. duplicate name
  c.push_back({"duplicate name",
               MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        Zeros(8)),
               "duplicate tensor name 'a'"});
  c.push_back({"duplicate field",
               MakeFile(R"({"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})",
                        Zeros(8)),
               "tensor 'a': duplicate field 'dtype'"});
  c.push_back(
      {"unknown field",
       MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", Zeros(8)),
       "tensor 'a': unknown field 'x'"});
  // 19. metadata value not a string
  c.push_back({"metadata value not string",
               MakeFile(R"({"__metadata__":{"k":1},)" + ok_entry + "}", Zeros(8)),
               "__metadata__: value of 'k' must be a string, got an integer"});
  c.push_back({"metadata not object", MakeFile(R"({"__metadata__":"x"})", {}),
               "\"__metadata__\" must be an object, got a string"});
  // 20. missing dtype / data_offsets / shape
  c.push_back({"missing dtype", MakeFile(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", Zeros(8)),
               "tensor 'a': missing field \"dtype\""});
  c.push_back({"missing shape", MakeFile(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", Zeros(8)),
               "tensor 'a': missing field \"shape\""});
  c.push_back({"missing data_offsets", MakeFile(R"({"a":{"dtype":"F32","shape":[2]}})", Zeros(8)),
               "tensor 'a': missing field \"data_offsets\""});
  // 21. data_offsets of length 3 and 1
  c.push_back({"data_offsets length 3",
               MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", Zeros(8)),
               "data_offsets must hold 2 integers [begin, end], got more than 2"});
  c.push_back({"data_offsets length 1",
               MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", Zeros(8)),
               "data_offsets must hold 2 integers [begin, end], got 1"});
  // 22. dtype not a string, tensor entry not an object, empty header, BOM
  c.push_back({"dtype not string",
               MakeFile(R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", Zeros(8)),
               "tensor 'a': dtype must be a string, got an integer"});
  c.push_back({"entry not object", MakeFile(R"({"a":[0,8]})", Zeros(8)),
               "tensor 'a': expected an object, got an array"});
  c.push_back({"empty header", MakeFile("", {}), "got an empty header"});
  c.push_back({"BOM", MakeFile("\xef\xbb\xbf{}", {}), "got byte 0xef"});
  c.push_back({"unterminated", MakeFile(R"({"a":{"dtype":"F32")", {}), "header is not valid JSON"});
  return c;
}

TEST(SafeTensorsTest, RejectsMalformedFiles) {
  const std::vector<BadCase> cases = BadCases();
  ASSERT_GE(cases.size(), 20u);
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    Status s = ParseBytes(c.bytes);
    EXPECT_EQ(s.code(), StatusCode::kFormatError) << s.ToString();
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("safetensors 'test.st': "), std::string::npos) << s.message();
  }
}

TEST(SafeTensorsTest, MalformedFilesOnDiskNameThePath) {
  const std::string path = TempPath("bad");
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite("1234567", 1, 7, f);
    std::fclose(f);
  }
  SafeTensorsFile file;
  Status s = SafeTensorsFile::Open(path, &file);
  EXPECT_EQ(s.code(), StatusCode::kFormatError);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("file is 7 bytes"), std::string::npos) << s.message();
  // An empty file cannot be mmap'ed; it must still be a FormatError, not an IoError.
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  s = SafeTensorsFile::Open(path, &file);
  EXPECT_EQ(s.code(), StatusCode::kFormatError) << s.ToString();
  std::remove(path.c_str());

  s = SafeTensorsFile::Open(TempDir() + "/definitely/not/here.safetensors", &file);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("definitely/not/here.safetensors"), std::string::npos);
  s = SafeTensorsFile::Open(TempDir(), &file);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("not a regular file"), std::string::npos) << s.message();
}

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(SafeTensorsTest, RoundTripEveryDTypeAndRank) {
  const std::vector<std::vector<int64_t>> shapes = {{}, {5}, {2, 3}, {2, 1, 3}, {1, 2, 2, 3}};
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kBool, DType::kU8};
  SafeTensorsWriter w;
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> payloads;
  uint8_t seed = 1;
  for (DType dt : dtypes) {
    for (const auto& shape : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<uint8_t> bytes(static_cast<size_t>(n) * DTypeSize(dt));
      for (auto& b : bytes) {
        b = dt == DType::kBool ? (seed & 1) : seed;
        seed = static_cast<uint8_t>(seed * 37 + 11);
      }
      const std::string name = std::string(DTypeName(dt)) + ".rank" + std::to_string(shape.size());
      ASSERT_TRUE(w.Add(name, dt, shape, bytes.data()).ok());
      names.push_back(name);
      payloads.push_back(bytes);
    }
  }
  ASSERT_TRUE(w.Add("empty", DType::kF32, {0, 3}, nullptr).ok());
  ASSERT_TRUE(w.AddMetadata("format", "pt").ok());
  ASSERT_TRUE(w.AddMetadata("note", "h\xc3\xa9llo \"quoted\"\n").ok());
  ASSERT_TRUE(w.AddMetadata("format", "np").ok());  // replaces
  const std::string path = TempPath("roundtrip");
  ASSERT_TRUE(w.WriteFile(path).ok());

  SafeTensorsFile f;
  Status s = SafeTensorsFile::Open(path, &f);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::remove(path.c_str());  // the mapping stays valid
  ASSERT_EQ(f.size(), names.size() + 1);
  std::vector<std::string> expected_names = names;
  expected_names.push_back("empty");
  EXPECT_EQ(f.names(), expected_names);
  EXPECT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata().at("format"), "np");
  EXPECT_EQ(f.metadata().at("note"), "h\xc3\xa9llo \"quoted\"\n");

  size_t i = 0;
  for (DType dt : dtypes) {
    for (const auto& shape : shapes) {
      const TensorInfo* t = f.Find(names[i]);
      ASSERT_NE(t, nullptr) << names[i];
      EXPECT_TRUE(t->supported);
      EXPECT_EQ(t->dtype, dt);
      EXPECT_EQ(t->dtype_name, SafeTensorsDTypeName(dt));
      EXPECT_EQ(t->shape, shape);
      EXPECT_EQ(t->nbytes, payloads[i].size());
      ASSERT_EQ(std::memcmp(t->data, payloads[i].data(), payloads[i].size()), 0) << names[i];
      // Tensors written with 8-byte padding and whole-byte dtypes in this order stay aligned to
      // their element size when mapped.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % DTypeSize(dt), 0u) << names[i];
      ++i;
    }
  }
  const TensorInfo* e = f.Find("empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->num_elements, 0u);
  EXPECT_EQ(f.Find("nope"), nullptr);

  // Typed access: f32 copy equals the bytes; bool normalizes; u8 copies.
  std::vector<float> v;
  ASSERT_TRUE(f.GetF32("f32.rank2", &v).ok());
  ASSERT_EQ(v.size(), 6u);
  EXPECT_EQ(std::memcmp(v.data(), payloads[2].data(), 24), 0);
  std::vector<uint8_t> b;
  ASSERT_TRUE(f.GetBool("bool.rank3", &b).ok());
  EXPECT_EQ(b, payloads[3 + 5 * 3]);
  ASSERT_TRUE(f.GetBool("u8.rank4", &b).ok());
  EXPECT_EQ(b, payloads[4 + 5 * 4]);
  ASSERT_TRUE(f.GetF32("f32.rank0", &v).ok());
  EXPECT_EQ(v.size(), 1u);
  ASSERT_TRUE(f.GetF32("empty", &v).ok());
  EXPECT_TRUE(v.empty());

  // Wrong-dtype accessors are Unsupported and say what to use.
  s = f.GetF32("u8.rank1", &v);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("tensor 'u8.rank1' has dtype U8, expected F32, F16 or BF16"),
            std::string::npos)
      << s.message();
  s = f.GetBool("f32.rank1", &b);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  s = f.GetF32("missing", &v);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no tensor named 'missing'"), std::string::npos);
}

TEST(SafeTensorsTest, SerializeMatchesThePythonLayout) {
  SafeTensorsWriter w;
  const float x[2] = {1.0f, -2.0f};
  ASSERT_TRUE(w.Add("x", DType::kF32, {2}, x).ok());
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(w.Serialize(&bytes).ok());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})");
  EXPECT_EQ(bytes.size(), 8 + n + 8);
}

TEST(SafeTensorsTest, HalfPrecisionWidensExactly) {
  // (bits, value) pairs covering normals, subnormals, zeros, infinities, the extremes.
  const std::vector<std::pair<uint16_t, float>> f16 = {
      {0x3C00, 1.0f},
      {0xC000, -2.0f},
      {0x3555, 0.333251953125f},
      {0x7BFF, 65504.0f},                 // max normal
      {0x0400, 6.103515625e-05f},         // min normal 2^-14
      {0x0001, 5.9604644775390625e-08f},  // min subnormal 2^-24
      {0x03FF, 6.097555160522461e-05f},   // max subnormal
      {0x8001, -5.9604644775390625e-08f},
      {0x0000, 0.0f},
      {0x7C00, std::numeric_limits<float>::infinity()},
      {0xFC00, -std::numeric_limits<float>::infinity()},
  };
  const std::vector<std::pair<uint16_t, float>> bf16 = {
      {0x3F80, 1.0f},
      {0xC040, -3.0f},
      {0x3EAB, 0.333984375f},
      {0x7F7F, 3.3895313892515355e+38f},  // max finite
      {0x0001, 9.183549615799121e-41f},   // min subnormal 2^-133
      {0xFF80, -std::numeric_limits<float>::infinity()},
  };
  std::vector<uint16_t> hb, bb;
  for (auto& p : f16) hb.push_back(p.first);
  for (auto& p : bf16) bb.push_back(p.first);
  hb.push_back(0x8000);  // -0
  hb.push_back(0x7E01);  // NaN with payload
  bb.push_back(0x7FC1);  // NaN
  SafeTensorsWriter w;
  ASSERT_TRUE(w.Add("h", DType::kF16, {static_cast<int64_t>(hb.size())}, hb.data()).ok());
  ASSERT_TRUE(w.Add("b", DType::kBF16, {static_cast<int64_t>(bb.size())}, bb.data()).ok());
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(w.Serialize(&bytes).ok());
  SafeTensorsFile f;
  ASSERT_TRUE(ParseBytes(bytes, &f).ok());
  std::vector<float> v;
  ASSERT_TRUE(f.GetF32("h", &v).ok());
  ASSERT_EQ(v.size(), hb.size());
  for (size_t i = 0; i < f16.size(); ++i) EXPECT_EQ(v[i], f16[i].second) << std::hex << hb[i];
  EXPECT_EQ(v[f16.size()], 0.0f);
  EXPECT_TRUE(std::signbit(v[f16.size()]));
  uint32_t nan_bits;
  std::memcpy(&nan_bits, &v[f16.size() + 1], 4);
  EXPECT_EQ(nan_bits, 0x7FC02000u);  // payload shifted into the f32 mantissa
  ASSERT_TRUE(f.GetF32("b", &v).ok());
  for (size_t i = 0; i < bf16.size(); ++i) EXPECT_EQ(v[i], bf16[i].second) << std::hex << bb[i];
  EXPECT_TRUE(std::isnan(v[bf16.size()]));

  // Every f16 bit pattern: the widened value converts back to the same pattern (exactness),
  // checked against a reference built from ldexp.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const int exp = (h >> 10) & 0x1F;
    const int mant = h & 0x3FF;
    const float sign = (h & 0x8000) ? -1.0f : 1.0f;
    const float got = F16BitsToF32(h);
    if (exp == 0x1F) {
      EXPECT_TRUE(mant ? std::isnan(got) : std::isinf(got)) << bits;
      continue;
    }
    const float want = exp == 0 ? sign * std::ldexp(static_cast<float>(mant), -24)
                                : sign * std::ldexp(static_cast<float>(1024 + mant), exp - 25);
    ASSERT_EQ(got, want) << "f16 bits 0x" << std::hex << bits;
    ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << bits;
  }
}

TEST(SafeTensorsTest, ZeroCopyViewOfAlignedF32) {
  SafeTensorsWriter w;
  std::vector<float> a(24);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.5f;
  const uint16_t h[2] = {0x3C00, 0x4000};
  const float scalar = 7.0f;
  ASSERT_TRUE(w.Add("a", DType::kF32, {2, 3, 4}, a.data()).ok());
  ASSERT_TRUE(w.Add("h", DType::kF16, {2}, h).ok());
  ASSERT_TRUE(w.Add("s", DType::kF32, {}, &scalar).ok());
  const uint8_t one = 1;
  ASSERT_TRUE(w.Add("odd", DType::kU8, {1}, &one).ok());
  ASSERT_TRUE(w.Add("misaligned", DType::kF32, {1}, &scalar).ok());
  ASSERT_TRUE(w.AddRaw("rank5", "F32", {1, 1, 1, 1, 1}, &scalar, 4).ok());
  const std::string path = TempPath("view");
  ASSERT_TRUE(w.WriteFile(path).ok());
  SafeTensorsFile f;
  ASSERT_TRUE(SafeTensorsFile::Open(path, &f).ok());
  std::remove(path.c_str());

  TensorView v;
  ASSERT_TRUE(f.ViewF32("a", &v).ok());
  EXPECT_EQ(v.data, static_cast<const void*>(f.Find("a")->data));  // no copy
  EXPECT_EQ(v.ShapeString(), "[2, 3, 4] f32");
  EXPECT_TRUE(v.IsContiguous());
  EXPECT_EQ(v.As<float>()[23], 11.5f);
  ASSERT_TRUE(f.ViewF32("s", &v).ok());
  EXPECT_EQ(v.ShapeString(), "[1] f32");
  EXPECT_EQ(v.As<float>()[0], 7.0f);

  Status s = f.ViewF32("h", &v);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("has dtype F16, ViewF32 needs F32; use GetF32"), std::string::npos)
      << s.message();
  s = f.ViewF32("misaligned", &v);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("not 4-byte aligned"), std::string::npos) << s.message();
  std::vector<float> copy;
  ASSERT_TRUE(f.GetF32("misaligned", &copy).ok());
  EXPECT_EQ(copy, std::vector<float>{7.0f});
  s = f.ViewF32("rank5", &v);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("rank 5"), std::string::npos) << s.message();
  ASSERT_TRUE(f.GetF32("rank5", &copy).ok());
}

TEST(SafeTensorsTest, UnsupportedDTypesParseButAreNotReadable) {
  SafeTensorsWriter w;
  const double d[3] = {1.0, 2.0, 3.0};
  const uint64_t u64[1] = {5};
  ASSERT_TRUE(w.AddRaw("d", "F64", {3}, d, sizeof(d)).ok());
  ASSERT_TRUE(w.AddRaw("i", "U64", {1}, u64, sizeof(u64)).ok());
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(w.Serialize(&bytes).ok());
  SafeTensorsFile f;
  ASSERT_TRUE(ParseBytes(bytes, &f).ok());
  const TensorInfo* t = f.Find("d");
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->supported);
  EXPECT_EQ(t->nbytes, 24u);
  std::vector<float> v;
  Status s = f.GetF32("d", &v);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("has dtype F64"), std::string::npos) << s.message();
  TensorView view;
  EXPECT_EQ(f.ViewF32("i", &view).code(), StatusCode::kUnsupported);
  std::vector<uint8_t> b;
  EXPECT_EQ(f.GetBool("i", &b).code(), StatusCode::kUnsupported);
}

TEST(SafeTensorsTest, IntegerTensorsReadAsInt64) {
  // Token positions: I32 and I64 widen to int64; I32 starts at an odd offset (after a 1-byte
  // tensor) to exercise unaligned reads.
  SafeTensorsWriter w;
  const uint8_t pad[1] = {1};
  const int32_t i32[3] = {0, -7, 2147483647};
  const int64_t i64[2] = {int64_t{1} << 40, -3};
  ASSERT_TRUE(w.Add("pad", DType::kU8, {1}, pad).ok());
  ASSERT_TRUE(w.Add("p32", DType::kI32, {3}, i32).ok());
  ASSERT_TRUE(w.Add("p64", DType::kI64, {1, 2}, i64).ok());
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(w.Serialize(&bytes).ok());
  SafeTensorsFile f;
  ASSERT_TRUE(ParseBytes(bytes, &f).ok());
  const TensorInfo* t = f.Find("p32");
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->supported);
  EXPECT_EQ(t->dtype, DType::kI32);
  EXPECT_EQ(f.Find("p64")->dtype, DType::kI64);
  std::vector<int64_t> v;
  ASSERT_TRUE(f.GetInt64("p32", &v).ok());
  EXPECT_EQ(v, (std::vector<int64_t>{0, -7, 2147483647}));
  ASSERT_TRUE(f.GetInt64("p64", &v).ok());
  EXPECT_EQ(v, (std::vector<int64_t>{int64_t{1} << 40, -3}));
  Status s = f.GetInt64("pad", &v);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("expected I32 or I64"), std::string::npos) << s.message();
  std::vector<float> fv;
  EXPECT_EQ(f.GetF32("p32", &fv).code(), StatusCode::kUnsupported);
  EXPECT_EQ(f.GetInt64("absent", &v).code(), StatusCode::kInvalidArgument);
}

TEST(SafeTensorsTest, EmptyFileWithOnlyMetadataIsValid) {
  SafeTensorsFile f;
  ASSERT_TRUE(ParseBytes(MakeFile("{}", {}), &f).ok());
  EXPECT_EQ(f.size(), 0u);
  ASSERT_TRUE(ParseBytes(MakeFile(R"({"__metadata__":{"a":"b"}}   )", {}), &f).ok());
  EXPECT_EQ(f.metadata().at("a"), "b");
}

TEST(SafeTensorsTest, WriterRejectsBadInput) {
  SafeTensorsWriter w;
  const float x = 1.0f;
  EXPECT_EQ(w.Add("", DType::kF32, {1}, &x).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Add("__metadata__", DType::kF32, {1}, &x).code(), StatusCode::kInvalidArgument);
  Status s = w.Add("neg", DType::kF32, {-1}, &x);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("got shape [-1]"), std::string::npos) << s.message();
  EXPECT_EQ(w.Add("null", DType::kF32, {1}, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Add("ovf", DType::kF32, {1LL << 62, 1LL << 62}, &x).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Add("bad\xff", DType::kF32, {1}, &x).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.Add("x", DType::kF32, {1}, &x).ok());
  s = w.Add("x", DType::kF32, {1}, &x);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("duplicate name"), std::string::npos);
  s = w.AddRaw("y", "F32", {2}, &x, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 8 bytes for shape [2] F32, got 4"), std::string::npos)
      << s.message();
  EXPECT_EQ(w.AddRaw("z", "F4", {2}, &x, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddMetadata("k", "\xc0\xaf").code(), StatusCode::kInvalidArgument);
}

TEST(SafeTensorsTest, FailedWriteLeavesNoFile) {
  SafeTensorsWriter w;
  const float x = 1.0f;
  ASSERT_TRUE(w.Add("x", DType::kF32, {1}, &x).ok());
  // A directory that does not exist: the temp file cannot be created.
  const std::string missing_dir = TempDir() + "/mha_st_no_such_dir_" + std::to_string(getpid());
  Status s = w.WriteFile(missing_dir + "/out.safetensors");
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("cannot create"), std::string::npos) << s.message();
  EXPECT_FALSE(FileExists(missing_dir));

  // The rename fails (the target is a non-empty directory): the temp must be cleaned up and the
  // target untouched.
  const std::string dir = TempDir() + "/mha_st_dir_" + std::to_string(getpid());
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string target = dir + "/target";
  ASSERT_EQ(mkdir(target.c_str(), 0755), 0);
  const std::string inner = target + "/keep";
  FILE* keep = std::fopen(inner.c_str(), "wb");
  ASSERT_NE(keep, nullptr);
  std::fclose(keep);
  s = w.WriteFile(target);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("cannot rename"), std::string::npos) << s.message();
  EXPECT_FALSE(FileExists(target + ".tmp." + std::to_string(getpid())));
  EXPECT_TRUE(FileExists(inner));

  // An unwritable directory (skipped as root, who can write anywhere).
  if (geteuid() != 0) {
    const std::string ro = dir + "/ro";
    ASSERT_EQ(mkdir(ro.c_str(), 0555), 0);
    s = w.WriteFile(ro + "/out.safetensors");
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_FALSE(FileExists(ro + "/out.safetensors"));
    rmdir(ro.c_str());
  }
  std::remove(inner.c_str());
  rmdir(target.c_str());

  // Success replaces an existing file atomically.
  const std::string out = dir + "/out.safetensors";
  ASSERT_TRUE(w.WriteFile(out).ok());
  ASSERT_TRUE(w.WriteFile(out).ok());
  EXPECT_FALSE(FileExists(out + ".tmp." + std::to_string(getpid())));
  SafeTensorsFile f;
  ASSERT_TRUE(SafeTensorsFile::Open(out, &f).ok());
  EXPECT_EQ(f.size(), 1u);
  std::remove(out.c_str());
  rmdir(dir.c_str());
}

TEST(SafeTensorsTest, MoveKeepsTheMappingAlive) {
  SafeTensorsWriter w;
  const float x[3] = {1, 2, 3};
  ASSERT_TRUE(w.Add("x", DType::kF32, {3}, x).ok());
  const std::string path = TempPath("move");
  ASSERT_TRUE(w.WriteFile(path).ok());
  SafeTensorsFile a;
  ASSERT_TRUE(SafeTensorsFile::Open(path, &a).ok());
  std::remove(path.c_str());
  SafeTensorsFile b = std::move(a);
  SafeTensorsFile c;
  c = std::move(b);
  std::vector<float> v;
  ASSERT_TRUE(c.GetF32("x", &v).ok());
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
}

}  // namespace
}  // namespace mha
