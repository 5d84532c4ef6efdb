// The cubin cache and the kernel compiler, without a GPU: entries written atomically (concurrent readers
// never see a partial file, failures leave nothing behind), a second request served without compiling (from
// memory, then from disk in a new process-like object), cache entries distinct per arch and feature set, the
// no-JIT switch, the choice of NVRTC per architecture (sm_70: 11.8 or 12.x; the degraded sm_70 -> sm_75 mode
// when only NVRTC 13 is there), a plan's recorded NVRTC served from the cache, and NVRTC errors with the log.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/nvrtc.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> dir_listing(const fs::path& d) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

KernelCache::Entry pattern_entry(char c, size_t n) {
  KernelCache::Entry e;
  e.cubin.assign(n, c);
  for (size_t i = 0; i < n; i += 4096) e.cubin[i] = (char)(c + 1);  // not one repeated byte
  e.ptx = std::string(n / 4, c);
  e.log = std::string("log ") + c;
  return e;
}

}  // namespace

TEST_CASE("kernel cache: store then load, no temporary files left", "[cuda]") {
  test::ScratchDir d("cache");
  KernelCache cache(d.path / "nested" / "kernels");  // created when missing
  CHECK(!cache.load("x.sm_80.0123").has_value());
  const auto e = pattern_entry('a', 100000);
  cache.store("x.sm_80.0123", e);
  auto got = cache.load("x.sm_80.0123");
  REQUIRE(got.has_value());
  CHECK(got->cubin == e.cubin);
  CHECK(got->ptx == e.ptx);
  CHECK(got->log == e.log);
  CHECK(dir_listing(cache.dir()) == std::vector<std::string>{"x.sm_80.0123.cubin", "x.sm_80.0123.log", "x.sm_80.0123.ptx"});

  // An entry missing a file is a miss (the cubin is only renamed into place after the others).
  fs::remove(cache.path("x.sm_80.0123", ".ptx"));
  CHECK(!cache.load("x.sm_80.0123").has_value());
  CHECK_THROWS_AS(cache.store("empty", KernelCache::Entry{}), KernelError);
}

TEST_CASE("kernel cache: concurrent writers and readers never see a partial entry", "[cuda]") {
  test::ScratchDir d("cache-race");
  KernelCache cache(d.path);
  const auto a = pattern_entry('a', 4 << 20), b = pattern_entry('b', 4 << 20);
  std::atomic<bool> stop{false};
  auto writer = [&](const KernelCache::Entry& e) {
    for (int i = 0; i < 8; ++i) cache.store("race", e);
  };
  int loads = 0, torn = 0;
  std::thread reader([&] {
    while (!stop) {
      if (auto got = cache.load("race")) {
        ++loads;
        const bool ok_cubin = got->cubin == a.cubin || got->cubin == b.cubin;
        const bool ok_ptx = got->ptx == a.ptx || got->ptx == b.ptx;
        torn += !(ok_cubin && ok_ptx);
      }
    }
  });
  std::thread wa(writer, std::cref(a)), wb(writer, std::cref(b));
  wa.join();
  wb.join();
  stop = true;
  reader.join();
  CHECK(loads > 0);
  CHECK(torn == 0);
  CHECK(dir_listing(d.path) == std::vector<std::string>{"race.cubin", "race.log", "race.ptx"});
}

TEST_CASE("kernel cache: a failed store says which file and leaves no temporary file", "[cuda]") {
  test::ScratchDir d("cache-fail");
  KernelCache cache(d.path);
  fs::create_directories(cache.path("blocked", ".ptx") / "child");  // rename onto a non-empty directory fails
  CHECK_THROWS_WITH(cache.store("blocked", pattern_entry('c', 1000)), Catch::Contains("blocked.ptx"));
  CHECK(dir_listing(d.path) == std::vector<std::string>{"blocked.ptx"});
  CHECK(!cache.load("blocked").has_value());
}

