// Decode-step CUDA graphs (graph.h): capture with remembered patchable nodes, replay with node updates.
#include "runtime/cuda/graph.h"

#include <fmt/format.h>

namespace qrig::cuda {

using namespace drv;

namespace {

// The node the last launch on a capturing stream added: the stream's only dependency after it.
CUgraphNode last_captured_node(StreamHandle stream, const std::string& name) {
  int status = 0;
  const CUgraphNode* deps = nullptr;
  size_t n = 0;
  const DriverApi& a = driver();
  if (a.cuStreamGetCaptureInfo_v3) {  // 12.3+: edge data (programmatic launches) is returned, not refused
    const GraphEdgeData* edges = nullptr;
    check(a.cuStreamGetCaptureInfo_v3(stream, &status, nullptr, nullptr, &deps, &edges, &n),
          "capture info after the launch of " + name);
  } else {
    check(a.cuStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &deps, &n),
          "capture info after the launch of " + name);
  }
  if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE || n != 1 || !deps)
    throw CudaError(fmt::format("graph capture: the launch of {} left {} dependencies (status {})", name, n, status));
  return deps[0];
}

}  // namespace

class StepGraph::Recorder final : public LaunchHook {
 public:
  explicit Recorder(StepGraph& g) : g_(g) {}
  void launch(KernelHandle kernel, const std::string& name, Dim3 grid, Dim3 block, size_t smem, StreamHandle stream,
              void** args, bool programmatic) override {
    // The patchable nodes are launched as the current context's function of the kernel, and updated with that
    // same function (the classic node-update contract).
    const DriverApi& a = driver();
    KernelNodeParams p;
    check(a.cuKernelGetFunction(&p.func, kernel), "the function of " + name + " in this context");
    check(launch_function(p.func, grid, block, smem, stream, args, programmatic), "captured launch of " + name);
    g_.nodes_.push_back(last_captured_node(stream, name));
    g_.kernels_.push_back(kernel);
    g_.params_.push_back(p);
  }

 private:
  StepGraph& g_;
};

class StepGraph::Patcher final : public LaunchHook {
 public:
  explicit Patcher(StepGraph& g) : g_(g) {}
  void launch(KernelHandle kernel, const std::string&, Dim3 grid, Dim3 block, size_t smem, StreamHandle,
              void** args, bool) override {
    if (!g_.patch_ok_) return;
    // More launches than remembered, or another kernel at this place (e.g. one sequence's attention now
    // needs its merge kernel and the next one's does not yet): the graph's shape changed.
    if (g_.next_ >= g_.nodes_.size() || g_.kernels_[g_.next_] != kernel) {
      g_.patch_ok_ = false;
      return;
    }
    KernelNodeParams p = g_.params_[g_.next_];  // the captured function; new grid, block and arguments
    p.gridDimX = grid.x;
    p.gridDimY = grid.y;
    p.gridDimZ = grid.z;
    p.blockDimX = block.x;
    p.blockDimY = block.y;
    p.blockDimZ = block.z;
    p.sharedMemBytes = (unsigned)smem;
    p.kernelParams = args;
    p.extra = nullptr;
    if (driver().cuGraphExecKernelNodeSetParams(g_.exec_, g_.nodes_[g_.next_], &p) != CUDA_SUCCESS)
      g_.patch_ok_ = false;  // refused (e.g. another function): the caller captures anew
    ++g_.next_;
  }

 private:
  StepGraph& g_;
};

StepGraph::StepGraph(StreamHandle stream) : stream_(stream) {
  recorder_ = std::make_unique<Recorder>(*this);
  patcher_ = std::make_unique<Patcher>(*this);
  check(driver().cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin of a decode-step graph capture");
  capturing_ = true;
}

StepGraph::~StepGraph() {
  abort_capture();
  const DriverApi& a = driver();
  if (exec_) (void)a.cuGraphExecDestroy(exec_);
  if (graph_) (void)a.cuGraphDestroy(graph_);
}

LaunchHook* StepGraph::recorder() { return recorder_.get(); }
LaunchHook* StepGraph::patcher() { return patcher_.get(); }

void StepGraph::end_capture() {
  capturing_ = false;
  const DriverApi& a = driver();
  const CUresult r = a.cuStreamEndCapture(stream_, &graph_);
  if (r != CUDA_SUCCESS) {
    graph_ = nullptr;
    check(r, "end of a decode-step graph capture");
  }
  check(a.cuGraphInstantiateWithFlags(&exec_, graph_, 0),
        fmt::format("instantiation of a decode-step graph ({} patchable nodes)", nodes_.size()));
}

void StepGraph::abort_capture() noexcept {
  if (!capturing_) return;
  capturing_ = false;
  const DriverApi& a = driver();
  CUgraph g = nullptr;
  (void)a.cuStreamEndCapture(stream_, &g);
  if (g) (void)a.cuGraphDestroy(g);
}

void StepGraph::begin_patch() {
  next_ = 0;
  patch_ok_ = exec_ != nullptr;
}

bool StepGraph::finish_patch() { return patch_ok_ && next_ == nodes_.size(); }

void StepGraph::launch(StreamHandle stream) {
  if (!exec_) throw CudaError("launch of a decode-step graph that was never instantiated");
  check(driver().cuGraphLaunch(exec_, stream), "launch of a decode-step graph");
}

}  // namespace qrig::cuda
