// open_plan_model (model_file.h).
#include "runtime/model_file.h"

#include <fmt/format.h>

#include "runtime/errors.h"

namespace qrig::runtime {

std::shared_ptr<const gguf::File> open_plan_model(const ir::Plan& plan) {
  auto f = std::make_shared<gguf::File>(gguf::File::open(plan.model_path));
  if ((int64_t)f->file_size() != plan.model_size)
    throw RuntimeError(fmt::format("{} has {} bytes but the plan was compiled for a file of {} bytes: recompile the plan",
                                   plan.model_path, f->file_size(), plan.model_size));
  return f;
}

}  // namespace qrig::runtime
