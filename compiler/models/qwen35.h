// Lowering of the qwen35 dense hybrid model (Gated DeltaNet + gated attention) to the IR.
#pragma once

#include "compiler/hparams.h"
#include "gguf/gguf.h"
#include "ir/ir.h"

namespace qrig::compiler {

// The whole forward pass over T new tokens of one sequence: inputs %tokens, %pos (absolute positions) and
// %rows (which rows' logits to produce); per-layer states; output %logits [R, vocab]. The residual stream
// after layer i carries the attribute tap="hidden.i" (i = 0 embedding, n_layer = final-normed output),
// matching the reference fixture names. Every op carries its layer, every matmul the GGUF type of its weight
// (`file` is read for its tensor table only).
ir::Graph lower_qwen35(const Qwen35Params& p, const gguf::File& file);

// The MTP block (blk.{n_layer}) as a draft head (../shared/fixtures/README.md, tiny-mtp-draft-ref.gguf): row t
// takes %hidden = the main model's final-normed output at position t and %tokens = the token at t + 1;
// u = eh_proj [enorm(embed(token)) ; hnorm(hidden)] (embedding half first), one gated full-attention decoder layer
// with its own key and value cache (%pos: the head's rows 0, 1, ...), shared_head_norm, the main lm_head. Taps:
// mtp_eh (eh_proj output), mtp_hidden_out (the normed output, also the hidden of the next draft step).
ir::Graph lower_qwen35_mtp(const Qwen35Params& p, const gguf::File& file);

}  // namespace qrig::compiler
