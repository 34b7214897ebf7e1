#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "mha/types.hpp"

namespace mha {
namespace {

TEST(TensorViewTest, DenseStridesAreRowMajor) {
  float data[24];
  const int64_t shape[3] = {2, 3, 4};
  TensorView v;
  ASSERT_TRUE(TensorView::Dense(data, DType::kF32, 3, shape, &v).ok());
  EXPECT_EQ(v.rank, 3);
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.strides[1], 4);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_EQ(v.NumElements(), 24);
  EXPECT_TRUE(v.IsContiguous());
  EXPECT_EQ(v.ShapeString(), "[2, 3, 4] f32");
}

TEST(TensorViewTest, StridedViewOfAHead) {
  // Head 1 of a [tokens=5, heads=3, head_dim=4] buffer, viewed as [5, 4] with row stride 12.
  float data[60];
  const int64_t shape[2] = {5, 4};
  const int64_t strides[2] = {12, 1};
  TensorView v;
  ASSERT_TRUE(TensorView::Strided(data + 4, DType::kF32, 2, shape, strides, &v).ok());
  EXPECT_FALSE(v.IsContiguous());
  EXPECT_EQ(v.As<float>(), data + 4);
}

TEST(TensorViewTest, RejectsBadShapes) {
  float data[4];
  TensorView v;
  const int64_t zero[2] = {2, 0};
  Status s = TensorView::Dense(data, DType::kF32, 2, zero, &v, "query");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("query"), std::string::npos);
  EXPECT_NE(s.message().find("[2, 0]"), std::string::npos) << s.message();
  EXPECT_TRUE(TensorView::Dense(data, DType::kF32, 2, zero, &v, "q", /*allow_empty=*/true).ok());

  const int64_t negative[1] = {-3};
  EXPECT_EQ(TensorView::Dense(data, DType::kF32, 1, negative, &v).code(),
            StatusCode::kInvalidArgument);
  const int64_t ok[1] = {4};
  EXPECT_EQ(TensorView::Dense(data, DType::kF32, 0, ok, &v).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorView::Dense(data, DType::kF32, 5, ok, &v).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorView::Dense(nullptr, DType::kF32, 1, ok, &v).code(),
            StatusCode::kInvalidArgument);
  const int64_t strides[1] = {-1};
  EXPECT_EQ(TensorView::Strided(data, DType::kF32, 1, ok, strides, &v).code(),
            StatusCode::kInvalidArgument);
}

TEST(TensorViewTest, RejectsOverflowingSizes) {
  float data[1];
  TensorView v;
  const int64_t big = int64_t{1} << 40;
  const int64_t shape[2] = {big, big};  // 2^80 elements
  Status s = TensorView::Dense(data, DType::kF32, 2, shape, &v, "key");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overflows"), std::string::npos) << s.message();
  // 2^62 elements fit int64 but 2^64 bytes do not.
  const int64_t shape1[1] = {int64_t{1} << 62};
  s = TensorView::Dense(data, DType::kF32, 1, shape1, &v, "value");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("byte size"), std::string::npos) << s.message();
  const int64_t strides[1] = {std::numeric_limits<int64_t>::max()};
  const int64_t shape2[1] = {3};
  EXPECT_EQ(TensorView::Strided(data, DType::kF32, 1, shape2, strides, &v).code(),
            StatusCode::kInvalidArgument);
}

TEST(TensorViewTest, DTypeSizes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
}

TEST(StatusTest, CodesAndMessages) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = InvalidArgument("num_heads: expected > 0, got 0");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "InvalidArgument: num_heads: expected > 0, got 0");
  EXPECT_EQ(OutOfMemory("x").code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(FormatError("x").code(), StatusCode::kFormatError);
}

}  // namespace
}  // namespace mha
