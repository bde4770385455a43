#include "backend/cuda/graph_profile.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "core/error.h"
#include "core/progress.h"

namespace qspec::cuda {

namespace {

constexpr int kReplays = 10;  // launches per timing (one event pair around them)
constexpr int kSweeps = 3;    // timings per prefix; the median is kept

struct Settings {
  std::string file;
  double max_ms = 12.0;
};

const Settings& settings() {
  static const Settings chosen = [] {
    Settings s;
    if (const char* file = std::getenv("QSPEC_GRAPH_PROFILE")) s.file = file;
    s.max_ms = env_number("QSPEC_GRAPH_PROFILE_MAX_MS", 0.0, 1e6).value_or(s.max_ms);
    return s;
  }();
  return chosen;
}

struct GraphDeleter {
  void operator()(CUgraph_st* graph) const { cudaGraphDestroy(graph); }
};
struct ExecDeleter {
  void operator()(CUgraphExec_st* exec) const { cudaGraphExecDestroy(exec); }
};
struct EventDeleter {
  void operator()(CUevent_st* event) const { cudaEventDestroy(event); }
};
using GraphHandle = std::unique_ptr<CUgraph_st, GraphDeleter>;
using ExecHandle = std::unique_ptr<CUgraphExec_st, ExecDeleter>;
using EventHandle = std::unique_ptr<CUevent_st, EventDeleter>;

EventHandle make_event() {
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreate(&event), "cudaEventCreate (graph profile)");
  return EventHandle(event);
}

// The nodes in an order where every node follows its dependencies (a captured stream: its launch order).
std::vector<cudaGraphNode_t> topological_order(cudaGraph_t graph) {
  size_t count = 0;
  check_cuda(cudaGraphGetNodes(graph, nullptr, &count), "cudaGraphGetNodes");
  std::vector<cudaGraphNode_t> nodes(count);
  check_cuda(cudaGraphGetNodes(graph, nodes.data(), &count), "cudaGraphGetNodes");
  size_t edges = 0;
  check_cuda(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges), "cudaGraphGetEdges");
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> data(edges);
  check_cuda(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edges), "cudaGraphGetEdges");
  std::map<cudaGraphNode_t, int> waiting;
  for (cudaGraphNode_t node : nodes) waiting[node] = 0;
  for (size_t e = 0; e < edges; ++e) ++waiting[to[e]];
  std::vector<cudaGraphNode_t> order;
  for (cudaGraphNode_t node : nodes)
    if (waiting[node] == 0) order.push_back(node);
  for (size_t i = 0; i < order.size(); ++i)
    for (size_t e = 0; e < edges; ++e)
      if (from[e] == order[i] && --waiting[to[e]] == 0) order.push_back(to[e]);
  return order;
}

// A kernel's function name without namespaces, template arguments or parameters; other nodes by type.
std::string node_name(cudaGraphNode_t node) {
  cudaGraphNodeType type{};
  check_cuda(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType");
  if (type == cudaGraphNodeTypeMemcpy) return "memcpy";
  if (type == cudaGraphNodeTypeMemset) return "memset";
  if (type != cudaGraphNodeTypeKernel) return fmt::format("node type {}", static_cast<int>(type));
  cudaKernelNodeParams params{};
  if (cudaGraphKernelNodeGetParams(node, &params) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return "library kernel";  // another module's (cuBLAS's): no runtime function to name
  }
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, params.func) != cudaSuccess || mangled == nullptr) {
    static_cast<void>(cudaGetLastError());
    return "kernel";
  }
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> demangled(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), &std::free);
  std::string name = status == 0 && demangled ? demangled.get() : mangled;
  for (size_t at; (at = name.find("(anonymous namespace)::")) != std::string::npos;) name.erase(at, 23);
  name = name.substr(0, name.find_first_of("<("));
  if (const size_t colon = name.rfind("::"); colon != std::string::npos) name = name.substr(colon + 2);
  if (const size_t space = name.rfind(' '); space != std::string::npos) name = name.substr(space + 1);
  return name;
}

// Milliseconds per replay of `exec`, the median of kSweeps timings of kReplays launches.
double replay_ms(cudaGraphExec_t exec, cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop) {
  std::vector<float> timings;
  for (int sweep = 0; sweep < kSweeps; ++sweep) {
    check_cuda(cudaEventRecord(start, stream), "cudaEventRecord (graph profile)");
    for (int r = 0; r < kReplays; ++r) check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch (profile)");
    check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord (graph profile)");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize (graph profile)");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime (graph profile)");
    timings.push_back(ms / kReplays);
  }
  std::sort(timings.begin(), timings.end());
  return timings[timings.size() / 2];
}

// The graph of the first `count` nodes of `order`.
ExecHandle prefix_exec(cudaGraph_t graph, const std::vector<cudaGraphNode_t>& order, size_t count) {
  cudaGraph_t clone = nullptr;
  check_cuda(cudaGraphClone(&clone, graph), "cudaGraphClone");
  GraphHandle owned(clone);
  for (size_t i = count; i < order.size(); ++i) {
    cudaGraphNode_t node = nullptr;
    check_cuda(cudaGraphNodeFindInClone(&node, order[i], clone), "cudaGraphNodeFindInClone");
    check_cuda(cudaGraphDestroyNode(node), "cudaGraphDestroyNode");
  }
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaGraphInstantiate(&exec, clone, 0), "cudaGraphInstantiate (profile)");
  return ExecHandle(exec);
}

}  // namespace

void profile_graph_if_asked(cudaGraph_t graph, cudaStream_t stream) {
  const Settings& s = settings();
  if (s.file.empty()) return;
  const std::vector<cudaGraphNode_t> order = topological_order(graph);
  EventHandle start = make_event(), stop = make_event();
  const ExecHandle whole = prefix_exec(graph, order, order.size());
  const double step_ms = replay_ms(whole.get(), stream, start.get(), stop.get());
  if (step_ms > s.max_ms) return;
  std::vector<double> node_us;
  std::vector<std::string> names;
  double before_ms = 0;
  Progress progress("profiling a step graph", static_cast<int64_t>(order.size()), "nodes");
  for (size_t k = 1; k <= order.size(); ++k) {
    const ExecHandle exec = prefix_exec(graph, order, k);
    const double ms = replay_ms(exec.get(), stream, start.get(), stop.get());
    node_us.push_back((ms - before_ms) * 1e3);
    names.push_back(node_name(order[k - 1]));
    before_ms = ms;
    progress.advance(1);
  }
  progress.finish();
  std::string line = fmt::format(R"({{"step_us": {:.2f}, "nodes": [)", step_ms * 1e3);
  for (size_t i = 0; i < names.size(); ++i)
    line += fmt::format(R"({}{{"kernel": "{}", "us": {:.2f}}})", i ? ", " : "", names[i], node_us[i]);
  line += "]}\n";
  std::ofstream file(s.file, std::ios::app);
  file << line;
  if (!file) fail("QSPEC_GRAPH_PROFILE: cannot append to {}", s.file);
}

}  // namespace qspec::cuda
