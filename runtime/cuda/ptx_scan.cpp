// PTX scans (see ptx_scan.h): a small statement splitter over PTX text, then rules on each opcode.
#include "runtime/cuda/ptx_scan.h"

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace qrig::cuda {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace((unsigned char)s.front())) s.remove_prefix(1);
  while (!s.empty() && std::isspace((unsigned char)s.back())) s.remove_suffix(1);
  return s;
}

// The text without comments, line structure kept (so line numbers still hold).
std::string strip_comments(std::string_view ptx) {
  std::string out;
  out.reserve(ptx.size());
  for (size_t i = 0; i < ptx.size();) {
    if (ptx.compare(i, 2, "//") == 0) {
      while (i < ptx.size() && ptx[i] != '\n') ++i;
    } else if (ptx.compare(i, 2, "/*") == 0) {
      i += 2;
      while (i < ptx.size() && ptx.compare(i, 2, "*/") != 0) {
        if (ptx[i] == '\n') out += '\n';
        ++i;
      }
      i = i < ptx.size() ? i + 2 : i;
    } else {
      out += ptx[i++];
    }
  }
  return out;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t b = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) {
      parts.push_back(s.substr(b, i - b));
      b = i + 1;
    }
  return parts;
}

// Why an opcode is newer than sm_70, or empty when it is not.
std::string newer_than_sm70(std::string_view opcode) {
  const std::vector<std::string_view> c = split(opcode, '.');
  const std::string_view root = c.front();
  auto has = [&](std::string_view part) {
    for (size_t i = 1; i < c.size(); ++i)
      if (c[i] == part) return true;
    return false;
  };
  if (root == "mma" || root == "wmma" || root == "wgmma" || root == "tcgen05")
    return "tensor-core matrix multiply (mma/wmma/wgmma)";
  if (root == "ldmatrix" || root == "stmatrix" || root == "movmatrix") return "warp matrix load/store (sm_75+/sm_90)";
  if (root == "cp" && has("async")) return "cp.async (sm_80+)";
  if (root == "redux") return "redux.sync (sm_80+)";
  if (root == "mbarrier" || root == "tensormap") return "mbarrier/TMA (sm_80+/sm_90)";
  if (root == "griddepcontrol") return "programmatic dependent launch (sm_90)";
  if (root == "elect" || root == "setmaxnreg" || root == "multimem") return "sm_90 warp/cluster instruction";
  if ((root == "barrier" || root == "fence") && (has("cluster") || has("proxy"))) return "cluster/proxy fence (sm_90)";
  if (has("bf16") || has("bf16x2")) return "bf16 arithmetic or conversion (sm_80+)";
  if (has("e4m3") || has("e5m2") || has("e4m3x2") || has("e5m2x2") || has("e2m1x2")) return "fp8/fp4 (sm_89+)";
  return {};
}

// "name:" where name is a PTX identifier (letters, digits, _ and $; no dots, so "shared::cluster" in an
// opcode is not a label).
bool is_label(std::string_view st) {
  if (st.size() < 2 || st.back() != ':') return false;
  for (char ch : st.substr(0, st.size() - 1))
    if (!(std::isalnum((unsigned char)ch) || ch == '_' || ch == '$')) return false;
  return true;
}

}  // namespace

