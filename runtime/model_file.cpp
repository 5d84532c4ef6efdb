// open_plan_model (model_file.h).
#include "runtime/model_file.h"

#include <fmt/format.h>

#include "runtime/errors.h"

namespace qrig::runtime {

std::shared_ptr<const gguf::File> open_plan_model(const ir::Plan& plan) {
  auto f = std::make_shared<gguf::File>(gguf::File::open(plan.model_path));
  // A split model's size is that of all its shards together: a shard replaced or changed shows here too.
  if ((int64_t)f->file_size() != plan.model_size) {
    const std::string what = f->shards().size() > 1
                                 ? fmt::format("the {} shards of {} have {} bytes together", f->shards().size(),
                                               plan.model_path, f->file_size())
                                 : fmt::format("{} has {} bytes", plan.model_path, f->file_size());
    throw RuntimeError(fmt::format("{} but the plan was compiled for a model of {} bytes: recompile the plan", what,
                                   plan.model_size));
  }
  return f;
}

}  // namespace qrig::runtime
