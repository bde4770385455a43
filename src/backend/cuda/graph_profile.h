// Where a step graph's time goes, as the GPU runs it (PDL overlap and L2 state included, which a profiler
// that serialises kernels and flushes the caches removes): the graph's nodes are timed as prefixes, and node
// k's cost is time(first k nodes) - time(first k - 1). Set QSPEC_GRAPH_PROFILE=FILE and every step graph
// captured afterwards whose replay takes under QSPEC_GRAPH_PROFILE_MAX_MS (default 12) is profiled once,
// right after its capture, and appended to FILE as one JSON line. Replays advance the model's state, so this
// is for benchmarks only (scripts/graph_profile.py summarises the file).
#pragma once

#include <cuda_runtime.h>

namespace qspec::cuda {

// Profiles `graph` (captured on `stream`) when QSPEC_GRAPH_PROFILE asks for it; otherwise does nothing.
void profile_graph_if_asked(cudaGraph_t graph, cudaStream_t stream);

}  // namespace qspec::cuda
