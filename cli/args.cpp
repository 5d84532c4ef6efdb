// Argument parsing for qrig subcommands.
#include "cli/args.h"

#include <cctype>
#include <cstdlib>

namespace qrig::cli {

Args::Args(int argc, char** argv, int first, const std::set<std::string>& value_flags,
           const std::set<std::string>& switches, const std::map<std::string, std::string>& aliases) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.size() > 1 && a[0] == '-' && !(a.size() > 1 && (std::isdigit((unsigned char)a[1]) || a[1] == '.'))) {
      std::string name = a, value;
      bool inline_value = false;
      if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        inline_value = true;
      }
      if (auto al = aliases.find(name); al != aliases.end()) name = al->second;
      if (value_flags.count(name)) {
        if (!inline_value) {
          if (i + 1 >= argc) throw UsageError(name + " needs a value");
          value = argv[++i];
        }
        vals_[name] = value;
      } else if (switches.count(name)) {
        if (inline_value) throw UsageError(name + " takes no value");
        vals_[name] = "1";
      } else {
        throw UsageError("unknown option " + name);
      }
    } else {
      pos_.push_back(a);
    }
  }
}

std::string Args::get(const std::string& name, const std::string& dflt) const {
  auto it = vals_.find(name);
  return it == vals_.end() ? dflt : it->second;
}

long long Args::get_int(const std::string& name, long long dflt) const {
  auto it = vals_.find(name);
  if (it == vals_.end()) return dflt;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end) throw UsageError(name + " wants an integer, got '" + it->second + "'");
  return v;
}

double Args::get_float(const std::string& name, double dflt) const {
  auto it = vals_.find(name);
  if (it == vals_.end()) return dflt;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end) throw UsageError(name + " wants a number, got '" + it->second + "'");
  return v;
}

std::vector<long long> Args::get_int_list(const std::string& name, std::vector<long long> dflt) const {
  auto it = vals_.find(name);
  if (it == vals_.end()) return dflt;
  std::vector<long long> out;
  size_t start = 0;
  const std::string& s = it->second;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end) throw UsageError(name + " wants comma-separated integers, got '" + s + "'");
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace qrig::cli
