// Decode-step CUDA graphs (graph.h): capture with remembered patchable nodes, replay with node updates.
#include "runtime/cuda/graph.h"

#include <fmt/format.h>

namespace qrig::cuda {

namespace {

// The node the last launch on a capturing stream added: the stream's only dependency after it.
cudaGraphNode_t last_captured_node(cudaStream_t stream, const std::string& name) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  size_t n = 0;
#if CUDART_VERSION >= 13000
  check(cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &deps, nullptr, &n),
        "capture info after the launch of " + name);
#else
  check(cudaStreamGetCaptureInfo_v2(stream, &status, nullptr, nullptr, &deps, &n),
        "capture info after the launch of " + name);
#endif
  if (status != cudaStreamCaptureStatusActive || n != 1 || !deps)
    throw CudaError(fmt::format("graph capture: the launch of {} left {} dependencies (status {})", name, n, (int)status));
  return deps[0];
}

}  // namespace

class StepGraph::Recorder final : public LaunchHook {
 public:
  explicit Recorder(StepGraph& g) : g_(g) {}
  void launch(cudaKernel_t kernel, const std::string& name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
              void** args) override {
    check(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, args, smem, stream),
          "captured launch of " + name);
    g_.nodes_.push_back(last_captured_node(stream, name));
    // The node's function as launched (the runtime cannot read a library kernel's node back: GetParams says
    // cudaErrorInvalidDeviceFunction); updates pass the same cudaKernel_t.
    cudaKernelNodeParams p{};
    p.func = reinterpret_cast<void*>(kernel);
    p.gridDim = grid;
    p.blockDim = block;
    p.sharedMemBytes = (unsigned)smem;
    g_.params_.push_back(p);
  }

 private:
  StepGraph& g_;
};

class StepGraph::Patcher final : public LaunchHook {
 public:
  explicit Patcher(StepGraph& g) : g_(g) {}
  void launch(cudaKernel_t kernel, const std::string&, dim3 grid, dim3 block, size_t smem, cudaStream_t,
              void** args) override {
    if (!g_.patch_ok_) return;
    // More launches than remembered, or another kernel at this place (e.g. one sequence's attention now
    // needs its merge kernel and the next one's does not yet): the graph's shape changed.
    if (g_.next_ >= g_.nodes_.size() || g_.params_[g_.next_].func != reinterpret_cast<void*>(kernel)) {
      g_.patch_ok_ = false;
      return;
    }
    cudaKernelNodeParams p = g_.params_[g_.next_];  // the captured function; new grid, block and arguments
    p.gridDim = grid;
    p.blockDim = block;
    p.sharedMemBytes = (unsigned)smem;
    p.kernelParams = args;
    p.extra = nullptr;
    if (cudaGraphExecKernelNodeSetParams(g_.exec_, g_.nodes_[g_.next_], &p) != cudaSuccess) {
      (void)cudaGetLastError();  // refused (e.g. another function): the caller captures anew
      g_.patch_ok_ = false;
    }
    ++g_.next_;
  }

 private:
  StepGraph& g_;
};

StepGraph::StepGraph(cudaStream_t stream) : stream_(stream) {
  recorder_ = std::make_unique<Recorder>(*this);
  patcher_ = std::make_unique<Patcher>(*this);
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin of a decode-step graph capture");
  capturing_ = true;
}

StepGraph::~StepGraph() {
  abort_capture();
  if (exec_) (void)cudaGraphExecDestroy(exec_);
  if (graph_) (void)cudaGraphDestroy(graph_);
}

LaunchHook* StepGraph::recorder() { return recorder_.get(); }
LaunchHook* StepGraph::patcher() { return patcher_.get(); }

void StepGraph::end_capture() {
  capturing_ = false;
  const cudaError_t e = cudaStreamEndCapture(stream_, &graph_);
  if (e != cudaSuccess) {
    graph_ = nullptr;
    check(e, "end of a decode-step graph capture");
  }
  check(cudaGraphInstantiate(&exec_, graph_, 0), fmt::format("instantiation of a decode-step graph ({} patchable nodes)", nodes_.size()));
}

void StepGraph::abort_capture() noexcept {
  if (!capturing_) return;
  capturing_ = false;
  cudaGraph_t g = nullptr;
  (void)cudaStreamEndCapture(stream_, &g);
  if (g) (void)cudaGraphDestroy(g);
  (void)cudaGetLastError();
}

void StepGraph::begin_patch() {
  next_ = 0;
  patch_ok_ = exec_ != nullptr;
}

bool StepGraph::finish_patch() { return patch_ok_ && next_ == nodes_.size(); }

void StepGraph::launch(cudaStream_t stream) {
  if (!exec_) throw CudaError("launch of a decode-step graph that was never instantiated");
  check(cudaGraphLaunch(exec_, stream), "launch of a decode-step graph");
}

}  // namespace qrig::cuda
