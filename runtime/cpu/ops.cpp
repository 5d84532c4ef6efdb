// CPU reference ops other than GDN and attention: embedding, norms, matmul over GGUF weight types,
// elementwise ops, the causal conv and RoPE. See ops.h for the contracts.
#include "runtime/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/cpu/ops_internal.h"
#include "runtime/cpu/thread_pool.h"

namespace qrig::cpu {

using detail::fail;
using detail::require;
using detail::require_ptr;

namespace {

// Validates a weight matrix and returns the byte size of one row.
size_t matrix_row_bytes(const Matrix& m, const char* op) {
  require_ptr(m.data, op, "weight data");
  if (!gguf::can_dequantize(m.type))
    fail(op, std::string("weight type ") + gguf::tensor_type_name(m.type) + " is not supported (" +
                 gguf::dequantizable_types() + ")");
  if (m.in <= 0 || m.out <= 0)
    fail(op, "weight shape [" + std::to_string(m.in) + ", " + std::to_string(m.out) + "] is empty");
  const gguf::TypeTraits* tr = gguf::type_traits(static_cast<uint32_t>(m.type));
  require(tr != nullptr, op, "unknown weight type");
  if (m.in % tr->block_elems != 0)
    fail(op, "row length " + std::to_string(m.in) + " is not a multiple of the " +
                 gguf::tensor_type_name(m.type) + " block size " + std::to_string(tr->block_elems));
  return static_cast<size_t>(m.in / tr->block_elems) * tr->block_bytes;
}

void require_count(int64_t n, const char* op, const char* name) {
  if (n < 0) fail(op, std::string(name) + " is negative (" + std::to_string(n) + ")");
}

}  // namespace

void embed(const Matrix& table, const int32_t* tokens, int64_t T, float* out) {
  const char* op = "embed";
  const size_t row_bytes = matrix_row_bytes(table, op);
  require_count(T, op, "T");
  if (T == 0) return;
  require_ptr(tokens, op, "tokens");
  require_ptr(out, op, "out");
  for (int64_t t = 0; t < T; ++t)
    if (tokens[t] < 0 || tokens[t] >= table.out)
      fail(op, "token id " + std::to_string(tokens[t]) + " at position " + std::to_string(t) +
                   " is out of range [0, " + std::to_string(table.out) + ")");
  parallel_for(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      gguf::dequantize(table.type, table.data + static_cast<size_t>(tokens[t]) * row_bytes,
                       out + t * table.in, static_cast<size_t>(table.in));
  }, std::max<int64_t>(1, 16384 / table.in));
}

void rmsnorm(const float* x, const float* w, int64_t T, int64_t D, float eps, float* out) {
  const char* op = "rmsnorm";
  require_count(T, op, "T");
  require(D > 0, op, "D must be positive");
  if (T == 0) return;
  require_ptr(x, op, "x");
  require_ptr(w, op, "w");
  require_ptr(out, op, "out");
  parallel_for(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* xt = x + t * D;
      float* ot = out + t * D;
      const double inv = 1.0 / std::sqrt(detail::sum_squares(xt, D) / D + eps);
      for (int64_t i = 0; i < D; ++i) ot[i] = static_cast<float>(xt[i] * inv) * w[i];
    }
  }, std::max<int64_t>(1, 16384 / D));
}

void matmul(const Matrix& w, const float* x, int64_t T, float* out) {
  const char* op = "matmul";
  const size_t row_bytes = matrix_row_bytes(w, op);
  require_count(T, op, "T");
  if (T == 0) return;
  require_ptr(x, op, "x");
  require_ptr(out, op, "out");
  require(static_cast<const void*>(x) != static_cast<const void*>(out), op, "out must not alias x");
  const int64_t in = w.in, n_out = w.out;
  // Rows dequantized together: about 256 KiB of fp32, at most 16 rows.
  const int64_t block = std::clamp<int64_t>(65536 / in, 1, 16);
  parallel_for(n_out, [&](int64_t b, int64_t e) {
    std::vector<float> rows(static_cast<size_t>(block * in));
    for (int64_t o0 = b; o0 < e; o0 += block) {
      const int64_t nb = std::min(block, e - o0);
      for (int64_t r = 0; r < nb; ++r)
        gguf::dequantize(w.type, w.data + static_cast<size_t>(o0 + r) * row_bytes, rows.data() + r * in,
                         static_cast<size_t>(in));
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * in;
        float* ot = out + t * n_out + o0;
        for (int64_t r = 0; r < nb; ++r) ot[r] = detail::dot(rows.data() + r * in, xt, in);
      }
    }
  }, std::max<int64_t>(1, 65536 / (in * T)));
}

