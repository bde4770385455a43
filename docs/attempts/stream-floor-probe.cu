// Probe (not built; session 19): how fast a decode step's 128 body linears (the 4B's W4A16 g32 sizes) and the
// head can be streamed: one kernel each, chained with PDL in one graph (register loads vs TMA bulk copies into
// shared-memory rings, and what a dependent node between linears costs), and one persistent kernel streaming
// them all (with PROBE_PERSISTENT_ONLY set, only the first table and the persistent forms). Build: nvcc
// -std=c++17 -O3 -arch=sm_90a -o stream_probe docs/attempts/stream-floor-probe.cu. Results: cuda-ops-notes.md
// rows 20261201-1537 and -1632 (the persistent form's barrier variants with the occupancy-sized grid are not
// yet run).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      printf("error %s line %d: %s\n", #x, __LINE__, cudaGetErrorString(e_));          \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_allow() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int U>
__global__ void stream_regs(const uint4* w, int64_t n16, uint32_t* out) {
  const int64_t nw = blockDim.x / 32, warps = gridDim.x * nw;
  const int64_t wid = blockIdx.x * nw + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  int64_t per = (n16 + warps - 1) / warps;
  per = (per + 31) / 32 * 32;
  const int64_t b = wid * per, e = min(n16, b + per);
  uint32_t acc = 0;
  uint4 r[U];
  int64_t i = b + lane;
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int64_t j = i + u * 32;
    r[u] = j < e ? ldg_stream(w + j) : make_uint4(0, 0, 0, 0);
  }
  pdl_wait();
  pdl_allow();
  for (; i < e; i += U * 32) {
#pragma unroll
    for (int u = 0; u < U; u++) acc ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t j = i + U * 32 + u * 32;
      r[u] = j < e ? ldg_stream(w + j) : make_uint4(0, 0, 0, 0);
    }
  }
  if (acc == 0x12345678u) out[wid * 32 + lane] = acc;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT%=;\n}" ::"r"(
          smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// Each warp streams its contiguous byte range through a ring of D stages of its own (lane 0 issues).
template <int D>
__global__ void stream_tma(const uint8_t* w, int64_t nbytes, int stage_bytes, uint32_t* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int nw = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem) + warp * D;
  uint8_t* ring = smem + 1024 + static_cast<size_t>(warp) * D * stage_bytes;
  const int64_t warps = int64_t{gridDim.x} * nw, wid = int64_t{blockIdx.x} * nw + warp;
  int64_t per = (nbytes + warps - 1) / warps;
  per = (per + 15) / 16 * 16;
  const int64_t b = min(nbytes, wid * per), e = min(nbytes, b + per);
  const int64_t stages = (e - b + stage_bytes - 1) / stage_bytes;
  auto issue = [&](int64_t s) {
    const int slot = static_cast<int>(s % D);
    const int64_t off = b + s * stage_bytes;
    const auto bytes = static_cast<uint32_t>(min(int64_t{stage_bytes}, e - off));
    mbar_expect_tx(&bars[slot], bytes);
    bulk_copy(ring + static_cast<size_t>(slot) * stage_bytes, w + off, bytes, &bars[slot]);
  };
  if (lane == 0) {
    for (int d = 0; d < D; d++) mbar_init(&bars[d], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  if (lane == 0)
    for (int64_t s = 0; s < min(int64_t{D}, stages); s++) issue(s);
  pdl_wait();
  pdl_allow();
  uint32_t acc = 0;
  for (int64_t s = 0; s < stages; s++) {
    const int slot = static_cast<int>(s % D);
    mbar_wait(&bars[slot], static_cast<uint32_t>((s / D) & 1));
    const int64_t off = b + s * stage_bytes;
    const int bytes = static_cast<int>(min(int64_t{stage_bytes}, e - off));
    const uint4* v = reinterpret_cast<const uint4*>(ring + static_cast<size_t>(slot) * stage_bytes);
    for (int i = lane; i < bytes / 16; i += 32) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    __syncwarp();
    if (lane == 0 && s + D < stages) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue(s + D);
    }
  }
  if (acc == 0x12345678u) out[wid * 32 + lane] = acc;
}

