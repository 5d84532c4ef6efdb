// Minimal command-line parsing for the qrig subcommands: positionals plus --flag value / --switch.
#pragma once

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace qrig::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Args {
 public:
  // `value_flags` take a value (--name V or --name=V, and short aliases like -o), `switches` take none. `aliases`
  // maps other spellings (llama.cpp's -c, --ctx-size...) to the flag they stand for.
  Args(int argc, char** argv, int first, const std::set<std::string>& value_flags, const std::set<std::string>& switches,
       const std::map<std::string, std::string>& aliases = {});
  const std::vector<std::string>& positional() const { return pos_; }
  bool has(const std::string& name) const { return vals_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& dflt = "") const;
  long long get_int(const std::string& name, long long dflt) const;
  double get_float(const std::string& name, double dflt) const;
  std::vector<long long> get_int_list(const std::string& name, std::vector<long long> dflt) const;

 private:
  std::vector<std::string> pos_;
  std::map<std::string, std::string> vals_;
};

}  // namespace qrig::cli
