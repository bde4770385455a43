// Probe (not built by CMake; session 20): what one persistent kernel reaches when it streams AND computes the
// decode step's 128 body linears (the 4B's W4A16 g32 shapes, one row) with the one-row kernel's arithmetic,
// against the product's chain of one-row kernels (launch_row: PDL, cluster sums, in one graph). The
// persistent form reads x from a staged FP16 image in global memory (what a producer would write), so it has
// no staging; each warp takes every warps-th unit (tile, part of K) of each linear in turn, its register ring
// and L2 prefetch as in linear_row_kernel, and stores its unit's sums (no split sums: the bound of the
// streaming and the arithmetic). With barriers, a warp waits for every warp to be done with linear L - 1
// before it computes L (its first chunks of L are requested before the wait), as a persistent decode kernel
// would wait for its x. Values are not checked: this times shapes, not results.
//
// Build (after scripts/gpu.sh pack, which builds the libraries):
//   nvcc -std=c++20 -O3 -arch=sm_90a -Isrc -o build-cuda/arith_probe docs/attempts/persistent-arith-probe.cu \
//     build-cuda/libqspec_cuda.a build-cuda/libqspec_core.a -lfmt
#include <cstdio>
#include <vector>

#include "backend/cuda/linear_mma.cu"

namespace qspec::cuda {
namespace {

using ProbeWeights = PackedInt4Weights<__nv_bfloat16, ScaleLoad::Vector>;

#define PROBE_CHECK(call)                                                                  \
  do {                                                                                     \
    const cudaError_t e = (call);                                                          \
    if (e != cudaSuccess) {                                                                \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e));     \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

struct ProbeLinear {
  ProbeWeights weights;
  const uint32_t* x_values;  // the staged image of x: row_stage_words(chunks) words
  float* x_scales;           // its chunks' inverse scales
  float* out;                // [parts][n]
  int64_t n;
  int chunks, chunks_per_part, parts, tiles, units;
};

__device__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void __launch_bounds__(kThreads, kRowBlocksPerMultiprocessor)
    persistent_linears_kernel(const ProbeLinear* linears, int count, int barrier, unsigned* done) {
  wait_for_previous_kernel();
  allow_next_kernel();
  constexpr int kDepth = ProbeWeights::kRowRingDepth;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, g = lane / 4, q = lane % 4;
  const int warps = static_cast<int>(gridDim.x) * kWarps;
  const int w = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / kWarpSize;
  int first = 0;  // the global index of linear L's first unit: units are dealt round-robin across linears
  for (int L = 0; L < count; ++L) {
    const ProbeLinear p = linears[L];
    bool waited = !barrier || L == 0;
    auto wait_for_previous = [&] {
      if (waited) return;
      if (lane == 0)
        while (load_acquire(&done[L - 1]) < static_cast<unsigned>(warps)) __nanosleep(20);
      __syncwarp();
      waited = true;
    };
    for (int u = ((w - first) % warps + warps) % warps; u < p.units; u += warps) {
      const int part = u / p.tiles, tile = u - part * p.tiles;
      const int begin = part * p.chunks_per_part, end = min(p.chunks, begin + p.chunks_per_part);
      const int64_t feature = int64_t{tile} * kTileFeatures + g;
      const ProbeWeights::Rows rows = p.weights.rows(min64(feature, p.n - 1), min64(feature + 8, p.n - 1));
      ProbeWeights::Loaded ring[kDepth] = {};
#pragma unroll
      for (int j = 0; j < kDepth; ++j)
        if (begin + j < end) ring[j] = p.weights.load_whole(rows, begin + j, q);
      if (begin + kDepth < end) p.weights.prefetch_chunks(rows, begin + kDepth, end, q);
      wait_for_previous();
      const XStage x{const_cast<uint32_t*>(p.x_values), p.x_scales, 0, p.chunks};
      float acc[1][4] = {};
      for (int c = begin; c < end; c += kDepth) {
#pragma unroll
        for (int s = 0; s < kDepth; s += 2) {
          const int chunk = c + s;
          if (chunk >= end) break;
          float sums[2][1][4] = {};
#pragma unroll
          for (int i = 0; i < 2; ++i) multiply_row_chunk<ProbeWeights>(sums[i], ring[s + i], x, min(chunk + i, end - 1), q);
#pragma unroll
          for (int i = 0; i < 2; ++i)
            if (chunk + i + kDepth < end) ring[s + i] = p.weights.load_whole(rows, chunk + i + kDepth, q);
#pragma unroll
          for (int i = 0; i < 2; ++i)
            if (chunk + i < end) {
              const float inverse = x.scales[chunk + i];
              fold_chunk<1>(acc, sums[i], {{inverse, inverse}});
            }
        }
      }
      if (q == 0) {
        p.out[part * p.n + min64(feature, p.n - 1)] = acc[0][0];
        p.out[part * p.n + min64(feature + 8, p.n - 1)] = acc[0][2];
      }
    }
    if (barrier) {
      wait_for_previous();  // done with L means done with everything before it
      __syncwarp();
      if (lane == 0) {
        __threadfence();
        atomicAdd(&done[L], 1u);
      }
    }
    first = (first + p.units) % warps;
  }
}

double time_graph(cudaStream_t stream, cudaGraph_t graph) {
  cudaGraphExec_t exec;
  PROBE_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) PROBE_CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t a, b;
  PROBE_CHECK(cudaEventCreate(&a));
  PROBE_CHECK(cudaEventCreate(&b));
  constexpr int kRuns = 10;
  PROBE_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < kRuns; ++i) PROBE_CHECK(cudaGraphLaunch(exec, stream));
  PROBE_CHECK(cudaEventRecord(b, stream));
  PROBE_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  PROBE_CHECK(cudaEventElapsedTime(&ms, a, b));
  PROBE_CHECK(cudaGraphExecDestroy(exec));
  PROBE_CHECK(cudaGraphDestroy(graph));
  return ms * 1000.0 / kRuns;
}