// A persistent form: one kernel streams every linear, each warp its share of each in order through one ring
// that runs across linears (weights never wait); with `barrier`, a grid-wide barrier (every warp arrives on a
// counter) between linears before a warp reads the next one's stages, as a persistent decode kernel would
// wait for x.
struct Linear {
  const uint8_t* p;
  int64_t bytes;
};

struct WarpCursor {
  int linear = 0;
  int64_t stage = 0, stages = 0, begin = 0, end = 0;
  __device__ void enter(const Linear* lins, int count, int64_t wid, int64_t warps, int stage_bytes) {
    for (; linear < count; ++linear) {
      int64_t per = (lins[linear].bytes + warps - 1) / warps;
      per = (per + 15) / 16 * 16;
      begin = min(lins[linear].bytes, wid * per);
      end = min(lins[linear].bytes, begin + per);
      stages = (end - begin + stage_bytes - 1) / stage_bytes;
      stage = 0;
      if (stages > 0) return;
    }
  }
  __device__ void advance(const Linear* lins, int count, int64_t wid, int64_t warps, int stage_bytes) {
    if (++stage < stages) return;
    ++linear;
    enter(lins, count, wid, warps, stage_bytes);
  }
};

template <int D>
__global__ void stream_persistent(const Linear* lins, int count, int stage_bytes, int barrier, unsigned* counter,
                                  uint32_t* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int nw = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem) + warp * D;
  uint8_t* ring = smem + 1024 + static_cast<size_t>(warp) * D * stage_bytes;
  const int64_t warps = int64_t{gridDim.x} * nw, wid = int64_t{blockIdx.x} * nw + warp;
  WarpCursor issued, used;
  issued.enter(lins, count, wid, warps, stage_bytes);
  used.enter(lins, count, wid, warps, stage_bytes);
  int64_t issued_count = 0;
  auto issue = [&]() {
    const int slot = static_cast<int>(issued_count % D);
    const int64_t off = issued.begin + issued.stage * stage_bytes;
    const auto bytes = static_cast<uint32_t>(min(int64_t{stage_bytes}, issued.end - off));
    mbar_expect_tx(&bars[slot], bytes);
    bulk_copy(ring + static_cast<size_t>(slot) * stage_bytes, lins[issued.linear].p + off, bytes, &bars[slot]);
    ++issued_count;
    issued.advance(lins, count, wid, warps, stage_bytes);
  };
  if (lane == 0) {
    for (int d = 0; d < D; d++) mbar_init(&bars[d], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  if (lane == 0)
    for (int d = 0; d < D && issued.linear < count; d++) issue();
  pdl_wait();
  pdl_allow();
  uint32_t acc = 0;
  int current = used.linear;
  for (int64_t k = 0; used.linear < count; k++) {
    if (barrier && used.linear != current) {
      for (; current < used.linear; ++current) {
        __syncwarp();
        if (lane == 0) {
          __threadfence();
          atomicAdd(counter, 1u);
          const unsigned target = static_cast<unsigned>((current + 1) * warps);
          while (*reinterpret_cast<volatile unsigned*>(counter) < target) __nanosleep(20);
        }
        __syncwarp();
      }
    }
    const int slot = static_cast<int>(k % D);
    mbar_wait(&bars[slot], static_cast<uint32_t>((k / D) & 1));
    const int64_t off = used.begin + used.stage * stage_bytes;
    const int bytes = static_cast<int>(min(int64_t{stage_bytes}, used.end - off));
    const uint4* v = reinterpret_cast<const uint4*>(ring + static_cast<size_t>(slot) * stage_bytes);
    for (int i = lane; i < bytes / 16; i += 32) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    __syncwarp();
    if (lane == 0 && issued.linear < count) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue();
    }
    used.advance(lins, count, wid, warps, stage_bytes);
  }
  if (acc == 0x12345678u) out[wid * 32 + lane] = acc;
}

// A norm-like node between linears: one block reads and writes a 2560-float row.
template <bool kEarly>
__global__ void row_node(const float* x, float* y) {
  if (kEarly) pdl_allow();
  pdl_wait();
  if (!kEarly) pdl_allow();
  float s = 0;
  for (int i = threadIdx.x; i < 2560; i += blockDim.x) s += x[i] * x[i];
  for (int i = threadIdx.x; i < 2560; i += blockDim.x) y[i] = x[i] * (s > 1e30f ? 0.5f : 1.0f);
}

