// The kernel library's variants as the CUDA runtime uses them (kernels/variant.h): it reads the variants a
// plan names (their template, -D options and launch geometry) and never chooses one.
#pragma once

#include "kernels/variant.h"

namespace qrig::cuda {

using kernels::find_template_info;
using kernels::KernelError;
using kernels::make_variant;
using kernels::parse_variant;
using kernels::template_registry;
using kernels::TemplateInfo;
using kernels::TemplateParam;
using kernels::Variant;

}  // namespace qrig::cuda
