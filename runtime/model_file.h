// Opening the model file a plan was compiled for.
#pragma once

#include <memory>

#include "gguf/gguf.h"
#include "ir/plan.h"

namespace qrig::runtime {

// Opens the plan's model file, checking it is the one the plan was compiled for (size). Throws RuntimeError.
std::shared_ptr<const gguf::File> open_plan_model(const ir::Plan& plan);

}  // namespace qrig::runtime
