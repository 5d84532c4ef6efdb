// Chat formatter against the external oracle: every conversation of
// ../shared/fixtures/tiny-chat-cases.json (rendered by transformers with the official template)
// must come out byte for byte, and the template embedded in tiny.gguf must be the reference one the
// formatter implements.
#include <catch2/catch.hpp>

#include "gguf/gguf.h"
#include "text/chat.h"

#include <fstream>
#include <sstream>
#include "tests/fixtures.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("chat: tiny-chat-cases.json renders byte for byte", "[text][chat][fixtures]") {
  auto cases = nlohmann::ordered_json::parse(
      read_file(qrig::fixtures::shared_dir() + "/fixtures/tiny-chat-cases.json"));
  REQUIRE(cases.is_array());
  REQUIRE(cases.size() >= 7);
  for (const auto& c : cases) {
    INFO("case " << c.at("name").get<std::string>());
    qrig::text::ChatOptions opt;
    opt.enable_thinking = c.value("enable_thinking", true);
    std::string got = qrig::text::render_chat(c.at("messages"), c.value("tools", nlohmann::ordered_json()), opt);
    CHECK(got == c.at("rendered").get<std::string>());
  }
}

TEST_CASE("chat: tiny.gguf embeds the reference Qwen3.5 template", "[text][chat][fixtures]") {
  auto file = qrig::gguf::File::open(qrig::fixtures::shared_dir() + "/fixtures/tiny.gguf");
  std::string embedded = file.get_string("tokenizer.chat_template");
  std::string reference = read_file(qrig::fixtures::shared_dir() + "/reference/qwen3.5-chat-template.jinja");
  CHECK(embedded == reference);
}
