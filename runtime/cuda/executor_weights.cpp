// Weight upload of the CUDA executor (executor.h): each entry of the layout's weight list (layout.h) once. Q8_0
// matrices are repacked for aligned 16-byte loads (q8_layout.h), other block types split into quant and scale
// bytes (repack_wq); a stack (the plan's matmul_stack, of Q8_0 or of one block type) is one device matrix of its
// members' rows whose members are slices of it (no copy twice); F32 vectors as they are; RoPE inverse
// frequencies as f64 tables.
#include <fmt/format.h>

#include "kernels/matmul.h"
#include "runtime/cuda/executor_impl.h"
#include "runtime/cuda/q8_layout.h"

namespace qrig::runtime {

void CudaExecutor::Impl::upload_weights() {
  const gguf::File& f = *file;
  const int64_t start = allocated;
  const std::string stage = opt.stage.empty() ? fmt::format("uploading weights to cuda:{}", opt.device)
                                              : fmt::format("uploading weights to {} (GPU {})", opt.stage, opt.device);
  if (opt.progress) opt.progress({stage, 0, layout.weight_bytes});
  for (const cuda::WeightUpload& w : layout.weights) {
    switch (w.kind) {
      case cuda::WeightUpload::q8:
      case cuda::WeightUpload::q8_stack: {
        std::vector<int8_t> qs(cuda::q8_qs_bytes(w.rows, w.cols));
        std::vector<uint16_t> sc((size_t)w.rows * (size_t)(w.cols / 32));
        int64_t r0 = 0;
        for (const auto& name : w.tensors) {
          const gguf::TensorInfo& t = f.tensor(name);
          const int64_t rows = (int64_t)t.ne[1];
          cuda::repack_q8_0(f.tensor_data(t), rows, w.cols, qs.data() + r0 * w.cols, sc.data() + r0 * (w.cols / 32));
          r0 += rows;
        }
        const std::string what = w.tensors.size() == 1
                                     ? w.tensors[0]
                                     : fmt::format("{} (+{} stacked)", w.tensors[0], w.tensors.size() - 1);
        weight_qs.emplace_back(opt.device, qs.size(), what + " (int8)");
        weight_qs.back().upload(qs);
        weight_scales.emplace_back(opt.device, sc.size(), what + " (scales)");
        weight_scales.back().upload(sc);
        allocated += (int64_t)(qs.size() + sc.size() * 2);
        const cuda::Q8Matrix whole{weight_qs.back().data(), weight_scales.back().data(), w.rows, w.cols};
        if (w.kind == cuda::WeightUpload::q8_stack) stack_by_head[w.tensors[0]] = whole;
        r0 = 0;
        for (const auto& name : w.tensors) {
          const int64_t rows = (int64_t)f.tensor(name).ne[1];
          q8_by_name[name] = {whole.qs + r0 * w.cols, whole.scales + r0 * (w.cols / 32), rows, w.cols};
          r0 += rows;
        }
        break;
      }
      case cuda::WeightUpload::wq:
      case cuda::WeightUpload::wq_stack: {
        // Each member's blocks repacked at its first row: one matrix of all the members' rows (repack_wq keeps rows
        // whole and in order), each member a view from its first row (layout.cpp checked the views' alignment).
        const kernels::WqLayout l = kernels::wq_layout(w.wtype);
        const size_t row_blocks = (size_t)(w.cols / l.block_values), bb = (size_t)l.b_bytes();
        const size_t blocks = (size_t)w.rows * row_blocks;
        std::vector<int8_t> a(blocks * (size_t)l.a_bytes);
        std::vector<uint16_t> b(blocks * bb / 2);
        size_t r0 = 0;
        for (const auto& name : w.tensors) {
          const gguf::TensorInfo& t = f.tensor(name);
          const int64_t rows = (int64_t)t.ne[1];
          cuda::repack_wq(w.wtype, f.tensor_data(t), rows, w.cols,
                          reinterpret_cast<uint8_t*>(a.data()) + r0 * row_blocks * (size_t)l.a_bytes,
                          reinterpret_cast<uint8_t*>(b.data()) + r0 * row_blocks * bb);
          r0 += (size_t)rows;
        }
        if ((int64_t)r0 != w.rows) throw RuntimeError(fmt::format("{}: {} rows uploaded of {}", w.tensors[0], r0, w.rows));
        const std::string what = w.tensors.size() == 1
                                     ? w.tensors[0]
                                     : fmt::format("{} (+{} stacked)", w.tensors[0], w.tensors.size() - 1);
        weight_qs.emplace_back(opt.device, a.size(), what + " (quant bytes)");
        weight_qs.back().upload(a);
        weight_scales.emplace_back(opt.device, b.size(), what + " (scale bytes)");
        weight_scales.back().upload(b);
        allocated += (int64_t)(a.size() + b.size() * 2);
        const cuda::Q8Matrix whole{weight_qs.back().data(), weight_scales.back().data(), w.rows, w.cols, w.wtype};
        if (w.kind == cuda::WeightUpload::wq_stack) stack_by_head[w.tensors[0]] = whole;
        r0 = 0;
        for (const auto& name : w.tensors) {
          const int64_t rows = (int64_t)f.tensor(name).ne[1];
          q8_by_name[name] = {whole.qs + r0 * row_blocks * (size_t)l.a_bytes,
                              reinterpret_cast<const uint16_t*>(reinterpret_cast<const uint8_t*>(whole.scales) +
                                                                r0 * row_blocks * bb),
                              rows, w.cols, w.wtype};
          r0 += (size_t)rows;
        }
        break;
      }
      case cuda::WeightUpload::f32: {
        const gguf::TensorInfo& t = f.tensor(w.tensors[0]);
        weight_f32.emplace_back(opt.device, (size_t)w.rows, w.tensors[0]);
        weight_f32.back().upload(reinterpret_cast<const float*>(f.tensor_data(t)), (size_t)w.rows);
        allocated += w.rows * 4;
        f32_by_name[w.tensors[0]] = weight_f32.back().data();
        break;
      }
      case cuda::WeightUpload::rope_table: {
        const ir::Op& op = w.draft ? plan.draft.ops.at((size_t)w.op) : *graph->ops.at((size_t)w.op).op;
        const auto inv = cuda::rope_inv_freq(op.i("rope_dims"), (float)op.f("theta"));
        if ((int64_t)inv.size() != w.rows) throw RuntimeError(op.describe() + ": RoPE table size");
        weight_f64.emplace_back(opt.device, inv.size(), op.describe() + " inv_freq");
        weight_f64.back().upload(inv);
        allocated += w.rows * 8;
        rope_by_op[&op] = weight_f64.back().data();
        break;
      }
    }
    if (opt.progress) opt.progress({stage, allocated - start, layout.weight_bytes});
  }
}

}  // namespace qrig::runtime
