// What a MODEL argument of serve/run/bench/verify names, found the way a user expects: a .gguf (the first
// shard of a split model stands for all of them), a plan directory, or a directory holding one model (one
// .gguf, or the shards of one split model; vision projectors `mmproj*.gguf` beside it are not models). And the
// model file of a plan that was moved together with its model, or whose model was moved (--model).
#pragma once

#include <string>

#include "ir/plan.h"

namespace qrig::cli {

struct ModelSource {
  bool plan = false;  // a plan directory (else a GGUF file)
  std::string path;   // the plan directory, or the .gguf (first shard) to open
};

// Throws std::runtime_error saying what the path is and what it lacks (no such path, a directory with no
// model or with several models, a later shard of a split model).
ModelSource resolve_model(const std::string& arg);

// Points plan.model_path at the plan's model: `override_path` (--model) when given; else the recorded path when
// it exists; else the model's file name inside the plan directory or beside it (the plan and the model moved
// together). Throws std::runtime_error naming the path the plan wants and the --model flag otherwise. `note`
// receives a line when the model was found somewhere other than where the plan says.
void locate_plan_model(ir::Plan& plan, const std::string& plan_dir, const std::string& override_path,
                       std::string* note = nullptr);

// The name a model goes by (the API's model id by default): the file name without .gguf and, for a split model,
// without the -00001-of-0000N shard suffix.
std::string model_display_name(const std::string& gguf_path);

}  // namespace qrig::cli
