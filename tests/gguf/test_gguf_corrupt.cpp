// Corrupt, truncated and hostile variants of tiny.gguf (and hand-made files) must fail with a gguf::Error that
// says what is wrong (never crash, hang, or allocate more than the input), or parse into a self-consistent File.
#include <catch2/catch.hpp>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "tests/gguf/alloc_probe.h"
#include "tests/gguf/gguf_test_util.h"
#include "tests/missing_input.h"

using namespace qrig;
using namespace qrig::gguf_test;
using Catch::Matchers::Contains;

namespace {

// The message of the Error that parsing throws; "" when the bytes parse. Other exceptions propagate (and
// fail the test).
std::string error_of(const uint8_t* p, size_t n) {
  try {
    gguf::File::from_bytes(p, n);
  } catch (const gguf::Error& e) {
    return e.what();
  }
  return "";
}
std::string error_of(const std::vector<uint8_t>& b) { return error_of(b.data(), b.size()); }

// Parsing fails with an Error containing every fragment, allocating nothing larger than the input (the
// reader's own copy of it) or 1 MiB.
void expect_error(const std::vector<uint8_t>& b, std::initializer_list<std::string> fragments) {
  alloc_probe_arm();
  std::string msg = error_of(b);
  size_t largest = alloc_probe_disarm();
  INFO("message: " << msg);
  REQUIRE(!msg.empty());
  for (const std::string& f : fragments) CHECK_THAT(msg, Contains(f));
  CHECK(largest <= std::max<size_t>(b.size(), 1 << 20));
}

template <class T>
std::vector<uint8_t> patched(size_t pos, T value) {
  std::vector<uint8_t> b = tiny_bytes();
  put_le(b, pos, value);
  return b;
}

uint64_t tiny_data_offset() {
  static const uint64_t off = gguf::File::from_bytes(tiny_bytes().data(), tiny_bytes().size()).data_offset();
  return off;
}

std::string temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("qrig-gguf-corrupt-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

void write_bytes(const std::string& path, const uint8_t* p, size_t n) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, p, n) == (ssize_t)n);
  ::close(fd);
}

// A file with one tensor, described field by field, followed by `data` zero bytes.
std::vector<uint8_t> one_tensor(const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset, size_t data,
                                uint32_t n_dims_override = 0xFFFFFFFF) {
  Bytes b;
  b.header(1, 0).str("weird").u32(n_dims_override != 0xFFFFFFFF ? n_dims_override : (uint32_t)ne.size());
  for (uint64_t e : ne) b.u64(e);
  b.u32(type).u64(offset).pad_to(32).zeros(data);
  return b.b;
}

const uint64_t k2p63 = 1ull << 63;

}  // namespace

TEST_CASE("tiny.gguf truncated anywhere before its tensor data fails with 'truncated'", "[gguf][fixtures]") {
  const std::vector<uint8_t>& full = tiny_bytes();
  const Layout l = walk(full);
  const size_t data_offset = tiny_data_offset();
  // Which entry each byte belongs to; once a cut is past every count bound, the message must name it.
  std::vector<std::string> owner(data_offset);
  for (const auto& [key, kp] : l.kv)
    for (size_t p = kp.type; p < kp.end; ++p) owner[p] = "'" + key + "'";
  for (const TensorPos& t : l.tensors)
    for (size_t p = t.n_dims; p < t.end; ++p) owner[p] = "'" + t.name + "'";
  const size_t count_bounds = 24 + std::max<size_t>(13 * l.kv.size(), 32 * l.tensors.size());

  size_t bad = 0;
  alloc_probe_arm();
  for (size_t cut = 0; cut < data_offset; ++cut) {
    std::string msg = error_of(full.data(), cut);
    bool ok = cut < 4 ? msg.find("bad magic") != std::string::npos : msg.find("truncated") != std::string::npos;
    if (cut >= count_bounds && !owner[cut].empty()) ok = ok && msg.find(owner[cut]) != std::string::npos;
    if (!ok && ++bad <= 5) UNSCOPED_INFO("cut at " << cut << ": '" << msg << "'");
  }
  CHECK(alloc_probe_disarm() <= data_offset);
  CHECK(bad == 0);
}