int run() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  int sms = 0;
  PROBE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct Shape {
    int64_t n, k;
  };
  const Shape layer[] = {{12288, 2560}, {2560, 4096}, {18432, 2560}, {2560, 9216}};  // qkvz, out, gate|up, down
  std::vector<Shape> shapes;
  for (int l = 0; l < 32; ++l)
    for (const Shape& s : layer) shapes.push_back(s);

  cudaStream_t stream;
  PROBE_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int64_t resident_units = int64_t{kRowBlocksPerMultiprocessor} * sms * kWarps;
  std::vector<ProbeLinear> host;
  std::vector<Tensor> outs, xs;
  std::vector<LinearWeight> weights;
  double bytes = 0;
  float* partials = nullptr;
  PROBE_CHECK(cudaMalloc(&partials, sizeof(float) * 64 * 18432));
  for (const Shape& s : shapes) {
    const int64_t words = s.k / 8, groups = s.k / 32;
    uint32_t* packed = nullptr;
    __nv_bfloat16* scales = nullptr;
    float *x = nullptr, *out = nullptr, *x_scales = nullptr;
    uint32_t* x_values = nullptr;
    PROBE_CHECK(cudaMalloc(&packed, sizeof(uint32_t) * s.n * words));
    PROBE_CHECK(cudaMalloc(&scales, sizeof(__nv_bfloat16) * s.n * groups));
    PROBE_CHECK(cudaMalloc(&x, sizeof(float) * s.k));
    PROBE_CHECK(cudaMalloc(&out, sizeof(float) * 16 * s.n));
    const int64_t chunks = s.k / kChunkK;
    PROBE_CHECK(cudaMalloc(&x_values, sizeof(uint32_t) * row_stage_words<XForm::Fp16Scaled>(chunks)));
    PROBE_CHECK(cudaMalloc(&x_scales, sizeof(float) * chunks));
    PROBE_CHECK(cudaMemset(packed, 0x5A, sizeof(uint32_t) * s.n * words));
    PROBE_CHECK(cudaMemset(scales, 0x3C, sizeof(__nv_bfloat16) * s.n * groups));
    PROBE_CHECK(cudaMemset(x, 0x3C, sizeof(float) * s.k));
    PROBE_CHECK(cudaMemset(x_values, 0x3C, sizeof(uint32_t) * row_stage_words<XForm::Fp16Scaled>(chunks)));
    PROBE_CHECK(cudaMemset(x_scales, 0x3C, sizeof(float) * chunks));
    bytes += double(s.n) * double(words) * 4 + double(s.n) * double(groups) * 2;
    LinearWeight w{s.n, s.k, {}, Tensor{DType::U32, s.n, words, words, packed},
                   Tensor{DType::BF16, s.n, groups, groups, scales}, 32, {}};
    weights.push_back(w);
    outs.push_back(Tensor{DType::F32, 1, s.n, s.n, out});
    xs.push_back(Tensor{DType::F32, 1, s.k, s.k, x});
    // The units as launch_row chooses them.
    const MmaSplit split = mma_split(s.n, s.k, 0);
    const int64_t tiles = (s.n + kTileFeatures - 1) / kTileFeatures;
    int64_t splits_per_part = 2;
    while (splits_per_part < split.splits &&
           tiles * ((split.splits + splits_per_part - 1) / splits_per_part) > resident_units)
      ++splits_per_part;
    const int64_t chunks_per_part = std::min(split.splits, splits_per_part) * split.chunks_per_split;
    const int64_t parts = (split.chunks + chunks_per_part - 1) / chunks_per_part;
    const ProbeWeights pw{packed, words, scales, groups, 1, s.k / kBlockK};
    host.push_back({pw, x_values, x_scales, out, s.n, static_cast<int>(chunks), static_cast<int>(chunks_per_part),
                    static_cast<int>(parts), static_cast<int>(tiles), static_cast<int>(tiles * parts)});
  }
  std::printf("%zu linears, %.3f GB; at 4.16 TB/s %.1f us\n", shapes.size(), bytes / 1e9, bytes / 4.16e6);
  ProbeLinear* device_linears = nullptr;
  PROBE_CHECK(cudaMalloc(&device_linears, sizeof(ProbeLinear) * host.size()));
  PROBE_CHECK(cudaMemcpy(device_linears, host.data(), sizeof(ProbeLinear) * host.size(), cudaMemcpyHostToDevice));
  unsigned* done = nullptr;
  PROBE_CHECK(cudaMalloc(&done, sizeof(unsigned) * host.size()));

  // The product's chain: one one-row kernel a linear (cluster sums where split), PDL, one graph.
  const LinearMmaWorkspace workspace{partials};
  for (int rounds = 0; rounds < 2; ++rounds) {
    cudaGraph_t graph;
    PROBE_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (size_t i = 0; i < shapes.size(); ++i)
      PROBE_CHECK(launch_linear_mma(outs[i], xs[i], weights[i], workspace, stream, {}));
    PROBE_CHECK(cudaStreamEndCapture(stream, &graph));
    const double us = time_graph(stream, graph);
    std::printf("chain of one-row kernels          %8.1f us  %5.2f TB/s\n", us, bytes / us / 1e6);

    int fit = 0;
    PROBE_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, persistent_linears_kernel, kThreads, 0));
    for (int blocks_per_sm : {fit, 3, 2})
      for (int barrier = 0; barrier < 2; ++barrier) {
        if (blocks_per_sm > fit) continue;
        PROBE_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        PROBE_CHECK(cudaMemsetAsync(done, 0, sizeof(unsigned) * host.size(), stream));
        PROBE_CHECK(launch_kernel(persistent_linears_kernel, static_cast<unsigned>(sms * blocks_per_sm), kThreads,
                                  0, stream, static_cast<const ProbeLinear*>(device_linears),
                                  static_cast<int>(host.size()), barrier, done));
        PROBE_CHECK(cudaStreamEndCapture(stream, &graph));
        const double t = time_graph(stream, graph);
        std::printf("persistent, %d blocks an SM %-9s %8.1f us  %5.2f TB/s\n", blocks_per_sm,
                    barrier ? "barriers" : "", t, bytes / t / 1e6);
      }
  }
  return 0;
}

}  // namespace
}  // namespace qspec::cuda

int main() {
  return qspec::cuda::run();
}
