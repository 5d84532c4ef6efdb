// Chat formatter against python3-jinja2: tests/text/chat_corpus.py generates a few hundred varied
// conversations (tools, tool calls and results, reasoning, content parts, unicode, options, error
// cases) and renders them with the template read from tiny.gguf, set up as transformers does; every
// rendering must match byte for byte and every case the template rejects must throw ChatError (with
// the template's own message when it came from raise_exception). Fails if python3 or jinja2 is
// missing.
#include <catch2/catch.hpp>

#include "text/chat.h"

#include <cstdio>
#include <sstream>
#include <sys/wait.h>
#include "tests/fixtures.h"

namespace {

using Json = nlohmann::ordered_json;

// Runs `command` and returns its stdout; the exit status goes to `status`.
std::string run_command(const std::string& command, int& status) {
  FILE* p = popen(command.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + command);
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  status = pclose(p);
  return out;
}

}  // namespace

TEST_CASE("chat: corpus rendered by python3-jinja2 matches", "[text][chat][fixtures]") {
  std::string cmd = std::string("python3 '") + QRIG_SOURCE_DIR + "/tests/text/chat_corpus.py' '" +
                    qrig::fixtures::shared_dir() + "/fixtures/tiny.gguf'";
  int status = 0;
  std::string output = run_command(cmd, status);
  INFO("command: " << cmd);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);

  std::istringstream lines(output);
  std::string line;
  size_t rendered = 0, template_errors = 0, other_errors = 0;
  while (std::getline(lines, line)) {
    Json record = Json::parse(line);
    const Json& c = record.at("case");
    qrig::text::ChatOptions opt;
    opt.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    opt.enable_thinking = c.value("enable_thinking", true);
    opt.preserve_thinking = c.value("preserve_thinking", false);
    opt.add_vision_id = c.value("add_vision_id", false);
    const Json tools = c.value("tools", Json());
    INFO("case " << c.at("name").get<std::string>() << ": " << c.dump());
    if (record.contains("rendered")) {
      ++rendered;
      std::string got;
      CHECK_NOTHROW(got = qrig::text::render_chat(c.at("messages"), tools, opt));
      CHECK(got == record.at("rendered").get<std::string>());
    } else {
      std::string kind = record.at("kind").get<std::string>();
      std::string expected = record.at("error").get<std::string>();
      INFO("jinja error (" << kind << "): " << expected);
      (kind == "template" ? template_errors : other_errors)++;
      bool threw = false;
      std::string message;
      try {
        qrig::text::render_chat(c.at("messages"), tools, opt);
      } catch (const qrig::text::ChatError& e) {
        threw = true;
        message = e.what();
      }
      CHECK(threw);
      if (kind == "template") CHECK(message == expected);
    }
  }
  INFO("rendered " << rendered << ", template errors " << template_errors << ", other errors "
                   << other_errors);
  CHECK(rendered >= 300);
  CHECK(template_errors >= 30);
  CHECK(other_errors >= 5);
}
