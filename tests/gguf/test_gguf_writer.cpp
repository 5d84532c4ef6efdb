// Writer -> reader round trips: every metadata value type (extremes, empty and nested arrays), the exact byte
// encoding of a few values, and tensors given as bytes or streamed from a callback, in memory and on disk.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "tests/gguf/gguf_test_util.h"

using namespace qrig;
using namespace qrig::gguf_test;
using gguf::Value;
using gguf::ValueType;
using Catch::Matchers::Contains;

namespace {

Value uns(ValueType t, uint64_t u) { Value v; v.type = t; v.u = u; v.i = (int64_t)u; return v; }
Value sig(ValueType t, int64_t i) { Value v; v.type = t; v.i = i; v.u = (uint64_t)i; return v; }
Value flt(ValueType t, double f) { Value v; v.type = t; v.f = f; return v; }
Value arr_u(ValueType elem, std::vector<uint64_t> xs) {
  Value v; v.type = ValueType::ARRAY; v.elem = elem;
  for (uint64_t x : xs) { v.uints.push_back(x); v.ints.push_back((int64_t)x); }
  return v;
}
Value arr_i(ValueType elem, std::vector<int64_t> xs) {
  Value v; v.type = ValueType::ARRAY; v.elem = elem;
  for (int64_t x : xs) { v.ints.push_back(x); v.uints.push_back((uint64_t)x); }
  return v;
}
Value arr_f(ValueType elem, std::vector<double> xs) {
  Value v; v.type = ValueType::ARRAY; v.elem = elem; v.floats = std::move(xs); return v;
}
Value arr_a(std::vector<Value> xs) {
  Value v; v.type = ValueType::ARRAY; v.elem = ValueType::ARRAY; v.arr = std::move(xs); return v;
}

bool same_float(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}
bool is_unsigned(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64;
}

void check_same(const Value& want, const Value& got) {
  REQUIRE(got.type == want.type);
  switch (want.type) {
    case ValueType::FLOAT32: case ValueType::FLOAT64: CHECK(same_float(want.f, got.f)); break;
    case ValueType::BOOL: CHECK(got.b == want.b); break;
    case ValueType::STRING: CHECK(got.s == want.s); break;
    case ValueType::ARRAY:
      REQUIRE(got.elem == want.elem);
      REQUIRE(got.size() == want.size());
      if (want.elem == ValueType::STRING) {
        CHECK(got.strs == want.strs);
      } else if (want.elem == ValueType::ARRAY) {
        for (size_t k = 0; k < want.arr.size(); ++k) check_same(want.arr[k], got.arr[k]);
      } else if (want.elem == ValueType::FLOAT32 || want.elem == ValueType::FLOAT64) {
        for (size_t k = 0; k < want.floats.size(); ++k) CHECK(same_float(want.floats[k], got.floats[k]));
      } else if (is_unsigned(want.elem)) {
        CHECK(got.uints == want.uints);
      } else {
        CHECK(got.ints == want.ints);
      }
      break;
    default:
      if (is_unsigned(want.type)) CHECK(got.u == want.u);
      else CHECK(got.i == want.i);
  }
}

const double kF32Denorm = (double)std::numeric_limits<float>::denorm_min();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

TEST_CASE("every metadata value type round-trips through Writer and File::from_bytes", "[gguf]") {
  std::vector<std::pair<std::string, Value>> kv = {
      {"u8.min", uns(ValueType::UINT8, 0)}, {"u8.max", uns(ValueType::UINT8, 255)},
      {"i8.min", sig(ValueType::INT8, -128)}, {"i8.max", sig(ValueType::INT8, 127)},
      {"u16.max", uns(ValueType::UINT16, 65535)}, {"i16.min", sig(ValueType::INT16, -32768)},
      {"u32.max", uns(ValueType::UINT32, 0xFFFFFFFFu)}, {"i32.min", sig(ValueType::INT32, INT32_MIN)},
      {"u64.max", uns(ValueType::UINT64, UINT64_MAX)}, {"i64.min", sig(ValueType::INT64, INT64_MIN)},
      {"i64.max", sig(ValueType::INT64, INT64_MAX)},
      {"f32.pi", flt(ValueType::FLOAT32, (double)3.14159274f)}, {"f32.negzero", flt(ValueType::FLOAT32, -0.0)},
      {"f32.denorm", flt(ValueType::FLOAT32, kF32Denorm)}, {"f32.inf", flt(ValueType::FLOAT32, -kInf)},
      {"f32.nan", flt(ValueType::FLOAT32, kNaN)}, {"f64.big", flt(ValueType::FLOAT64, 1e300)},
      {"f64.denorm", flt(ValueType::FLOAT64, -4.9406564584124654e-324)}, {"f64.nan", flt(ValueType::FLOAT64, kNaN)},
      {"bool.true", Value::of_bool(true)}, {"bool.false", Value::of_bool(false)},
      {"str.empty", Value::of_str("")}, {"str.utf8", Value::of_str("h\xC3\xA9llo \xE2\x9C\x93")},
      {"str.nul", Value::of_str(std::string("a\0b", 3))}, {"str.long", Value::of_str(std::string(100000, 'x'))},
      {"arr.u8", arr_u(ValueType::UINT8, {0, 1, 255})}, {"arr.i8", arr_i(ValueType::INT8, {-128, 0, 127})},
      {"arr.u16", arr_u(ValueType::UINT16, {0, 65535})}, {"arr.i16", arr_i(ValueType::INT16, {-32768, 32767})},
      {"arr.u32", arr_u(ValueType::UINT32, {0, 0xFFFFFFFFu})}, {"arr.i32", arr_i(ValueType::INT32, {INT32_MIN, -1, INT32_MAX})},
      {"arr.u64", arr_u(ValueType::UINT64, {0, (1ull << 63) + 5, UINT64_MAX})},
      {"arr.i64", arr_i(ValueType::INT64, {INT64_MIN, INT64_MAX})},
      {"arr.f32", arr_f(ValueType::FLOAT32, {1.5, -0.0, kF32Denorm, kInf, kNaN})},
      {"arr.f64", arr_f(ValueType::FLOAT64, {1e-300, -kInf, kNaN})},
      {"arr.bool", Value::of_bools({true, false, true})},
      {"arr.str", Value::of_strs({"", "a", std::string("\0\xFF", 2), std::string(300, 'z')})},
      {"arr.nested", arr_a({arr_i(ValueType::INT32, {1, 2}), arr_i(ValueType::INT32, {}), Value::of_strs({"x"}),
                            arr_a({arr_a({Value::of_strs({"deep", ""})}), arr_f(ValueType::FLOAT64, {2.5})})})},
  };
  // Empty arrays of every element type, arrays of arrays included.
  for (uint32_t t = 0; t <= 12; ++t) {
    Value v;
    v.type = ValueType::ARRAY;
    v.elem = static_cast<ValueType>(t);
    kv.emplace_back(std::string("empty.") + gguf::value_type_name(v.elem), v);
  }
  gguf::Writer w;
  for (const auto& [k, v] : kv) w.set(k, v);
  w.set("u8.max", uns(ValueType::UINT8, 255));  // replacing keeps one entry, in place
  std::vector<uint8_t> bytes = w.to_bytes();
  CHECK(bytes.size() == w.file_size());
  gguf::File f = gguf::File::from_bytes(bytes.data(), bytes.size());
  REQUIRE(f.metadata().size() == kv.size());
  for (size_t k = 0; k < kv.size(); ++k) {
    INFO(kv[k].first);
    CHECK(f.metadata()[k].first == kv[k].first);
    check_same(kv[k].second, f.metadata()[k].second);
  }

  // Typed getters over the same values.
  CHECK(f.get_uint("u64.max") == UINT64_MAX);
  CHECK(f.get_int("i64.min") == INT64_MIN);
  CHECK(f.get_int("u32.max") == 0xFFFFFFFFll);
  CHECK_THROWS_WITH(f.get_int("u64.max"), Contains("u64.max") && Contains("too large"));
  CHECK_THROWS_WITH(f.get_uint("i8.min"), Contains("i8.min") && Contains("negative"));
  CHECK(f.get_uint("i8.max") == 127);
  CHECK(f.get_float("i16.min") == -32768.0);
  CHECK(f.get_float("u64.max") == 18446744073709551615.0);
  CHECK(f.get_bool("bool.true"));
  CHECK_THROWS_AS(f.get_bool("u8.max"), gguf::Error);
  CHECK(f.get_int_array("arr.bool") == std::vector<int64_t>{1, 0, 1});
  CHECK(f.get_int_array("arr.u8") == std::vector<int64_t>{0, 1, 255});
  CHECK_THROWS_AS(f.get_int_array("arr.f32"), gguf::Error);
  CHECK(f.get_string_array("empty.string").empty());
  CHECK(f.get_string("str.nul").size() == 3);
}

TEST_CASE("Writer encodes values byte for byte as the GGUF spec says", "[gguf]") {
  gguf::Writer w;
  w.set("a", uns(ValueType::UINT16, 0x1234));
  w.set("s", Value::of_strs({"xy", ""}));
  w.set("n", arr_a({arr_u(ValueType::UINT8, {7})}));
  Bytes want;
  want.header(0, 3);
  want.str("a").u32(2).put<uint16_t>(0x1234);
  want.str("s").u32(9).u32(8).u64(2).str("xy").str("");
  want.str("n").u32(9).u32(9).u64(1).u32(0).u64(1).u8(7);
  want.pad_to(32);
  CHECK(w.to_bytes() == want.b);
  CHECK(w.data_offset() == want.b.size());
}

TEST_CASE("tensors round-trip through the Writer, given as bytes or streamed", "[gguf]") {
  gguf::Writer w;
  w.set("general.alignment", Value::of_u32(64));
  auto pattern = [](size_t n, uint8_t salt) {
    std::vector<uint8_t> v(n);
    for (size_t k = 0; k < n; ++k) v[k] = (uint8_t)(k * 131 + salt);
    return v;
  };
  using gguf::TensorType;
  w.add_tensor("f32", TensorType::F32, {3}, pattern(12, 1));
  w.add_tensor("f16", TensorType::F16, {2, 3}, pattern(12, 2));
  w.add_tensor("q8.4d", TensorType::Q8_0, {64, 2, 1, 3}, pattern(12 * 34, 3));
  w.add_tensor("i32", TensorType::I32, {5}, pattern(20, 4));
  w.add_tensor("bf16", TensorType::BF16, {7}, pattern(14, 5));
  // Streamed: each byte encodes its row, so misplaced chunks show up. 5000 rows of 4 KiB need two chunks.
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  w.add_tensor("streamed", TensorType::F32, {1024, 5000}, [&](uint64_t first, uint64_t n, uint8_t* dst) {
    calls.emplace_back(first, n);
    for (uint64_t r = 0; r < n; ++r) std::memset(dst + r * 4096, (int)((first + r) % 251), 4096);
  });
  w.add_tensor("streamed.q8", TensorType::Q8_0, {32, 3}, [](uint64_t first, uint64_t n, uint8_t* dst) {
    for (uint64_t r = 0; r < n; ++r) std::memset(dst + r * 34, (int)(first + r + 1), 34);
  });

  std::vector<uint8_t> bytes = w.to_bytes();
  CHECK(calls == std::vector<std::pair<uint64_t, uint64_t>>{{0, 4096}, {4096, 904}});
  CHECK(bytes.size() == w.file_size());
  gguf::File f = gguf::File::from_bytes(bytes.data(), bytes.size());
  CHECK(f.alignment() == 64);
  CHECK(f.data_offset() == w.data_offset());
  CHECK(f.data_offset() % 64 == 0);
  auto table = w.tensor_table();
  REQUIRE(f.tensors().size() == table.size());
  for (size_t k = 0; k < table.size(); ++k) {
    const gguf::TensorInfo& t = f.tensors()[k];
    INFO(t.name);
    CHECK(t.name == table[k].name);
    CHECK(t.type == table[k].type);
    CHECK(t.ne == table[k].ne);
    CHECK(t.offset == table[k].offset);
    CHECK(t.n_bytes == table[k].n_bytes);
    CHECK(t.offset % 64 == 0);
  }
  uint8_t salt = 1;
  for (const char* name : {"f32", "f16", "q8.4d", "i32", "bf16"}) {
    const gguf::TensorInfo& t = f.tensor(name);
    std::vector<uint8_t> want = pattern(t.n_bytes, salt++);
    CHECK(std::memcmp(f.tensor_data(t), want.data(), want.size()) == 0);
  }
  const gguf::TensorInfo& s = f.tensor("streamed");
  bool rows_ok = true;
  for (uint64_t r = 0; r < 5000; ++r)
    for (uint64_t k = 0; k < 4096; k += 1021) rows_ok &= f.tensor_data(s)[r * 4096 + k] == r % 251;
  CHECK(rows_ok);
  const gguf::TensorInfo& q = f.tensor("streamed.q8");
  CHECK(f.tensor_data(q)[0] == 1);
  CHECK(f.tensor_data(q)[2 * 34 + 33] == 3);

  // On disk: the same bytes, and no temp file left behind.
  calls.clear();
  auto dir = std::filesystem::temp_directory_path() / ("qrig-gguf-writer-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "t.gguf").string();
  w.write(path);
  CHECK(read_file(path) == bytes);
  CHECK(!std::filesystem::exists(path + ".tmp"));
  CHECK(gguf::File::open(path).tensors().size() == table.size());
  CHECK_THROWS_AS(w.write((dir / "missing-dir" / "t.gguf").string()), gguf::Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Writer rejects tensors and settings the reader would reject", "[gguf]") {
  using gguf::TensorType;
  gguf::Writer w;
  w.add_tensor("a", TensorType::F32, {4}, std::vector<uint8_t>(16));
  CHECK_THROWS_WITH(w.add_tensor("b", TensorType::F32, {4}, std::vector<uint8_t>(15)), Contains("'b'") && Contains("15"));
  CHECK_THROWS_WITH(w.add_tensor("a", TensorType::F32, {4}, std::vector<uint8_t>(16)), Contains("duplicate"));
  CHECK_THROWS_WITH(w.add_tensor("c", TensorType::Q8_0, {33}, std::vector<uint8_t>(34)), Contains("block size"));
  CHECK_THROWS_AS(w.add_tensor("d", TensorType::F32, {}, std::vector<uint8_t>()), gguf::Error);
  CHECK_THROWS_AS(w.add_tensor("e", TensorType::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)), gguf::Error);
  CHECK_THROWS_AS(w.add_tensor("f", TensorType::F32, {4}, gguf::Writer::RowFill()), gguf::Error);
  CHECK_THROWS_WITH(w.set("general.alignment", Value::of_u32(3)), Contains("general.alignment"));
  CHECK_THROWS_AS(w.set("general.alignment", Value::of_u32(0)), gguf::Error);
  CHECK_THROWS_AS(w.set("general.alignment", Value::of_i32(32)), gguf::Error);
  CHECK(w.tensor_table().size() == 1);
}
