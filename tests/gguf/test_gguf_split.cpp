// Split models (llama.cpp's gguf-split layout, written by tests/split_gguf.h from tiny.gguf): the first shard opens
// the whole model, every tensor's data comes from its own file, byte for byte as in the unsplit file; a missing,
// foreign or renamed shard, a shard given first, and counts that do not add up are errors naming the file.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "gguf/gguf.h"
#include "tests/fixtures.h"
#include "tests/gguf/gguf_test_util.h"
#include "tests/split_gguf.h"

using namespace qrig;
using Catch::Matchers::Contains;

namespace {

// A fresh directory, removed at scope exit.
struct Scratch {
  std::filesystem::path path;
  explicit Scratch(const std::string& tag) {
    static int n = 0;
    path = std::filesystem::temp_directory_path() / fmt::format("qrig-{}-{}-{}", tag, ::getpid(), n++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

const gguf::File& tiny() {
  static const gguf::File f = gguf::File::open(gguf_test::tiny_path());
  return f;
}

}  // namespace

TEST_CASE("a split model opens from its first shard with every tensor from its own file", "[gguf][split][fixtures]") {
  Scratch dir("split");
  const std::string prefix = (dir.path / "tiny").string();
  const auto paths = fixtures::write_split_gguf(tiny(), prefix, 3);
  REQUIRE(paths.size() == 3);
  CHECK(std::filesystem::path(paths[0]).filename() == "tiny-00001-of-00003.gguf");
  CHECK(std::filesystem::path(paths[2]).filename() == "tiny-00003-of-00003.gguf");

  const gguf::File f = gguf::File::open(paths[0]);
  REQUIRE(f.shards().size() == 3);
  uint64_t bytes = 0, held = 0;
  for (size_t k = 0; k < 3; ++k) {
    CHECK(f.shards()[k].path == paths[k]);
    CHECK(f.shards()[k].size == std::filesystem::file_size(paths[k]));
    bytes += f.shards()[k].size;
    held += f.shards()[k].tensors;
    CHECK(f.shards()[k].tensors > 0);
  }
  CHECK(f.file_size() == bytes);
  CHECK(f.path() == paths[0]);
  REQUIRE(f.tensors().size() == tiny().tensors().size());
  CHECK(held == f.tensors().size());
  // The metadata is the first shard's: everything of the original plus the split keys.
  for (const auto& [key, v] : tiny().metadata()) {
    INFO(key);
    CHECK(f.find(key) != nullptr);
  }
  CHECK(f.get_uint(gguf::kSplitCount) == 3);
  CHECK(f.get_string("general.architecture") == "qwen35");

  // Every tensor: same type, shape and bytes as in tiny.gguf, and its pointer lies inside its shard's file.
  std::vector<std::vector<uint8_t>> files;
  for (const auto& p : paths) files.push_back(gguf_test::read_file(p));
  int on_later_shards = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    INFO(t.name);
    const gguf::TensorInfo& want = tiny().tensor(t.name);
    CHECK(t.type == want.type);
    CHECK(t.ne == want.ne);
    REQUIRE(t.n_bytes == want.n_bytes);
    CHECK(std::memcmp(f.tensor_data(t), tiny().tensor_data(want), t.n_bytes) == 0);
    const auto& raw = files[t.shard];
    const size_t at = f.shards()[t.shard].data_offset + t.offset;
    REQUIRE(at + t.n_bytes <= raw.size());
    CHECK(std::memcmp(f.tensor_data(t), raw.data() + at, t.n_bytes) == 0);
    on_later_shards += t.shard > 0;
  }
  CHECK(on_later_shards > 0);
  // One shard is a model too (split.count 1 names no other file).
  Scratch one("split-one");
  const auto single = fixtures::write_split_gguf(tiny(), (one.path / "m").string(), 1);
  CHECK(gguf::File::open(single[0]).shards().size() == 1);
  CHECK(gguf::File::open(single[0]).tensors().size() == tiny().tensors().size());
}

TEST_CASE("a missing or mismatched shard is an error naming it", "[gguf][split][fixtures]") {
  Scratch dir("split-bad");
  const std::string prefix = (dir.path / "tiny").string();
  auto paths = fixtures::write_split_gguf(tiny(), prefix, 3);

  SECTION("missing") {
    std::filesystem::remove(paths[1]);
    CHECK_THROWS_WITH(gguf::File::open(paths[0]), Contains("shard 2 of 3 is missing") && Contains(paths[1]));
  }
  SECTION("a shard of another split of the same model") {
    const auto four = fixtures::write_split_gguf(tiny(), (dir.path / "other").string(), 4);
    std::filesystem::copy_file(four[2], paths[2], std::filesystem::copy_options::overwrite_existing);
    CHECK_THROWS_WITH(gguf::File::open(paths[0]), Contains(paths[2]) && Contains("is not shard 3 of 3") &&
                                                      Contains("split.count 4"));
  }
  SECTION("the same shard twice") {
    std::filesystem::copy_file(paths[1], paths[2], std::filesystem::copy_options::overwrite_existing);
    CHECK_THROWS_WITH(gguf::File::open(paths[0]), Contains(paths[2]) && Contains("split.no is 1"));
  }
  SECTION("a shard that is not a GGUF") {
    { std::ofstream(paths[2], std::ios::binary) << "not a model"; }
    CHECK_THROWS_WITH(gguf::File::open(paths[0]), Contains(paths[2]) && Contains("bad magic"));
  }
  SECTION("given a later shard") {
    CHECK_THROWS_WITH(gguf::File::open(paths[1]), Contains("shard 2 of 3") && Contains(paths[0]));
  }
  SECTION("renamed first shard") {
    const std::string renamed = (dir.path / "renamed.gguf").string();
    std::filesystem::rename(paths[0], renamed);
    CHECK_THROWS_WITH(gguf::File::open(renamed), Contains("-00001-of-00003.gguf") && Contains(renamed));
  }
  SECTION("split.tensors.count does not add up") {
    paths = fixtures::write_split_gguf(tiny(), prefix, 3, {(int32_t)tiny().tensors().size() + 1});
    CHECK_THROWS_WITH(gguf::File::open(paths[0]), Contains("split.tensors.count is 110") && Contains("hold 109"));
  }
}