void add(const float* a, const float* b, int64_t n, float* out) {
  const char* op = "add";
  require_count(n, op, "n");
  if (n == 0) return;
  require_ptr(a, op, "a");
  require_ptr(b, op, "b");
  require_ptr(out, op, "out");
  parallel_for(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
  }, 65536);
}

void quantize_q8_activation(const float* x, int64_t n, int8_t* q, float* d, int8_t* q2) {
  const char* op = "quantize_q8_activation";
  require_count(n, op, "n");
  require(n % 32 == 0, op, "n must be a multiple of 32");
  if (n == 0) return;
  require_ptr(x, op, "x");
  require_ptr(q, op, "q");
  require_ptr(d, op, "d");
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    bool bad = false;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      bad |= !std::isfinite(xb[i]);
      amax = std::max(amax, std::fabs(xb[i]));
    }
    const float db = amax / 127.0f;
    const float id = db != 0.0f ? 1.0f / db : 0.0f;
    const float id2 = id * 254.0f;
    for (int i = 0; i < 32; ++i) {
      const int v = std::clamp(bad ? 0 : (int)std::round(xb[i] * id), -127, 127);
      q[b * 32 + i] = (int8_t)v;
      if (q2) {
        const float r = std::fma(-(float)v, db, xb[i]);
        q2[b * 32 + i] = (int8_t)std::clamp(bad ? 0 : (int)std::round(r * id2), -127, 127);
      }
    }
    d[b] = bad ? std::nanf("") : db;
  }
}

void concat_rows(const float* a, int64_t wa, const float* b, int64_t wb, int64_t T, float* out) {
  const char* op = "concat_rows";
  require_count(wa, op, "wa");
  require_count(wb, op, "wb");
  require_count(T, op, "T");
  if (T == 0 || wa + wb == 0) return;
  require_ptr(out, op, "out");
  if (wa > 0) require_ptr(a, op, "a");
  if (wb > 0) require_ptr(b, op, "b");
  for (int64_t t = 0; t < T; ++t) {
    std::copy(a + t * wa, a + (t + 1) * wa, out + t * (wa + wb));
    std::copy(b + t * wb, b + (t + 1) * wb, out + t * (wa + wb) + wa);
  }
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  const char* op = "swiglu";
  require_count(n, op, "n");
  if (n == 0) return;
  require_ptr(gate, op, "gate");
  require_ptr(up, op, "up");
  require_ptr(out, op, "out");
  parallel_for(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = detail::silu(gate[i]) * up[i];
  }, 16384);
}

void conv1d_causal_silu(const float* x, int64_t T, int64_t C, const float* w, int64_t K, float* state,
                        float* out) {
  const char* op = "conv1d_causal_silu";
  require_count(T, op, "T");
  require(C > 0, op, "C must be positive");
  require(K > 0, op, "kernel size K must be positive");
  if (T == 0) return;
  require_ptr(x, op, "x");
  require_ptr(w, op, "w");
  require_ptr(out, op, "out");
  require(K == 1 || state != nullptr, op, "state is null");
  require(x != out, op, "out must not alias x");
  const int64_t H = K - 1;  // history length
  parallel_for(C, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = c0; c < c1; ++c) {
        const float* wc = w + c * K;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t src = t + k - H;  // index into x; negative = history
          const float v = src < 0 ? state[(H + src) * C + c] : x[src * C + c];
          acc += wc[k] * v;
        }
        out[t * C + c] = detail::silu(acc);
      }
    }
    // New history = the last H inputs of (old history ++ x). Ascending r only reads rows r+T > r.
    for (int64_t r = 0; r < H; ++r) {
      const int64_t src = T - H + r;
      for (int64_t c = c0; c < c1; ++c)
        state[r * C + c] = src < 0 ? state[(r + T) * C + c] : x[src * C + c];
    }
  }, std::max<int64_t>(1, 4096 / (T * K)));
}