TEST_CASE("kernel cache: default directory follows XDG_CACHE_HOME, then HOME", "[cuda]") {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = xdg ? xdg : "";
  setenv("XDG_CACHE_HOME", "/some/where", 1);
  CHECK(KernelCache::default_dir() == fs::path("/some/where/qrig/kernels"));
  unsetenv("XDG_CACHE_HOME");
  if (const char* home = std::getenv("HOME")) CHECK(KernelCache::default_dir() == fs::path(home) / ".cache/qrig/kernels");
  if (xdg) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

TEST_CASE("NVRTC choice: per architecture the newest that targets it, not newer than the driver", "[cuda]") {
  auto range = [](int lo, int hi) {
    std::vector<int> v;
    for (int sm : {35, 50, 52, 60, 61, 70, 72, 75, 80, 86, 87, 89, 90, 100, 120, 121})
      if (sm >= lo && sm <= hi) v.push_back(sm);
    return v;
  };
  const std::vector<NvrtcInfo> all = {{13, 0, range(75, 121)}, {12, 4, range(50, 90)}, {11, 8, range(35, 90)}};
  auto pick = [&](const std::vector<NvrtcInfo>& libs, int sm, int driver) { return pick_nvrtc(libs, sm, driver); };
  CHECK(pick(all, 70, 0).lib == 1);  // 12.4: NVRTC 13 cannot
  CHECK(pick(all, 70, 0).target_sm == 70);
  CHECK(!pick(all, 70, 0).degraded);
  CHECK(pick(all, 90, 0).lib == 0);   // no driver (CI): the newest
  CHECK(pick(all, 90, 13).lib == 0);
  CHECK(pick(all, 90, 12).lib == 1);  // a CUDA 12 driver: the newest NVRTC 12
  CHECK(pick(all, 120, 12).lib == 0); // only 13 targets it: newer than the driver, still the only one
  const std::vector<NvrtcInfo> old_only = {{11, 8, range(35, 90)}};
  CHECK(pick(old_only, 70, 13).lib == 0);
  CHECK(pick(old_only, 120, 13).lib == -1);  // nothing targets it or anything newer
  const std::vector<NvrtcInfo> only13 = {{13, 0, range(75, 121)}};
  const NvrtcPick d = pick(only13, 70, 0);
  CHECK(d.lib == 0);
  CHECK(d.degraded);
  CHECK(d.target_sm == 75);
  CHECK(pick({}, 90, 0).lib == -1);
}

TEST_CASE("architecture choice on this machine: real code for every architecture; degraded and missing NVRTC said clearly",
          "[cuda]") {
  const std::vector<NvrtcLib>& libs = nvrtc_libraries();
  REQUIRE(!libs.empty());
  const ArchChoice h = choose_arch(90);
  CHECK(h.target_sm == 90);
  CHECK(!h.substituted());
  CHECK(h.note.empty());
  CHECK(h.nvrtc == libs.front().version());
  const ArchChoice c = choose_arch(parse_sm("sm_70"));
  CHECK(c.feature_sm == 70);
  bool sm70 = false;
  for (const NvrtcLib& l : libs) sm70 |= l.supports(70);
  if (sm70) {  // CI: NVRTC 11.8 from Debian non-free
    CHECK(c.target_sm == 70);
    CHECK(c.note.empty());
    REQUIRE(c.lib);
    CHECK(c.lib->supports(70));
  }
  // Only NVRTC 13 (or any NVRTC without sm_70): the degraded mode, saying what to install.
  std::vector<NvrtcLib> no70;
  for (const NvrtcLib& l : libs)
    if (!l.supports(70)) no70.push_back(l);
  if (!no70.empty()) {
    const ArchChoice g = choose_arch_among(no70, 70, 0);
    CHECK(g.substituted());
    CHECK(g.target_sm == 75);
    CHECK_THAT(g.note, Catch::Contains("no NVRTC found here targets sm_70") && Catch::Contains("degraded") &&
                           Catch::Contains("do not run on sm_70") && Catch::Contains("libnvrtc11.2 libnvrtc-builtins11.8") &&
                           Catch::Contains("non-free"));
    // What `qrig probe` prints for an sm_70 GPU here, before compiling anything.
    const ArchKernels line = arch_kernels_among(no70, 70, 0);
    CHECK(!line.ok);
    CHECK_THAT(line.text, Catch::Contains("no NVRTC found here targets sm_70") && Catch::Contains("libnvrtc11.2"));
    // An NVRTC newer than the driver: its code may not load there; said so.
    const ArchKernels newer = arch_kernels_among(no70, 90, no70.front().major - 1);
    CHECK(!newer.ok);
    CHECK_THAT(newer.text, Catch::Contains("newer than the driver"));
  }
  CHECK_THROWS_WITH(choose_arch_among({}, 70, 0), Catch::Contains("no NVRTC can compile for sm_70") &&
                                                      Catch::Contains("libnvrtc11.2"));
  CHECK_THROWS_WITH(choose_arch(999), Catch::Contains("no NVRTC can compile for sm_999"));
  CHECK(arch_kernels(90).ok);
  CHECK_THAT(arch_kernels(90).text, Catch::Contains("sm_90 kernels: NVRTC " + libs.front().version()));
  CHECK(!arch_kernels(999).ok);
  CHECK_THROWS_AS(parse_sm("compute_90"), KernelError);
  CHECK_THROWS_AS(parse_sm("sm_9"), KernelError);
  CHECK(parse_sm("sm_120") == 120);
}

TEST_CASE("kernel compiler: a plan's recorded NVRTC that is not here serves cached kernels, and says what to do else",
          "[cuda]") {
  test::ScratchDir d("recorded");
  const Variant v = quant_act_q8_variant(1);
  const ArchChoice here = choose_arch(80);
  {
    KernelCompiler warm(d.path);
    warm.get(v, here);
  }
  ArchChoice gone = here;  // the same NVRTC version and target, its library absent (another machine)
  gone.lib = nullptr;
  KernelCompiler c(d.path);
  const CompiledKernel k = c.get(v, gone);
  CHECK(k.from_disk);
  CHECK(c.compiles() == 0);
  CHECK_THROWS_WITH(c.get(embed_q8_0_variant(256), gone),
                    Catch::Contains("embed_q8_0_d256_t32") && Catch::Contains("not on this machine") &&
                        Catch::Contains("copy the plan's kernel cache"));
  // choose_arch with a recorded version that is not here: no library, no exception (the cache decides).
  const ArchChoice r = choose_arch(80, "9.9", 80);
  CHECK(r.lib == nullptr);
  CHECK(r.nvrtc == "9.9");
  CHECK(r.target_sm == 80);
}

TEST_CASE("kernel compiler: a second request does not compile; a new compiler reads the disk cache", "[cuda]") {
  test::ScratchDir d("compiler");
  const Variant v = rmsnorm_f32_variant(256);
  KernelCompiler c1(d.path);
  const CompiledKernel k1 = c1.get(v, 80);
  CHECK(c1.compiles() == 1);
  CHECK(!k1.from_disk);
  CHECK(!k1.cubin.empty());
  CHECK(k1.ptx.find(".entry rmsnorm_f32") != std::string::npos);
  CHECK(k1.cache_stem.rfind("rmsnorm_f32_d256_q0_t64.sm_80.", 0) == 0);
  const CompiledKernel k1b = c1.get("rmsnorm_f32_d256_q0_t64", 80);
  CHECK(c1.compiles() == 1);
  CHECK(c1.memory_hits() == 1);
  CHECK(k1b.cubin == k1.cubin);

  KernelCompiler c2(d.path);
  const CompiledKernel k2 = c2.get(v, 80);
  CHECK(c2.compiles() == 0);
  CHECK(c2.disk_hits() == 1);
  CHECK(k2.from_disk);
  CHECK(k2.cubin == k1.cubin);
  CHECK(k2.ptx == k1.ptx);
  CHECK(k2.log == k1.log);

  // Other archs and feature sets are other entries (in the degraded mode sm_70 and sm_75 both emit sm_75 code,
  // but the kernels see a different QRIG_SM).
  c2.get(v, 75);
  c2.get(v, 70);
  CHECK(c2.compiles() == 2);
  const auto s80 = KernelCompiler::cache_stem(v, choose_arch(80)), s75 = KernelCompiler::cache_stem(v, choose_arch(75)),
             s70 = KernelCompiler::cache_stem(v, choose_arch(70));
  CHECK(s80 != s75);
  CHECK(s75 != s70);
  CHECK(KernelCompiler::cache_stem(rmsnorm_f32_variant(512), choose_arch(80)) != s80);
  if (choose_arch(70).substituted()) {
    REQUIRE(c2.notes().size() == 1);
    CHECK_THAT(c2.notes()[0], Catch::Contains("sm_70"));
  }
}

TEST_CASE("kernel compiler: the no-JIT switch makes a compile an error, cached kernels still load", "[cuda]") {
  test::ScratchDir d("nojit");
  {
    KernelCompiler warm(d.path);
    warm.get(quant_act_q8_variant(1), 86);
  }
  KernelCompiler c(d.path);
  c.forbid_jit();
  CHECK(c.jit_forbidden());
  const CompiledKernel k = c.get(quant_act_q8_variant(1), 86);  // warmed: from disk
  CHECK(k.from_disk);
  CHECK_THROWS_AS(c.get(quant_act_q8_variant(1), 89), JitForbidden);
  CHECK_THROWS_WITH(c.get(embed_q8_0_variant(256), 86),
                    Catch::Contains("embed_q8_0_d256_t32") && Catch::Contains("forbidden"));
  CHECK(c.compiles() == 0);
  c.forbid_jit(false);
  c.get(embed_q8_0_variant(256), 86);
  CHECK(c.compiles() == 1);
}

TEST_CASE("NVRTC failures carry the program name and the compiler's log", "[cuda]") {
  const std::string bad = "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_thing; }\n";
  CHECK_THROWS_WITH(nvrtc_compile("broken.cu", bad, {}, {"--gpu-architecture=sm_80"}),
                    Catch::Contains("broken.cu") && Catch::Contains("undefined_thing"));
  // A template compiled without its parameters stops at its own checks.
  CHECK_THROWS_WITH(nvrtc_compile("t.cu", "#include \"qrig_common.cuh\"\n", {{"qrig_common.cuh", "#error no QRIG_SM\n"}},
                                  {"--gpu-architecture=sm_80"}),
                    Catch::Contains("no QRIG_SM"));
  const PtxasReport r = parse_ptxas_report(
      "ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
      "ptxas         .     8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 1 barriers\n");
  CHECK(r.registers == 40);
  CHECK(r.spill_store_bytes == 12);
  CHECK(r.spill_load_bytes == 16);
  CHECK(r.stack_frame_bytes == 8);
}