std::vector<PtxFinding> scan_ptx_newer_than_sm70(std::string_view ptx) {
  std::vector<PtxFinding> found;
  const std::string text = strip_comments(ptx);
  const std::vector<std::string_view> lines = split(text, '\n');
  for (size_t ln = 0; ln < lines.size(); ++ln) {
    std::string line(lines[ln]);
    for (char& ch : line)
      if (ch == '{' || ch == '}') ch = ';';  // inline asm blocks: { .reg ...; op ...; }
    for (std::string_view st : split(line, ';')) {
      st = trim(st);
      // Leading labels ("$L__BB0_3: ld.global...") and predicates ("@%p1", "@!%p2").
      for (;;) {
        const size_t colon = st.find(':');
        const size_t space = st.find_first_of(" \t");
        if (colon != std::string_view::npos && (space == std::string_view::npos || colon < space) &&
            (colon + 1 == st.size() || st[colon + 1] != ':') && is_label(st.substr(0, colon + 1))) {
          st = trim(st.substr(colon + 1));
          continue;
        }
        if (!st.empty() && st.front() == '@') {
          st = space == std::string_view::npos ? std::string_view{} : trim(st.substr(space));
          continue;
        }
        break;
      }
      if (st.empty() || st.front() == '.' || st.front() == ')' || st.front() == '(') continue;  // directives
      const size_t end = st.find_first_of(" \t,(");
      const std::string_view opcode = st.substr(0, end);
      if (opcode.empty() || !std::isalpha((unsigned char)opcode.front())) continue;
      std::string why = newer_than_sm70(opcode);
      if (!why.empty()) found.push_back({(int)ln + 1, std::string(opcode), std::move(why)});
    }
  }
  return found;
}

std::vector<PtxEntry> ptx_entries(std::string_view ptx) {
  std::vector<PtxEntry> entries;
  const std::string text = strip_comments(ptx);
  bool in_header = false;  // between ".entry name(" and the body's "{"
  for (std::string_view line : split(text, '\n')) {
    line = trim(line);
    const size_t e = line.find(".entry ");
    if (e != std::string_view::npos && (e == 0 || line[e - 1] == ' ')) {
      std::string_view rest = trim(line.substr(e + 7));
      entries.push_back({std::string(rest.substr(0, rest.find_first_of("( \t"))), 0});
      in_header = true;
      continue;
    }
    if (!in_header) continue;
    if (line.rfind(".maxntid", 0) == 0) entries.back().maxntid = std::atoi(std::string(line.substr(8)).c_str());
    if (!line.empty() && line.front() == '{') in_header = false;
  }
  return entries;
}

bool waits_for_previous_grid(std::string_view ptx) {
  const std::string text = strip_comments(ptx);
  int entries = 0, waiting = 0;
  bool waits = false;
  for (std::string_view line : split(text, '\n')) {
    line = trim(line);
    const size_t e = line.find(".entry ");
    if (e != std::string_view::npos && (e == 0 || line[e - 1] == ' ')) {
      waiting += waits;
      ++entries;
      waits = false;
      continue;
    }
    if (entries > 0 && line.rfind("griddepcontrol.wait", 0) == 0) waits = true;
  }
  waiting += waits;
  return entries > 0 && waiting == entries;
}

std::string ptx_target(std::string_view ptx) {
  size_t at = 0;
  while ((at = ptx.find(".target", at)) != std::string_view::npos) {
    const bool line_start = at == 0 || ptx[at - 1] == '\n';
    at += 7;
    if (!line_start || at >= ptx.size() || (ptx[at] != ' ' && ptx[at] != '\t')) continue;
    while (at < ptx.size() && (ptx[at] == ' ' || ptx[at] == '\t')) ++at;
    size_t end = at;
    while (end < ptx.size() && (std::isalnum((unsigned char)ptx[end]) || ptx[end] == '_')) ++end;
    return std::string(ptx.substr(at, end - at));
  }
  return {};
}

int cubin_sm(const std::vector<char>& cubin) {
  if (cubin.size() < 64 || std::memcmp(cubin.data(), "\x7f" "ELF", 4) != 0 || cubin[4] != 2 /* 64-bit */) return -1;
  auto u8 = [&](size_t i) { return (unsigned)(unsigned char)cubin[i]; };
  const unsigned machine = u8(18) | u8(19) << 8;
  if (machine != 190) return -1;  // EM_CUDA
  const uint32_t flags = u8(48) | u8(49) << 8 | u8(50) << 16 | (uint32_t)u8(51) << 24;
  const unsigned abi_version = u8(8);
  if (abi_version <= 7) return (int)(flags & 0xff);
  return (int)((flags >> 8) & 0xff);
}

}  // namespace qrig::cuda