void gated_rmsnorm(const float* o, const float* z, const float* w, int64_t T, int64_t H, int64_t dv,
                   float eps, float* out) {
  const char* op = "gated_rmsnorm";
  require_count(T, op, "T");
  require(H > 0 && dv > 0, op, "H and dv must be positive");
  if (T == 0) return;
  require_ptr(o, op, "o");
  require_ptr(z, op, "z");
  require_ptr(w, op, "w");
  require_ptr(out, op, "out");
  parallel_for(T * H, [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const float* oh = o + row * dv;
      const float* zh = z + row * dv;
      float* yh = out + row * dv;
      const double inv = 1.0 / std::sqrt(detail::sum_squares(oh, dv) / dv + eps);
      for (int64_t i = 0; i < dv; ++i)
        yh[i] = w[i] * static_cast<float>(oh[i] * inv) * detail::silu(zh[i]);
    }
  }, std::max<int64_t>(1, 16384 / dv));
}

void head_rmsnorm(const float* x, int64_t row_stride, int64_t head_stride, int64_t head_offset,
                  const float* w, int64_t T, int64_t H, int64_t hd, float eps, float* out) {
  const char* op = "head_rmsnorm";
  require_count(T, op, "T");
  require(H > 0 && hd > 0, op, "H and hd must be positive");
  require(row_stride >= 0 && head_stride >= 0 && head_offset >= 0, op, "strides must be non-negative");
  if (T == 0) return;
  require_ptr(x, op, "x");
  require_ptr(w, op, "w");
  require_ptr(out, op, "out");
  parallel_for(T * H, [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const int64_t t = row / H, h = row % H;
      const float* xh = x + t * row_stride + h * head_stride + head_offset;
      float* yh = out + row * hd;
      const double inv = 1.0 / std::sqrt(detail::sum_squares(xh, hd) / hd + eps);
      for (int64_t i = 0; i < hd; ++i) yh[i] = static_cast<float>(xh[i] * inv) * w[i];
    }
  }, std::max<int64_t>(1, 16384 / hd));
}

void rope_neox(float* x, const int32_t* pos, int64_t T, int64_t H, int64_t hd, int64_t rope_dims,
               float theta) {
  const char* op = "rope_neox";
  require_count(T, op, "T");
  require(H > 0 && hd > 0, op, "H and hd must be positive");
  if (rope_dims < 0 || rope_dims > hd || rope_dims % 2 != 0)
    fail(op, "rope_dims " + std::to_string(rope_dims) + " must be even and within [0, " +
                 std::to_string(hd) + "]");
  require(theta > 0.0f && std::isfinite(theta), op, "theta must be positive and finite");
  if (T == 0 || rope_dims == 0) return;
  require_ptr(x, op, "x");
  require_ptr(pos, op, "pos");
  const int64_t half = rope_dims / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / rope_dims);
  parallel_for(T, [&](int64_t b, int64_t e) {
    std::vector<double> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int64_t t = b; t < e; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(pos[t]) * inv_freq[i];
        cs[i] = std::cos(angle);
        sn[i] = std::sin(angle);
      }
      for (int64_t h = 0; h < H; ++h) {
        float* xh = x + (t * H + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const double x0 = xh[i], x1 = xh[i + half];
          xh[i] = static_cast<float>(x0 * cs[i] - x1 * sn[i]);
          xh[i + half] = static_cast<float>(x0 * sn[i] + x1 * cs[i]);
        }
      }
    }
  }, std::max<int64_t>(1, 4096 / (H * rope_dims)));
}

}  // namespace qrig::cpu
