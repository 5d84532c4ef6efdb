// make_backend (backend.h): the backend a plan asks for, from the backends this build has.
#include "runtime/backend.h"

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/pipeline.h"

namespace qrig::runtime {

std::unique_ptr<Backend> make_cpu_backend(const ir::Plan& plan, const BackendOptions& opt);  // runtime/cpu/cpu_backend.cpp
#ifdef QRIG_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const ir::Plan& plan, const BackendOptions& opt);  // runtime/cuda
#endif

std::shared_ptr<KvSpan> Backend::save_kv(int, int64_t, int64_t) const {
  throw RuntimeError("this backend cannot copy KV cache entries (no shared prefix cache)");
}
void Backend::restore_kv(int, const KvSpan&, int64_t, int64_t) {
  throw RuntimeError("this backend cannot copy KV cache entries (no shared prefix cache)");
}
std::shared_ptr<KvSpan> Backend::slice_kv(const KvSpan&, int64_t, int64_t) const {
  throw RuntimeError("this backend cannot copy KV cache entries (no shared prefix cache)");
}

std::shared_ptr<KvSpan> PipelineStage::save_kv(int, int64_t, int64_t) const {
  throw RuntimeError("this pipeline stage cannot copy KV cache entries (no shared prefix cache)");
}
void PipelineStage::restore_kv(int, const KvSpan&, int64_t, int64_t) {
  throw RuntimeError("this pipeline stage cannot copy KV cache entries (no shared prefix cache)");
}
std::shared_ptr<KvSpan> PipelineStage::slice_kv(const KvSpan&, int64_t, int64_t) const {
  throw RuntimeError("this pipeline stage cannot copy KV cache entries (no shared prefix cache)");
}

std::unique_ptr<Backend> make_backend(const ir::Plan& plan, const BackendOptions& opt) {
  if (plan.backend == "cpu") return make_cpu_backend(plan, opt);
#ifdef QRIG_HAVE_CUDA
  if (plan.backend == "cuda") return make_cuda_backend(plan, opt);
#endif
  (void)opt;
  throw RuntimeError(fmt::format("this build of qrig has no '{}' backend (the plan targets {} {}); compile the "
                                 "plan with --backend cpu", plan.backend, plan.backend, plan.arch_target));
}

}  // namespace qrig::runtime
