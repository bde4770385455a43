// Round-to-nearest INT4 quantization (model/int4_quantize.h): each value within half a step of its group's
// grid, the scale bf16(max |w| / 7), and the packed words in the order the backends' W4A16 linear reads them
// (the CPU linear with the packed weight equals a dense linear with the dequantized values).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/half.h"
#include "cpu_op_testing.h"
#include "model/int4_quantize.h"

namespace qspec {
namespace {

using cpu_test::TestTensor;

TEST(Int4Quantize, RoundsToTheGroupGridInTheLinearsLayout) {
  constexpr int64_t kRows = 5, kCols = 96, kGroup = 32, kGroups = kCols / kGroup;
  std::mt19937 rng(61);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(size_t(kRows * kCols));
  for (float& v : w) v = normal(rng);
  for (int64_t c = 0; c < kGroup; ++c) w[size_t(kCols + c)] = 0.0f;  // row 1, group 0: all zeros
  w[size_t(2 * kCols + 40)] = -1.5f;                                 // row 2, group 1: an outlier
  std::vector<uint32_t> packed(size_t(kRows * kCols / 8));
  std::vector<uint16_t> scales(size_t(kRows * kGroups));
  quantize_int4_rows(w.data(), kRows, kCols, kGroup, packed.data(), scales.data());

  std::vector<float> dequantized(w.size());
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t g = 0; g < kGroups; ++g) {
      float largest = 0.0f;
      for (int64_t c = 0; c < kGroup; ++c)
        largest = std::max(largest, std::fabs(w[size_t(r * kCols + g * kGroup + c)]));
      const float scale = bf16_to_f32(scales[size_t(r * kGroups + g)]);
      EXPECT_EQ(scales[size_t(r * kGroups + g)], f32_to_bf16(largest / 7.0f))
          << "row " << r << " group " << g;
      for (int64_t c = 0; c < kGroup; ++c) {
        const int64_t k = g * kGroup + c;
        const uint32_t nibble = (packed[size_t((r * kCols + k) / 8)] >> (4 * (k % 8))) & 0xFu;
        const float value = (float(nibble) - 8.0f) * scale;
        dequantized[size_t(r * kCols + k)] = value;
        EXPECT_LE(std::fabs(value - w[size_t(r * kCols + k)]), 0.5f * scale * 1.01f)
            << "row " << r << " k " << k;
      }
    }
  EXPECT_EQ(scales[size_t(1 * kGroups)], 0u);  // the zero group
  // The outlier is its group's grid end.
  EXPECT_FLOAT_EQ(dequantized[size_t(2 * kCols + 40)], -7.0f * bf16_to_f32(scales[size_t(2 * kGroups + 1)]));

  auto backend = make_cpu_backend();
  TestTensor x = cpu_test::random_tensor(rng, DType::F32, 3, kCols, -1, 1);
  LinearWeight quantized{kRows,
                         kCols,
                         {},
                         Tensor::make(DType::I32, kRows, kCols / 8, packed.data()),
                         Tensor::make(DType::BF16, kRows, kGroups, scales.data()),
                         int(kGroup),
                         {}};
  LinearWeight dense{kRows, kCols, Tensor::make(DType::F32, kRows, kCols, dequantized.data()), {}, {}, 0, {}};
  TestTensor got(DType::F32, 3, kRows), want(DType::F32, 3, kRows);
  backend->linear(got.view(), x.view(), quantized);
  backend->linear(want.view(), x.view(), dense);
  EXPECT_LE(cpu_test::relative_max_error(got, cpu_test::reference_of(want)), 1e-6);
}

// Values that are not finite leave the scale to the finite ones: NaN becomes 0, +-Inf a grid end; ties round
// to even.
TEST(Int4Quantize, NonFiniteValuesAndTies) {
  std::vector<float> w(32, 0.0f);
  w[0] = 7.0f;  // the scale: 1
  w[1] = std::numeric_limits<float>::quiet_NaN();
  w[2] = std::numeric_limits<float>::infinity();
  w[3] = -std::numeric_limits<float>::infinity();
  w[4] = 2.5f;
  w[5] = -2.5f;
  w[6] = 3.5f;
  std::vector<uint32_t> packed(4);
  std::vector<uint16_t> scale(1);
  quantize_int4_rows(w.data(), 1, 32, 32, packed.data(), scale.data());
  EXPECT_EQ(bf16_to_f32(scale[0]), 1.0f);
  auto value = [&](int k) { return int((packed[size_t(k / 8)] >> (4 * (k % 8))) & 0xFu) - 8; };
  EXPECT_EQ(value(0), 7);
  EXPECT_EQ(value(1), 0);
  EXPECT_EQ(value(2), 7);
  EXPECT_EQ(value(3), -8);
  EXPECT_EQ(value(4), 2);
  EXPECT_EQ(value(5), -2);
  EXPECT_EQ(value(6), 4);
}

}  // namespace
}  // namespace qspec
