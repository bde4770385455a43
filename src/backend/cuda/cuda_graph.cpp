#include "backend/cuda/cuda_graph.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/graph_profile.h"

namespace qspec::cuda {

namespace {

class CudaStepGraph final : public StepGraph {
 public:
  CudaStepGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaStepGraph() override { cudaGraphExecDestroy(exec_); }
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;

  void launch() override { check_cuda(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch"); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

// Owns a captured graph until it is instantiated.
struct GraphOwner {
  cudaGraph_t graph = nullptr;
  ~GraphOwner() {
    if (graph) cudaGraphDestroy(graph);
  }
};

}  // namespace

std::unique_ptr<StepGraph> capture_graph(cudaStream_t stream, const std::function<void()>& record) {
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  GraphOwner owner;
  try {
    record();
  } catch (...) {
    cudaStreamEndCapture(stream, &owner.graph);  // leaves the stream usable; the partial graph is dropped
    throw;
  }
  check_cuda(cudaStreamEndCapture(stream, &owner.graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaGraphInstantiate(&exec, owner.graph, 0), "cudaGraphInstantiate");
  auto step = std::make_unique<CudaStepGraph>(exec, stream);
  profile_graph_if_asked(owner.graph, stream);
  return step;
}

}  // namespace qspec::cuda
