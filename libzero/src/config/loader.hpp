// ConfigLoader: one config tree read into a Config. config/load.cpp reads the keys of the table
// (config/keys.hpp) and judges DeepSpeed's (foreign_keys()); config/cross_checks.cpp applies the
// rules that need several keys. Problems are collected and thrown together by load().
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "config/keys.hpp"
#include "zero/config.hpp"
#include "zero/config_schema.hpp"
#include "zero/error.hpp"

namespace YAML {
class Node;
}

namespace zero {

class ConfigLoader {
 public:
  ConfigLoader(Config& cfg, const LoadOptions& opts, YAML::Node root, std::shared_ptr<const KeyLocations> locations,
               bool deepspeed_json);
  // Reads every key into the Config; throws one zero::Error listing every problem found.
  void load();

 private:
  // Runs f, recording its error (and `path` as failed) instead of stopping the load.
  template <class F>
  void attempt(std::string_view path, F&& f) {
    try {
      f();
    } catch (const Error& e) {
      errors_.emplace_back(e.what());
      failed_.emplace(path);
    }
  }

  // ---- reading keys (config/load.cpp)
  static bool owned(const std::string& path);
  bool under_failed_type(std::string_view path) const;
  StrictSection* section(const std::string& path);
  static std::string spelling(StrictSection& sec, const std::string& leaf,
                              const std::vector<std::string_view>& aliases);
  void read(const keys::Spec& s);
  void read_null(const keys::Spec& s, StrictSection& sec, const std::string& key);
  void resolve_auto(const keys::Spec& s, StrictSection& sec, const std::string& key);
  void read_value(const keys::Spec& s, StrictSection& sec, const std::string& key);
  void read_choice(const keys::Spec& s, StrictSection& sec, const std::string& key, keys::EnumRef ref);
  void ignore_foreign_top_level_keys(StrictSection& top);
  void judge(const keys::Foreign& f);

  // ---- rules that need several keys (config/cross_checks.cpp)
  void cross_checks();
  void optimizer_checks();
  void adam_mode_note();
  void scheduler_checks(StrictSection& top);

  Config& cfg_;
  const LoadOptions& opts_;
  std::shared_ptr<const KeyLocations> locations_;
  std::map<std::string, StrictSection> sections_;
  std::set<std::string> failed_;
  std::vector<std::string> errors_;
  const bool deepspeed_json_;
};

}  // namespace zero
