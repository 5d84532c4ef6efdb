// The kernel template sources (templates/*.cu and the shared *.cuh headers), embedded into the binary at
// build time by scripts/embed_templates.cmake, so that NVRTC compiles exactly what the binary was built with.
#pragma once

#include <string_view>
#include <vector>

namespace qrig::cuda {

struct TemplateFile {
  const char* name;    // file name in templates/, e.g. "rmsnorm_f32.cu" or "qrig_common.cuh"
  const char* source;  // its text
};

// Every file of templates/ with a .cu or .cuh extension, sorted by name (generated code).
const std::vector<TemplateFile>& embedded_templates();

// nullptr when no embedded file has that name.
inline const TemplateFile* find_template(std::string_view name) {
  for (const auto& f : embedded_templates())
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace qrig::cuda