TEST_CASE("tiny.gguf truncated inside its tensor data names the first tensor that no longer fits", "[gguf][fixtures]") {
  const std::vector<uint8_t>& full = tiny_bytes();
  gguf::File f = gguf::File::from_bytes(full.data(), full.size());
  std::vector<size_t> cuts = {f.data_offset(), f.data_offset() + 1, f.data_offset() + 31, f.data_offset() + 32,
                              full.size() - 1};
  for (size_t cut = f.data_offset() + 4093; cut < full.size(); cut += 99991) cuts.push_back(cut);
  for (size_t cut : cuts) {
    const gguf::TensorInfo* first = nullptr;
    for (const auto& t : f.tensors())
      if (f.data_offset() + t.offset + t.n_bytes > cut) { first = &t; break; }
    REQUIRE(first);
    INFO("cut at " << cut);
    expect_error(std::vector<uint8_t>(full.begin(), full.begin() + cut), {"truncated", "'" + first->name + "'"});
  }
  // The same through File::open (mmap), with the path in the message.
  std::string path = temp_path("cut.gguf");
  write_bytes(path, full.data(), full.size() - 100);
  CHECK_THROWS_WITH(gguf::File::open(path), Contains(path) && Contains("truncated") && Contains("output_norm.weight"));
  write_bytes(path, full.data(), 0);
  CHECK_THROWS_WITH(gguf::File::open(path), Contains("bad magic"));
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

namespace {

// Checks one mutated image: it parses into a self-consistent File, or fails with gguf::Error (anything else
// propagates and fails the test). Returns whether it parsed; counts inconsistencies.
bool parse_consistent(const gguf::File& f, size_t& inconsistent) {
  for (const gguf::TensorInfo& t : f.tensors()) {
    const gguf::TypeTraits* tr = gguf::type_traits(static_cast<uint32_t>(t.type));
    bool ok = tr && f.data_offset() + t.offset + t.n_bytes <= f.file_size() && t.offset % f.alignment() == 0 &&
              t.n_bytes == t.n_elements / tr->block_elems * tr->block_bytes;
    if (ok && gguf::can_dequantize(t.type) && t.n_elements >= 32) {
      float out[32];
      gguf::dequantize(t.type, f.tensor_data(t), out, 32);
    }
    inconsistent += !ok;
  }
  return true;
}

uint8_t mutate(uint8_t orig, std::mt19937& rng) {
  uint8_t v;
  switch (rng() % 6) {
    case 0: v = orig ^ 0xFF; break;
    case 1: v = orig ^ (uint8_t)(1u << (rng() % 8)); break;
    case 2: v = 0; break;
    case 3: v = 0xFF; break;
    default: v = (uint8_t)rng(); break;
  }
  return v == orig ? orig ^ 0x80 : v;
}

// tiny.gguf with its metadata and tensor table intact but every tensor cut to one or two blocks, so that a
// mutated copy is cheap to parse from memory.
std::vector<uint8_t> small_tiny() {
  gguf::File f = gguf::File::from_bytes(tiny_bytes().data(), tiny_bytes().size());
  gguf::Writer w;
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  for (const gguf::TensorInfo& t : f.tensors()) {
    std::vector<uint64_t> ne = t.ne;
    ne[0] = t.type == gguf::TensorType::Q8_0 ? 32 : std::min<uint64_t>(ne[0], 4);
    for (size_t d = 1; d < ne.size(); ++d) ne[d] = std::min<uint64_t>(ne[d], 2);
    uint64_t n = 1;
    for (uint64_t e : ne) n *= e;
    uint64_t bytes = t.type == gguf::TensorType::Q8_0 ? n / 32 * 34 : n * 4;
    w.add_tensor(t.name, t.type, ne, std::vector<uint8_t>(f.tensor_data(t), f.tensor_data(t) + bytes));
  }
  return w.to_bytes();
}

}  // namespace

TEST_CASE("single-byte changes anywhere in the header parse consistently or fail with gguf::Error", "[gguf][fixtures]") {
  // About every third byte of the metadata and tensor infos (1 to 4 apart), each set to a value picked from
  // bit flips, 0, 0xFF and random bytes, in a copy of tiny.gguf with shrunken tensors (same metadata, same
  // tensor table layout).
  std::vector<uint8_t> img = small_tiny();
  const size_t data_offset = gguf::File::from_bytes(img.data(), img.size()).data_offset();
  std::mt19937 rng(7);
  size_t parsed = 0, failed = 0, inconsistent = 0;
  for (size_t pos = 0; pos < data_offset; pos += 1 + rng() % 4) {
    uint8_t orig = img[pos];
    img[pos] = mutate(orig, rng);
    try {
      gguf::File f = gguf::File::from_bytes(img.data(), img.size());
      parsed += parse_consistent(f, inconsistent);
    } catch (const gguf::Error&) {
      ++failed;
    }
    img[pos] = orig;
  }
  INFO(parsed << " parsed, " << failed << " failed");
  CHECK(inconsistent == 0);
  CHECK(parsed > 1000);  // string bytes and many values may change freely
  CHECK(failed > 1000);  // lengths, types and counts may not
}

TEST_CASE("single-byte changes in the real tiny.gguf, mapped from disk, parse or fail with gguf::Error", "[gguf][fixtures]") {
  // The tensor infos (sampled) and the tensor data of the full-size file, mutated in place in a temp copy.
  const std::vector<uint8_t>& full = tiny_bytes();
  const Layout l = walk(full);
  std::string path = temp_path("flip.gguf");
  write_bytes(path, full.data(), full.size());
  int fd = ::open(path.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  std::mt19937 rng(11);
  std::vector<size_t> positions;
  for (size_t p = 0; p < 24; ++p) positions.push_back(p);
  for (size_t p = l.infos_start; p < l.infos_end; p += 7) positions.push_back(p);
  for (size_t p = tiny_data_offset(); p < full.size(); p += 65537) positions.push_back(p);
  size_t parsed = 0, failed = 0, inconsistent = 0;
  for (size_t pos : positions) {
    uint8_t orig = full[pos], v = mutate(orig, rng);
    REQUIRE(::pwrite(fd, &v, 1, (off_t)pos) == 1);
    try {
      gguf::File f = gguf::File::open(path);
      parsed += parse_consistent(f, inconsistent);
      if (pos >= tiny_data_offset()) CHECK(f.tensors().size() == 109);
    } catch (const gguf::Error&) {
      ++failed;
      CHECK(pos < tiny_data_offset());
    }
    REQUIRE(::pwrite(fd, &orig, 1, (off_t)pos) == 1);
  }
  ::close(fd);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  INFO(parsed << " parsed, " << failed << " failed");
  CHECK(inconsistent == 0);
  CHECK(parsed > 100);
  CHECK(failed > 100);
}

TEST_CASE("absurd counts and lengths fail before allocating", "[gguf][fixtures]") {
  const Layout l = walk(tiny_bytes());
  const size_t size = tiny_bytes().size();
  expect_error(patched<uint64_t>(8, k2p63), {"tensor count 9223372036854775808"});
  expect_error(patched<uint64_t>(8, UINT64_MAX), {"tensor count 18446744073709551615"});
  expect_error(patched<uint64_t>(16, k2p63), {"metadata count 9223372036854775808"});
  // Counts the file size still allows: the parse runs into garbage and stops there.
  expect_error(patched<uint64_t>(16, size / 13 - 2), {"corrupt"});
  expect_error(patched<uint64_t>(8, size / 32 - 1), {"corrupt"});
  const KvPos& tokens = l.kv.at("tokenizer.ggml.tokens");
  expect_error(patched<uint64_t>(tokens.value + 4, k2p63), {"array length 9223372036854775808", "tokenizer.ggml.tokens"});
  expect_error(patched<uint64_t>(tokens.value + 4, (size - tokens.value) / 8 - 1), {"truncated", "tokenizer.ggml.tokens"});
  expect_error(patched<uint64_t>(tokens.value + 12, k2p63), {"array string length 9223372036854775808", "tokenizer.ggml.tokens"});
  const KvPos& arch = l.kv.at("general.architecture");
  expect_error(patched<uint64_t>(arch.value, k2p63), {"string length 9223372036854775808", "general.architecture"});
  expect_error(patched<uint64_t>(arch.value, size), {"truncated", "general.architecture"});
  expect_error(patched<uint64_t>(arch.key_len, k2p63), {"key length 9223372036854775808"});
  expect_error(patched<uint64_t>(l.tensors[0].name_len, k2p63), {"tensor name length 9223372036854775808"});
  expect_error(patched<uint64_t>(l.tensors[0].dims, k2p63), {"dimension 0 = 9223372036854775808", "'output.weight'"});

  // An array longer than the per-file element limit, backed by real bytes so the size bound passes.
  Bytes big;
  big.header(0, 1).str("huge").u32(9).u32(0).u64((1ull << 24) + 1).zeros((1ull << 24) + 1);
  expect_error(big.b, {"array length 16777217", "limit", "'huge'"});
}

TEST_CASE("counts that a huge (sparse) file would allow still fail with gguf::Error", "[gguf][fixtures]") {
  // 16 GiB of virtual file: the size-based bounds pass, so only the reader's limits stand between a corrupt
  // count and an allocation sized by it (which would throw std::bad_alloc, not gguf::Error).
  const Layout l = walk(tiny_bytes());
  const size_t header = tiny_data_offset();
  std::string path = temp_path("sparse.gguf");
  auto check = [&](size_t pos, uint64_t value, std::initializer_list<std::string> fragments) {
    std::vector<uint8_t> b(tiny_bytes().begin(), tiny_bytes().begin() + header);
    put_le(b, pos, value);
    write_bytes(path, b.data(), b.size());
    std::filesystem::resize_file(path, 16ull << 30);
    struct stat st{};
    const bool sparse = ::stat(path.c_str(), &st) == 0 && (uint64_t)st.st_blocks * 512 <= (64u << 20);
    QRIG_REQUIRE_INPUT(sparse, "a 16 GiB file at " << path << " takes real disk space (no sparse files there; "
                                                   "set TMPDIR to a file system that has them)");
    alloc_probe_arm();
    std::string msg;
    try {
      gguf::File::open(path);
    } catch (const gguf::Error& e) {
      msg = e.what();
    }
    size_t largest = alloc_probe_disarm();
    INFO(msg);
    REQUIRE(!msg.empty());
    for (const std::string& f : fragments) CHECK_THAT(msg, Contains(f));
    CHECK(largest <= (1u << 20));
  };
  check(16, 1ull << 30, {"metadata count 1073741824", "limit"});
  check(8, 1ull << 28, {"tensor count 268435456", "limit"});
  check(l.kv.at("tokenizer.ggml.tokens").value + 4, 1ull << 30, {"array length 1073741824", "limit"});
  check(l.kv.at("tokenizer.chat_template").value, 1ull << 31, {"string length 2147483648", "larger than allowed"});
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TEST_CASE("bad magic, unsupported versions and unknown type ids are named", "[gguf][fixtures]") {
  const Layout l = walk(tiny_bytes());
  expect_error(patched<uint32_t>(0, 0x4C4D4747), {"bad magic"});  // "GGML"
  for (uint32_t v : {0u, 1u, 4u, 0xFFFFFFFFu}) expect_error(patched<uint32_t>(4, v), {"version " + std::to_string(v)});
  std::vector<uint8_t> v2 = patched<uint32_t>(4, 2);  // v2 has the v3 layout
  CHECK(gguf::File::from_bytes(v2.data(), v2.size()).version() == 2);

  expect_error(patched<uint32_t>(l.kv.at("general.type").type, 13), {"unknown value type 13", "'general.type'"});
  expect_error(patched<uint32_t>(l.kv.at("general.type").type, 0xFFFFFFFF), {"unknown value type 4294967295"});
  expect_error(patched<uint32_t>(l.kv.at("tokenizer.ggml.merges").value, 13),
               {"unknown array element type 13", "'tokenizer.ggml.merges'"});
  const TensorPos& a = l.tensor("blk.0.ssm_a");
  for (uint32_t id : {4u, 31u, 40u, 1000u})
    expect_error(patched<uint32_t>(a.type, id), {"unknown tensor type id " + std::to_string(id), "'blk.0.ssm_a'"});
  // A known type whose block does not divide the row: ssm_a is [4], Q8_0 blocks hold 32.
  expect_error(patched<uint32_t>(a.type, 8), {"'blk.0.ssm_a'", "Q8_0", "block size 32"});
}

TEST_CASE("misaligned, overlapping and out-of-range tensor data are rejected", "[gguf][fixtures]") {
  const Layout l = walk(tiny_bytes());
  gguf::File f = gguf::File::from_bytes(tiny_bytes().data(), tiny_bytes().size());
  const TensorPos& norm = l.tensor("blk.0.ssm_norm.weight");
  uint64_t norm_off = f.tensor("blk.0.ssm_norm.weight").offset;
  expect_error(patched<uint64_t>(norm.offset, norm_off + 1), {"not aligned", "'blk.0.ssm_norm.weight'"});
  expect_error(patched<uint64_t>(l.tensor("token_embd.weight").offset, 0), {"overlap", "'output.weight'", "'token_embd.weight'"});
  uint64_t attn_norm = f.tensor("blk.0.attn_norm.weight").offset;
  expect_error(patched<uint64_t>(l.tensor("blk.0.ssm_a").offset, attn_norm + 32),
               {"overlap", "'blk.0.attn_norm.weight'", "'blk.0.ssm_a'"});
  expect_error(patched<uint64_t>(l.tensor("output_norm.weight").offset, 1ull << 40), {"extends past the end", "'output_norm.weight'"});
  expect_error(patched<uint64_t>(l.tensor("output_norm.weight").offset, UINT64_MAX - 31), {"'output_norm.weight'"});
  // Two tensors moved apart into a gap stay valid: gaps are allowed, sharing bytes is not.
  std::vector<uint8_t> ok = patched<uint64_t>(l.tensor("output_norm.weight").offset, f.tensors().back().offset);
  CHECK(error_of(ok).empty());
}

TEST_CASE("duplicate keys and tensor names, bad dimensions, values and nesting are rejected", "[gguf][fixtures]") {
  const Layout l = walk(tiny_bytes());
  // "general.type" -> "general.name": same length, now a duplicate.
  std::vector<uint8_t> dup = tiny_bytes();
  std::memcpy(dup.data() + l.kv.at("general.type").key_len + 8, "general.name", 12);
  expect_error(dup, {"duplicate key", "'general.name'"});
  std::vector<uint8_t> dupt = tiny_bytes();
  dupt[l.tensor("blk.1.ssm_a").name_len + 8 + 4] = '0';  // blk.1.ssm_a -> blk.0.ssm_a
  expect_error(dupt, {"duplicate tensor name", "'blk.0.ssm_a'"});

  const TensorPos& n = l.tensor("blk.0.attn_norm.weight");
  expect_error(patched<uint32_t>(n.n_dims, 0), {"dimension count 0", "'blk.0.attn_norm.weight'"});
  expect_error(patched<uint32_t>(n.n_dims, 5), {"dimension count 5", "'blk.0.attn_norm.weight'"});
  expect_error(patched<uint64_t>(n.dims, 0), {"dimension 0 = 0", "'blk.0.attn_norm.weight'"});
  expect_error(one_tensor({1, 1, 1, 1, 1}, 0, 0, 4), {"dimension count 5", "'weird'"});
  expect_error(one_tensor({}, 0, 0, 4, 0), {"dimension count 0", "'weird'"});
  expect_error(one_tensor({1ull << 32, 1ull << 32, 1ull << 32}, 0, 0, 64), {"element count overflows", "'weird'"});
  expect_error(one_tensor({1ull << 40, 8}, 0, 0, 64), {"element count is absurd", "'weird'"});
  expect_error(one_tensor({33}, 8, 0, 64), {"block size 32", "'weird'"});
  expect_error(one_tensor({8}, 0, 0, 31), {"extends past the end", "'weird'"});
  CHECK(error_of(one_tensor({8}, 0, 0, 32)).empty());

  Bytes b;
  b.header(0, 1).str("flag").u32(7).u8(2);
  expect_error(b.b, {"bool value 2", "'flag'"});
  for (uint32_t align : {0u, 3u, 1u << 21}) {
    Bytes a;
    a.header(0, 1).str("general.alignment").u32(4).u32(align);
    expect_error(a.b, {"general.alignment"});
  }
  Bytes as;
  as.header(0, 1).str("general.alignment").u32(8).str("32");
  expect_error(as.b, {"general.alignment"});

  // Arrays of arrays: 9 levels parse, 10 do not.
  auto nested = [](int levels) {
    gguf::Value v = gguf::Value::of_i32s({1});
    for (int k = 1; k < levels; ++k) {
      gguf::Value outer;
      outer.type = gguf::ValueType::ARRAY;
      outer.elem = gguf::ValueType::ARRAY;
      outer.arr.push_back(v);
      v = outer;
    }
    gguf::Writer w;
    w.set("deep", v);
    return w.to_bytes();
  };
  CHECK(error_of(nested(9)).empty());
  expect_error(nested(10), {"nested too deeply", "'deep'"});
}
