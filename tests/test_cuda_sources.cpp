// The rule of programmatic dependent launch (src/backend/cuda/pdl.cuh), checked on the sources so that CI,
// which has no GPU, catches a kernel that would race with the one before it: every __global__ function's body
// starts with wait_for_previous_kernel(); allow_next_kernel(); and no launch bypasses launch_kernel() (a
// triple-chevron launch would carry no PDL attribute and slip past the review of this rule).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kCudaSources = fs::path(QSPEC_SOURCE_DIR) / "backend" / "cuda";

// The file's text with // comments removed (the rule's own description mentions what it forbids).
std::string code_of(const fs::path& path) {
  std::ifstream in(path);
  std::string code, line;
  while (std::getline(in, line)) code += line.substr(0, line.find("//")) + "\n";
  return code;
}

std::vector<fs::path> cuda_sources() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(kCudaSources)) {
    const std::string ext = entry.path().extension().string();
    if (ext == ".cu" || ext == ".cuh" || ext == ".cpp" || ext == ".h") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string without_spaces(std::string text) {
  std::erase_if(text, [](unsigned char c) { return std::isspace(c); });
  return text;
}

int line_of(const std::string& code, size_t pos) {
  return 1 +
         static_cast<int>(std::count(code.begin(), code.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
}

// Kernels that request their first weights before the wait (pdl.cuh) must still wait, in the kernel's own
// body, before their first read of anything else: the call or read named here.
struct WeightsFirst {
  std::string kernel, first_other_read;
};
const std::vector<WeightsFirst> kWeightsBeforeWait = {
    {"linear_mma_kernel(", "stage_x"},           {"linear_ring_kernel(", "stage_item_x"},
    {"linear_ring_tma_kernel(", "stage_item_x"}, {"linear_row_kernel(", "stage_x"},
    {"gdn_mixer_kernel(", "load_state_block"},   {"gdn_mixer_finish_kernel(", "a.norm_partials"},
    {"w4a16_gemm_kernel(", "a.x + image"}};

// The kernels whose next launch is cuBLAS's only wait (pdl.cuh).
const std::vector<std::string> kWaitOnly = {"rows_to_bf16_kernel(", "dequantize_w4a16_kernel("};
// A kernel whose next launch is cuBLAS's in some calls lets the next one in through this call instead.
const std::string kAllowUnlessCublas = "wait_for_previous_kernel();allow_next_kernel_unless_cublas_next(";

bool named(const std::string& head, const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& name) { return head.find(name) != std::string::npos; });
}

TEST(CudaSources, EveryKernelWaitsForThePreviousOneFirst) {
  const std::string prologue = "wait_for_previous_kernel();allow_next_kernel();";
  int kernels = 0, weights_first = 0, wait_only = 0;
  for (const fs::path& file : cuda_sources()) {
    const std::string code = code_of(file);
    for (size_t at = code.find("__global__"); at != std::string::npos; at = code.find("__global__", at + 1)) {
      ++kernels;
      const size_t body = code.find('{', at);
      ASSERT_NE(body, std::string::npos) << file << ":" << line_of(code, at);
      const std::string head = code.substr(at, body - at);
      if (named(head, kWaitOnly)) {
        ++wait_only;
        const size_t end = code.find("\n}", body);
        const std::string text = without_spaces(code.substr(body + 1, end - body));
        EXPECT_TRUE(text.starts_with("wait_for_previous_kernel();") &&
                    text.find("allow_next_kernel") == std::string::npos)
            << file.filename().string() << ":" << line_of(code, at)
            << ": waits first, lets no kernel in early";
        continue;
      }
      const auto weights =
          std::find_if(kWeightsBeforeWait.begin(), kWeightsBeforeWait.end(),
                       [&](const WeightsFirst& k) { return head.find(k.kernel) != std::string::npos; });
      if (weights != kWeightsBeforeWait.end()) {
        ++weights_first;
        const size_t read = code.find(weights->first_other_read, body);
        ASSERT_NE(read, std::string::npos) << file.filename().string() << ":" << line_of(code, at);
        const std::string before_read = without_spaces(code.substr(body, read - body));
        EXPECT_NE(before_read.find(prologue), std::string::npos)
            << file.filename().string() << ":" << line_of(code, at) << ": waits before "
            << weights->first_other_read;
        continue;
      }
      const std::string start = without_spaces(code.substr(body + 1, 4 * prologue.size()));
      EXPECT_TRUE(start.starts_with(prologue) || start.starts_with(kAllowUnlessCublas))
          << file.filename().string() << ":" << line_of(code, at)
          << ": a kernel's first statements must be wait_for_previous_kernel(); allow_next_kernel(); "
             "(or allow_next_kernel_unless_cublas_next(...); pdl.cuh)";
    }
  }
  EXPECT_GT(kernels, 0) << "no __global__ function found under " << kCudaSources;
  EXPECT_EQ(weights_first, static_cast<int>(kWeightsBeforeWait.size()));
  EXPECT_EQ(wait_only, static_cast<int>(kWaitOnly.size()));
}

TEST(CudaSources, EveryLaunchGoesThroughLaunchKernel) {
  for (const fs::path& file : cuda_sources()) {
    const std::string code = code_of(file);
    const size_t chevrons = code.find("<<<");
    EXPECT_EQ(chevrons, std::string::npos)
        << file.filename().string() << ":" << line_of(code, chevrons)
        << ": launch through launch_kernel() (pdl.cuh), which adds the PDL attribute";
  }
}

}  // namespace
