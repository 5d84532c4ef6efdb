// IR text form: print -> parse -> print is identical, attributes of every kind (string lists too), graph
// attributes and multi-result ops survive, and malformed text or graphs fail with messages naming the line or
// op. The op table is complete and in enum order; the per-range kernel attribute parses and prints back.
#include <catch2/catch.hpp>

#include <set>

#include "ir/ir.h"
#include "ir/kernel_attr.h"
#include "ir/plan.h"

using namespace qrig::ir;

namespace {

Op make(OpKind kind, std::vector<std::string> results, std::vector<Type> types, std::vector<std::string> args,
        std::vector<std::pair<std::string, AttrValue>> attrs) {
  Op o;
  o.kind = kind;
  o.results = std::move(results);
  o.types = std::move(types);
  o.args = std::move(args);
  o.attrs = std::move(attrs);
  return o;
}

Graph sample_graph() {
  Graph g;
  g.name = "sample";
  g.inputs = {{"tokens", {DType::i32, {kTokens}}}, {"pos", {DType::i32, {kTokens}}}, {"rows", {DType::i32, {kRows}}}};
  g.states = {{"k.0", {DType::f16, {kContext, 256}}}, {"v.0", {DType::f16, {kContext, 256}}}};
  g.attrs = {{"argmax_kernel", std::string("argmax_f32_t1024")},
             {"top_k_kernels", std::vector<std::string>{"a_t32", "b \"q\" t64"}}};
  Op e = make(OpKind::embed, {"x0"}, {{DType::f32, {kTokens, 256}}}, {"tokens"},
              {{"weight", std::string("token_embd.weight")}, {"tap", std::string("with \"quotes\" and \\ and\nnewline")}});
  Op n = make(OpKind::rmsnorm, {"n0"}, {{DType::f32, {kTokens, 256}}}, {"x0"},
              {{"weight", std::string("w")}, {"eps", 1e-6}, {"big", int64_t{-9007199254740993}},
               {"list", std::vector<int64_t>{11, 11, 10, 0}}, {"empty", std::vector<int64_t>{}}, {"third", 1.0 / 3.0},
               {"whole", 2.0}});
  Op q = make(OpKind::quantize, {"n0.q"}, {{DType::q8, {kTokens, 256}}}, {"n0"}, {{"precise_rows", int64_t{4}}});
  Op s = make(OpKind::matmul_stack, {"a", "b"}, {{DType::f32, {kTokens, 256}}, {DType::f32, {kTokens, 64}}}, {"n0.q"},
              {{"weights", std::vector<std::string>{"wa", "wb"}}});
  Op w = make(OpKind::kv_write, {}, {}, {"a", "a", "pos"},
              {{"k_cache", std::string("k.0")}, {"v_cache", std::string("v.0")}});
  Op r = make(OpKind::gather_rows, {"out"}, {{DType::f32, {kRows, 256}}}, {"n0", "rows"}, {});
  g.ops = {e, n, q, s, w, r};
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
  CHECK(back.states[0].type == Type{DType::f16, {kContext, 256}});
  CHECK(back.ops[4].results.empty());
  CHECK(back.type_of("out")->shape == std::vector<int64_t>{kRows, 256});
  // Multi-result ops, string lists, q8 values and graph attributes.
  REQUIRE(back.ops[3].results == std::vector<std::string>{"a", "b"});
  CHECK(back.type_of("b")->shape == std::vector<int64_t>{kTokens, 64});
  CHECK(back.ops[3].strs("weights") == std::vector<std::string>{"wa", "wb"});
  CHECK(back.type_of("n0.q")->dtype == DType::q8);
  CHECK(back.producer("b") == &back.ops[3]);
  REQUIRE(back.attr("top_k_kernels"));
  CHECK(std::get<std::vector<std::string>>(*back.attr("top_k_kernels"))[1] == "b \"q\" t64");
  CHECK(std::get<std::string>(*back.attr("argmax_kernel")) == "argmax_f32_t1024");
  CHECK(back.attr("missing") == nullptr);
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
  CHECK_THROWS_WITH(parse("graph g {\n  %x = frobnicate(%a) : f32[4]\n}\n"), Catch::Contains("unknown op kind 'frobnicate'"));
  CHECK_THROWS_WITH(parse("graph g {\n  frobnicate(%a)\n}\n"), Catch::Contains("unknown op kind"));
  CHECK_THROWS_WITH(parse("graph g {\n  %x, %y = add(%a, %b) : f32[4]\n}\n"), Catch::Contains("2 results but 1 types"));
  CHECK_THROWS_WITH(parse("graph g {\n  %x = add(%a, %b) {k=[\"a\", 3]} : f32[4]\n}\n"), Catch::Contains("string list"));
  // Truncating the good text at any point never crashes: it parses or throws Error.
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
  g.ops[1].attrs.erase(g.ops[1].attrs.begin());
  CHECK_THROWS_WITH(verify(g), Catch::Contains("lacks attribute 'weight'"));
  g = sample_graph();
  g.ops[4].attrs = {{"k_cache", std::string("k.9")}, {"v_cache", std::string("v.0")}};
  CHECK_THROWS_WITH(verify(g), Catch::Contains("undeclared state"));
  g = sample_graph();
  g.ops[1].results = {"x0"};
  CHECK_THROWS_WITH(verify(g), Catch::Contains("defined twice"));
  g = sample_graph();
  g.ops[5].args.pop_back();
  CHECK_THROWS_WITH(verify(g), Catch::Contains("takes 2 arguments"));
  g = sample_graph();
  g.outputs = {"ghost"};
  CHECK_THROWS_WITH(verify(g), Catch::Contains("output %ghost"));
  g = sample_graph();
  g.ops[3].types.pop_back();
  CHECK_THROWS_WITH(verify(g), Catch::Contains("2 results and 1 types"));
  g = sample_graph();
  g.ops[3].attrs = {{"weights", std::vector<std::string>{"wa"}}};
  CHECK_THROWS_WITH(verify(g), Catch::Contains("1 weights for 2 results"));
  g = sample_graph();
  g.ops[5].args[0] = "n0.q";  // only matmuls read quantized values
  CHECK_THROWS_WITH(verify(g), Catch::Contains("only matmuls read q8 values"));
  g = sample_graph();
  g.ops[2].types[0].dtype = DType::f32;  // quantize makes q8
  CHECK_THROWS_WITH(verify(g), Catch::Contains("this op makes q8 values"));
  g = sample_graph();
  g.ops[4].results = {"extra"};
  g.ops[4].types = {{DType::f32, {kTokens, 1}}};
  CHECK_THROWS_WITH(verify(g), Catch::Contains("must not have a result"));
  CHECK_THROWS_WITH(sample_graph().ops[1].i("eps"), Catch::Contains("not an integer"));
  CHECK_THROWS_WITH(sample_graph().ops[1].s("missing"), Catch::Contains("no attribute 'missing'"));
  CHECK_THROWS_WITH(sample_graph().ops[3].result(), Catch::Contains("2 results, not one"));
}

TEST_CASE("IR: the fused quantizing ops' results (add_rmsnorm_quant: the sum f32, then q8) verify and round-trip",
          "[ir]") {
  auto fused = [] {
    Graph g;
    g.name = "fused";
    g.inputs = {{"tokens", {DType::i32, {kTokens}}}, {"pos", {DType::i32, {kTokens}}}, {"rows", {DType::i32, {kRows}}}};
    const Type f{DType::f32, {kTokens, 256}}, q{DType::q8, {kTokens, 256}};
    g.ops = {make(OpKind::embed, {"x0"}, {f}, {"tokens"}, {{"weight", std::string("token_embd.weight")}}),
             make(OpKind::embed, {"y0"}, {f}, {"tokens"}, {{"weight", std::string("token_embd.weight")}}),
             make(OpKind::add_rmsnorm_quant, {"x1", "x1.n.q"}, {f, q}, {"x0", "y0"},
                  {{"weight", std::string("w")}, {"eps", 1e-6}, {"precise_rows", int64_t{4}}, {"tap", std::string("h1")}}),
             make(OpKind::matmul_stack, {"g", "u"}, {f, f}, {"x1.n.q"}, {{"weights", std::vector<std::string>{"wg", "wu"}}}),
             make(OpKind::swiglu_quant, {"act.q"}, {q}, {"g", "u"}, {{"precise_rows", int64_t{4}}}),
             make(OpKind::matmul, {"down"}, {f}, {"act.q"}, {{"weight", std::string("wd")}}),
             make(OpKind::add, {"x2"}, {f}, {"x1", "down"}, {})};  // the sum is an f32 value any op reads
    g.outputs = {"x2"};
    return g;
  };
  Graph g = fused();
  CHECK_NOTHROW(verify(g));
  const std::string text = print(g);
  CHECK(text.find("%x1, %x1.n.q = add_rmsnorm_quant(%x0, %y0)") != std::string::npos);
  CHECK(print(parse(text)) == text);
  CHECK(makes_q8(OpKind::add_rmsnorm_quant, 1));
  CHECK_FALSE(makes_q8(OpKind::add_rmsnorm_quant, 0));
  CHECK(makes_q8(OpKind::swiglu_quant, 0));
  g = fused();
  std::swap(g.ops[2].types[0], g.ops[2].types[1]);  // the sum first, its quantized norm second
  CHECK_THROWS_WITH(verify(g), Catch::Contains("%x1 is q8"));
  g = fused();
  g.ops[2].results.pop_back();
  g.ops[2].types.pop_back();
  CHECK_THROWS_WITH(verify(g), Catch::Contains("has the wrong results"));
  g = fused();
  g.ops[6].args[1] = "act.q";  // only matmuls read the quantized activation
  CHECK_THROWS_WITH(verify(g), Catch::Contains("only matmuls read q8 values"));
  g = fused();
  g.ops[4].types[0].dtype = DType::f32;
  CHECK_THROWS_WITH(verify(g), Catch::Contains("this op makes q8 values"));
}

TEST_CASE("the op table has one row per op kind, in order, with unique names", "[ir]") {
  const auto& t = op_schemas();
  REQUIRE(t.size() == kOpKindCount);
  std::set<std::string> names;
  for (size_t k = 0; k < t.size(); ++k) {
    CHECK((size_t)t[k].kind == k);
    CHECK(names.insert(t[k].name).second);
    CHECK(find_schema(t[k].name) == &t[k]);
    CHECK(std::string(t[k].doc).size() > 10);
  }
  CHECK(find_schema("frobnicate") == nullptr);
}

TEST_CASE("the per-range kernel attribute parses, prints back and finds the range of a row count", "[ir]") {
  const std::string text = "1-1:g_t32 2-4:a_t32+b_t64 5-512:x_t1,y_t2,z_t3";
  const auto r = parse_launch_ranges(text);
  REQUIRE(r.size() == 3);
  CHECK(r[1].parts == std::vector<std::vector<std::string>>{{"a_t32", "b_t64"}});
  CHECK(r[2].parts.size() == 3);
  CHECK(print_launch_ranges(r) == text);
  CHECK(launch_range_for(r, 1) == &r[0]);
  CHECK(launch_range_for(r, 4) == &r[1]);
  CHECK(launch_range_for(r, 512) == &r[2]);
  CHECK(launch_range_for(r, 513) == nullptr);
  CHECK(launch_range_for(r, 0) == nullptr);
  CHECK_THROWS_WITH(parse_launch_ranges("2-4:a"), Catch::Contains("continue at 1"));
  CHECK_THROWS_WITH(parse_launch_ranges("1-2:a 4-5:b"), Catch::Contains("continue at 3"));
  CHECK_THROWS_WITH(parse_launch_ranges("1-0:a"), Catch::Contains("positive"));
  CHECK_THROWS_WITH(parse_launch_ranges("3-2:a"), Catch::Contains("ends before"));
  CHECK_THROWS_WITH(parse_launch_ranges("1-2:a++b"), Catch::Contains("empty variant"));
  CHECK_THROWS_WITH(parse_launch_ranges("1-2"), Catch::Contains("FIRST-LAST"));
  CHECK_THROWS_WITH(parse_launch_ranges(""), Catch::Contains("no range"));
}