template <typename K, typename... A>
void launch(K kernel, int grid, int threads, size_t shared, cudaStream_t st, A... args) {
  cudaLaunchConfig_t c{};
  c.gridDim = dim3(grid);
  c.blockDim = dim3(threads);
  c.dynamicSmemBytes = shared;
  c.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  c.attrs = at;
  c.numAttrs = 1;
  CK(cudaLaunchKernelEx(&c, kernel, args...));
}

// Instantiates the captured graph, runs it 3 times, then times 10 runs: microseconds a run.
double time_graph(cudaStream_t st, cudaGraph_t graph) {
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(exec, st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int reps = 10;
  CK(cudaEventRecord(a, st));
  for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(exec, st));
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ms * 1000 / reps;
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double mb = 1e6;
  const std::vector<double> layer = {17.8 * mb, 5.9 * mb, 26.5 * mb, 13.3 * mb};
  std::vector<int64_t> sizes;
  for (int l = 0; l < 32; l++)
    for (double s : layer) sizes.push_back(static_cast<int64_t>(s) / 4096 * 4096);
  const int64_t head = 248320LL * 2560 * 2;
  int64_t body = 0;
  for (auto s : sizes) body += s;
  uint8_t* buf = nullptr;
  CK(cudaMalloc(&buf, body + head));
  CK(cudaMemset(buf, 1, body + head));
  uint32_t* out = nullptr;
  CK(cudaMalloc(&out, 64 << 20));
  float *x = nullptr, *y = nullptr;
  CK(cudaMalloc(&x, 4 * 2560 * 2));
  y = x + 2560;
  CK(cudaMemset(x, 0, 4 * 2560 * 2));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  printf("body %.3f GB in %zu linears, head %.3f GB; ideal at 4.16 TB/s: body %.1f us, head %.1f us\n",
         body / 1e9, sizes.size(), head / 1e9, body / 4.16e6, head / 4.16e6);

  struct Config {
    std::string name;
    std::function<void(const uint8_t*, int64_t)> run;
  };
  auto regs = [&](int u, int warps, int blocks_per_sm) {
    return [=, &st](const uint8_t* p, int64_t n) {
      const int grid = sms * blocks_per_sm;
      if (u == 4)
        launch(stream_regs<4>, grid, warps * 32, 0, st, reinterpret_cast<const uint4*>(p), n / 16, out);
      else if (u == 8)
        launch(stream_regs<8>, grid, warps * 32, 0, st, reinterpret_cast<const uint4*>(p), n / 16, out);
      else
        launch(stream_regs<16>, grid, warps * 32, 0, st, reinterpret_cast<const uint4*>(p), n / 16, out);
    };
  };
  auto tma = [&](int stage, int depth, int warps, int blocks_per_sm) {
    const size_t shared = 1024 + static_cast<size_t>(warps) * depth * stage;
    if (depth == 4) CK(cudaFuncSetAttribute(stream_tma<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    if (depth == 8) CK(cudaFuncSetAttribute(stream_tma<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    if (depth == 2) CK(cudaFuncSetAttribute(stream_tma<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    return [=, &st](const uint8_t* p, int64_t n) {
      const int grid = sms * blocks_per_sm;
      if (depth == 4)
        launch(stream_tma<4>, grid, warps * 32, shared, st, p, n, stage, out);
      else if (depth == 8)
        launch(stream_tma<8>, grid, warps * 32, shared, st, p, n, stage, out);
      else
        launch(stream_tma<2>, grid, warps * 32, shared, st, p, n, stage, out);
    };
  };
  std::vector<Config> configs = {
      {"regs u8 w4 b8", regs(8, 4, 8)},        {"regs u4 w4 b16", regs(4, 4, 16)},
      {"tma 4K d4 w4 b3", tma(4096, 4, 4, 3)}, {"tma 8K d2 w4 b3", tma(8192, 2, 4, 3)},
      {"tma 8K d2 w4 b2", tma(8192, 2, 4, 2)}, {"tma 4K d4 w4 b1", tma(4096, 4, 4, 1)},
  };
  // with_nodes: 0 none; 1 one node (trigger after wait); 2 one node (trigger first); 3 two nodes, late;
  // 4 two nodes, early; 5 two nodes of 132 blocks, early; 6 the same, late
  const char* node_names[] = {"", "+1late", "+1early", "+2late", "+2early", "+2x132e", "+2x132l"};
  const int node_variants = getenv("PROBE_PERSISTENT_ONLY") ? 1 : 7;
  for (int with_nodes = 0; with_nodes < node_variants; with_nodes++)
    for (auto& c : configs)
      for (int part = 0; part < (with_nodes == 0 ? 2 : 1); part++) {  // 0: body, 1: head alone
        cudaGraph_t graph;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        if (part == 0) {
          int64_t off = 0;
          for (auto s : sizes) {
            c.run(buf + off, s);
            const int count = with_nodes <= 2 ? with_nodes > 0 : 2;
            const bool early = with_nodes == 2 || with_nodes == 4 || with_nodes == 5;
            const int blocks = with_nodes >= 5 ? sms : 1;
            for (int k = 0; k < count; k++) {
              if (early)
                launch(row_node<true>, blocks, 256, 0, st, (const float*)x, y);
              else
                launch(row_node<false>, blocks, 256, 0, st, (const float*)x, y);
            }
            off += s;
          }
        } else {
          c.run(buf + body, head);
        }
        CK(cudaStreamEndCapture(st, &graph));
        const double us = time_graph(st, graph);
        const double bytes = part == 0 ? body : head;
        printf("%-8s %-18s %-5s %8.1f us  %6.2f TB/s\n", node_names[with_nodes], c.name.c_str(),
               part == 0 ? "body" : "head", us, bytes / us / 1e6);
      }
  // The persistent form over the body (and the body + head), without and with a grid barrier per linear.
  std::vector<Linear> host_linears;
  {
    int64_t off = 0;
    for (auto sz : sizes) host_linears.push_back({buf + off, sz}), off += sz;
  }
  for (int with_head = 0; with_head < 2; with_head++) {
    std::vector<Linear> lins = host_linears;
    if (with_head) lins.push_back({buf + body, head});
    Linear* device_linears = nullptr;
    CK(cudaMalloc(&device_linears, lins.size() * sizeof(Linear)));
    CK(cudaMemcpy(device_linears, lins.data(), lins.size() * sizeof(Linear), cudaMemcpyHostToDevice));
    unsigned* counter = nullptr;
    CK(cudaMalloc(&counter, sizeof(unsigned)));
    struct P {
      int stage, depth, warps, blocks;
    };
    for (const P& pc : {P{8192, 2, 4, 3}, P{4096, 4, 4, 3}, P{16384, 2, 4, 1}, P{8192, 4, 4, 1}})
      for (int barrier = 0; barrier < 2; barrier++) {
        const size_t shared = 1024 + static_cast<size_t>(pc.warps) * pc.depth * pc.stage;
        CK(cudaFuncSetAttribute(stream_persistent<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
        CK(cudaFuncSetAttribute(stream_persistent<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
        cudaGraph_t graph;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        CK(cudaMemsetAsync(counter, 0, sizeof(unsigned), st));
        const int count = static_cast<int>(lins.size());
        // The barrier needs every block resident at once: the grid is what the occupancy query allows (the
        // session 19 run without this query hung in its first barrier variant).
        int fit = 0;
        CK(cudaFuncSetAttribute(stream_persistent<2>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
        CK(cudaFuncSetAttribute(stream_persistent<4>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
        if (pc.depth == 2)
          CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, stream_persistent<2>, pc.warps * 32, shared));
        else
          CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, stream_persistent<4>, pc.warps * 32, shared));
        const int grid = sms * std::min(pc.blocks, fit);
        if (pc.depth == 2)
          launch(stream_persistent<2>, grid, pc.warps * 32, shared, st, (const Linear*)device_linears, count,
                 pc.stage, barrier, counter, out);
        else
          launch(stream_persistent<4>, grid, pc.warps * 32, shared, st, (const Linear*)device_linears, count,
                 pc.stage, barrier, counter, out);
        CK(cudaStreamEndCapture(st, &graph));
        const double us = time_graph(st, graph);
        const double bytes = static_cast<double>(body) + (with_head ? static_cast<double>(head) : 0.0);
        printf("persistent %s %dK d%d w%d b%d %-8s %8.1f us  %6.2f TB/s\n", with_head ? "body+head" : "body",
               pc.stage / 1024, pc.depth, pc.warps, pc.blocks, barrier ? "barriers" : "", us, bytes / us / 1e6);
      }
  }
  return 0;
}
