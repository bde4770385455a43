// The CPU argmax op against std::max_element (NaN rows: the first NaN, as torch.argmax), on random rows,
// ties, NaN, infinities, signed zeros and strided views; its bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "backend/argmax.h"
#include "cpu_op_testing.h"

namespace qspec {
namespace {

using cpu_test::expect_error;
using cpu_test::TestTensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The first NaN if the row has one, else the first of the largest values (std::max_element keeps the first).
int32_t reference_argmax(const std::vector<float>& row) {
  auto nan = std::find_if(row.begin(), row.end(), [](float v) { return std::isnan(v); });
  if (nan != row.end()) return static_cast<int32_t>(nan - row.begin());
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Runs the op on `rows` (each of the same length) stored with `stride` (NaN padding) into an out_ids column
// of `id_stride` and checks every id against the reference and that the rest of out_ids is untouched.
void expect_argmax(const std::vector<std::vector<float>>& rows, int64_t stride, int64_t id_stride) {
  const auto count = static_cast<int64_t>(rows.size());
  const auto vocab = static_cast<int64_t>(rows.front().size());
  TestTensor logits(DType::F32, count, vocab, stride);
  for (int64_t r = 0; r < count; ++r)
    for (int64_t i = 0; i < vocab; ++i) logits.set(r, i, rows[size_t(r)][size_t(i)]);
  TestTensor ids(DType::I32, count, id_stride);
  for (int64_t r = 0; r < count; ++r)
    for (int64_t c = 0; c < id_stride; ++c) ids.set(r, c, -7);
  const Tensor out_ids{DType::I32, count, 1, id_stride, ids.view().data};
  make_cpu_backend()->argmax(out_ids, logits.view());
  for (int64_t r = 0; r < count; ++r) {
    EXPECT_EQ(ids.get(r, 0), reference_argmax(rows[size_t(r)])) << "row " << r << " of " << count;
    for (int64_t c = 1; c < id_stride; ++c) EXPECT_EQ(ids.get(r, c), -7) << "row " << r << " column " << c;
  }
}

TEST(CpuArgmax, RandomRowsEqualMaxElement) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> uniform(-30.0f, 30.0f);
  for (int64_t vocab : {1, 2, 7, 8193, 248320}) {
    for (int count : {1, 15, 16}) {
      std::vector<std::vector<float>> rows(static_cast<size_t>(count),
                                           std::vector<float>(static_cast<size_t>(vocab)));
      for (auto& row : rows)
        for (float& v : row) v = uniform(rng);
      SCOPED_TRACE(testing::Message() << "V=" << vocab << " rows=" << count);
      expect_argmax(rows, vocab, 1);
    }
  }
}

TEST(CpuArgmax, TiesTakeTheLowestIndex) {
  std::vector<float> row(1000, 0.25f);
  row[999] = row[17] = row[600] = 3.0f;
  const std::vector<float> zeros = {-1.0f, -0.0f, 0.0f, -0.0f, -2.0f};  // -0 == +0: the first zero
  const std::vector<float> minus_inf(5, -kInf);                         // all equal: index 0
  const std::vector<float> plus_inf = {1.0f, kInf, 2.0f, kInf, 0.0f};
  EXPECT_EQ(reference_argmax(row), 17);
  EXPECT_EQ(reference_argmax(zeros), 1);
  EXPECT_EQ(reference_argmax(minus_inf), 0);
  EXPECT_EQ(reference_argmax(plus_inf), 1);
  expect_argmax({row}, 1000, 1);
  expect_argmax({zeros, minus_inf, plus_inf}, 5, 1);
}

TEST(CpuArgmax, FirstNaNWins) {
  const std::vector<std::vector<float>> rows = {
      {kNaN, 5.0f, 1.0f, 2.0f},   // NaN first
      {1.0f, 9.0f, kNaN, kNaN},   // the first of two, after a larger number
      {kInf, 0.0f, 1.0f, kNaN},   // above +inf
      {-kInf, 3.0f, 3.0f, 0.5f},  // no NaN: the first of the tie
  };
  EXPECT_EQ(reference_argmax(rows[0]), 0);
  EXPECT_EQ(reference_argmax(rows[1]), 2);
  EXPECT_EQ(reference_argmax(rows[2]), 3);
  EXPECT_EQ(reference_argmax(rows[3]), 1);
  expect_argmax(rows, 4, 1);
}

TEST(CpuArgmax, StridedLogitsAndIdsReadAndWriteOnlyTheirView) {
  std::mt19937 rng(22);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<std::vector<float>> rows(3, std::vector<float>(301));
  for (auto& row : rows)
    for (float& v : row) v = uniform(rng);
  // The logits' padding holds NaN: reading past a row's 301 columns would return a padding index.
  expect_argmax(rows, 320, 3);
}

TEST(CpuArgmax, BadArguments) {
  auto backend = make_cpu_backend();
  TestTensor logits(DType::F32, 2, 10), ids(DType::I32, 2, 1);
  expect_error([&] { backend->argmax(ids.view(), TestTensor(DType::I32, 2, 10).view()); },
               {"argmax", "logits must be F32, got I32"});
  expect_error([&] { backend->argmax(TestTensor(DType::F32, 2, 1).view(), logits.view()); },
               {"argmax", "out_ids must be I32, got F32"});
  expect_error([&] { backend->argmax(TestTensor(DType::I32, 3, 1).view(), logits.view()); },
               {"argmax", "out_ids has shape [3, 1], expected [2, 1]"});
  expect_error([&] { backend->argmax(TestTensor(DType::I32, 2, 2).view(), logits.view()); },
               {"argmax", "out_ids has shape [2, 2], expected [2, 1]"});
  expect_error([&] { backend->argmax(ids.view(), TestTensor(DType::F32, 2, 0).view()); },
               {"argmax", "logits has 0 columns, expected 1 to 2147483647"});
  // A row too wide for I32 ids is refused before any element is read.
  const Tensor too_wide{DType::F32, 1, int64_t{1} << 31, int64_t{1} << 31, logits.view().data};
  expect_error([&] { backend->argmax(ids.view().rows_view(0, 1), too_wide); },
               {"argmax", "logits has 2147483648 columns"});
}

TEST(CpuArgmax, RowRuleRefusesAnEmptyRow) {
  expect_error([] { argmax(std::span<const float>()); }, {"argmax: empty row"});
}

}  // namespace
}  // namespace qspec
