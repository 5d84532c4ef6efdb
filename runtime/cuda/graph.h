// CUDA graphs for decode steps (executor.cpp). A decode step launches a few hundred small kernels; launched one
// by one, the GPU waits a little between each (and the host pays every launch). As a graph they run back to
// back from one launch. The executor captures the first step of a shape (which slots, which output rows) from
// its stream and instantiates it; a later step of the same shape does not capture again: it re-runs, in patch
// mode, only the ops whose launches change from token to token (the KV write position, the attention length
// and its split-KV grid), each of their launches updating the next remembered node of the instantiated graph,
// then launches the graph. A replay that launches a different number of kernels than were remembered (e.g.
// attention over <= 32 keys needs no merge kernel, later it does), or whose update CUDA refuses, is reported
// by finish_patch(), and the caller captures anew. Driver API of CUDA 12.0+ (cuStreamGetCaptureInfo_v2).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/device.h"

namespace qrig::cuda {

class StepGraph {
 public:
  // Starts capturing `stream` (thread-local mode: other threads' CUDA calls are not affected).
  explicit StepGraph(StreamHandle stream);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Capture: launches made while recorder() is installed (ScopedLaunchHook) go into the capture and their
  // nodes are remembered as the patchable ones, in order. Launches outside it are captured normally.
  LaunchHook* recorder();
  // Ends the capture and instantiates the graph. Throws CudaError (the capture is then discarded).
  void end_capture();
  // Ends a capture that failed half-way (nothing is launched); never throws.
  void abort_capture() noexcept;

  // Replay: begin_patch(), the patchable ops' launches with patcher() installed (they launch nothing), then
  // finish_patch(): true when every remembered node got exactly one update and CUDA took them all.
  void begin_patch();
  LaunchHook* patcher();
  bool finish_patch();

  void launch(StreamHandle stream);  // throws CudaError
  size_t patchable() const { return nodes_.size(); }

 private:
  class Recorder;
  class Patcher;
  StreamHandle stream_;
  bool capturing_ = false;
  drv::CUgraph graph_ = nullptr;
  drv::CUgraphExec exec_ = nullptr;
  std::vector<drv::CUgraphNode> nodes_;          // patchable kernel nodes, in launch order
  std::vector<KernelHandle> kernels_;            // their kernels
  std::vector<drv::KernelNodeParams> params_;    // their launch parameters (the context's function, as launched)
  size_t next_ = 0;
  bool patch_ok_ = true;
  std::unique_ptr<Recorder> recorder_;
  std::unique_ptr<Patcher> patcher_;
};

}  // namespace qrig::cuda
