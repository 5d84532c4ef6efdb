// IR text form: print -> parse -> print is identical, attributes of every kind survive, and malformed text
// or graphs fail with messages naming the line or op.
#include <catch2/catch.hpp>

#include "ir/ir.h"
#include "ir/plan.h"

using namespace qrig::ir;

namespace {

Graph sample_graph() {
  Graph g;
  g.name = "sample";
  g.inputs = {{"tokens", {DType::i32, {kTokens}}}, {"pos", {DType::i32, {kTokens}}}, {"rows", {DType::i32, {kRows}}}};
  g.states = {{"kv.0", {DType::f16, {2, kContext, 256}}}};
  Op e;
  e.result = "x0";
  e.kind = "embed";
  e.args = {"tokens"};
  e.attrs = {{"weight", std::string("token_embd.weight")}, {"tap", std::string("with \"quotes\" and \\ and\nnewline")}};
  e.type = {DType::f32, {kTokens, 256}};
  Op n;
  n.result = "n0";
  n.kind = "rmsnorm";
  n.args = {"x0"};
  n.attrs = {{"weight", std::string("w")}, {"eps", 1e-6}, {"big", int64_t{-9007199254740993}}, {"list", std::vector<int64_t>{11, 11, 10, 0}},
             {"empty", std::vector<int64_t>{}}, {"third", 1.0 / 3.0}, {"whole", 2.0}};
  n.type = {DType::f32, {kTokens, 256}};
  Op w;
  w.kind = "kv_write";
  w.args = {"n0", "n0", "pos"};
  w.attrs = {{"cache", std::string("kv.0")}};
  Op r;
  r.result = "out";
  r.kind = "gather_rows";
  r.args = {"n0", "rows"};
  r.type = {DType::f32, {kRows, 256}};
  g.ops = {e, n, w, r};
  g.outputs = {"out"};
  return g;
}

}  // namespace

TEST_CASE("IR text round-trips exactly", "[ir]") {
  Graph g = sample_graph();
  verify(g);
  std::string text = print(g);
  Graph back = parse(text);
  CHECK(print(back) == text);
  const Op& n = back.ops[1];
  CHECK(n.f("eps") == 1e-6);
  CHECK(n.f("third") == 1.0 / 3.0);  // shortest repr still round-trips bit-exactly
  CHECK(std::holds_alternative<double>(n.attrs[6].second));  // 2.0 stays a float
  CHECK(n.i("big") == -9007199254740993LL);
  CHECK(n.ints("list") == std::vector<int64_t>{11, 11, 10, 0});
  CHECK(n.ints("empty").empty());
  CHECK(back.ops[0].s("tap") == "with \"quotes\" and \\ and\nnewline");
  CHECK(back.states[0].type == Type{DType::f16, {2, kContext, 256}});
  CHECK(back.ops[2].result.empty());
  CHECK(back.type_of("out")->shape == std::vector<int64_t>{kRows, 256});
}

TEST_CASE("IR parse errors name the line", "[ir]") {
  const std::string good = print(sample_graph());
  CHECK_THROWS_WITH(parse("nonsense"), Catch::Contains("line 1"));
  CHECK_THROWS_WITH(parse("graph g {\n  %x = add(%a, %b) : f32[T,4]\n"), Catch::Contains("closing"));
  CHECK_THROWS_WITH(parse("graph g {\n  %x = add(%a %b) : f32[T,4]\n}\n"), Catch::Contains("line 2"));
  CHECK_THROWS_WITH(parse("graph g {\n  input %t : q4[T]\n}\n"), Catch::Contains("unknown dtype"));
  CHECK_THROWS_WITH(parse("graph g {\n  input %t : f32[0]\n}\n"), Catch::Contains("positive"));
  CHECK_THROWS_WITH(parse("graph g {\n  %x = add(%a, %b) {k=\"open} : f32[4]\n}\n"), Catch::Contains("unterminated"));
  CHECK_THROWS_WITH(parse("graph g {\n}\nmore\n"), Catch::Contains("after the closing"));
  CHECK_THROWS_WITH(parse("graph g {\n  %x = add(%a, %b) {k=1x} : f32[4]\n}\n"), Catch::Contains("bad integer"));
  // Truncating the good text at any line boundary never crashes: it parses or throws Error.
  for (size_t cut = 0; cut < good.size(); cut += 7) {
    try {
      parse(good.substr(0, cut));
    } catch (const Error&) {
    }
  }
}

TEST_CASE("IR verify rejects malformed graphs", "[ir]") {
  Graph g = sample_graph();
  g.ops[1].args = {"nope"};
  CHECK_THROWS_WITH(verify(g), Catch::Contains("before it is defined"));
  g = sample_graph();
  g.ops[1].kind = "frobnicate";
  CHECK_THROWS_WITH(verify(g), Catch::Contains("unknown op kind"));
  g = sample_graph();
  g.ops[1].attrs.erase(g.ops[1].attrs.begin());
  CHECK_THROWS_WITH(verify(g), Catch::Contains("lacks attribute 'weight'"));
  g = sample_graph();
  g.ops[2].attrs = {{"cache", std::string("kv.9")}};
  CHECK_THROWS_WITH(verify(g), Catch::Contains("undeclared state"));
  g = sample_graph();
  g.ops[1].result = "x0";
  CHECK_THROWS_WITH(verify(g), Catch::Contains("defined twice"));
  g = sample_graph();
  g.ops[3].args.pop_back();
  CHECK_THROWS_WITH(verify(g), Catch::Contains("takes 2 arguments"));
  g = sample_graph();
  g.outputs = {"ghost"};
  CHECK_THROWS_WITH(verify(g), Catch::Contains("output %ghost"));
  CHECK_THROWS_WITH(sample_graph().ops[1].i("eps"), Catch::Contains("not an integer"));
  CHECK_THROWS_WITH(sample_graph().ops[1].s("missing"), Catch::Contains("no attribute 'missing'"));
}
