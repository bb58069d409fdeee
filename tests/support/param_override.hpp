// Scoped overrides of library parameters for one test: set on construction, cleared (back to the
// environment or the default) on destruction.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/config.hpp"
#include "transport/admission.hpp"

namespace coccl::test {

class ParamOverride {
 public:
  ParamOverride(config::ParamBase& param, const char* text) : ParamOverride({{&param, text}}) {}
  ParamOverride(std::initializer_list<std::pair<config::ParamBase*, const char*>> settings) {
    for (const auto& [param, text] : settings) {
      param->set_override(std::string(text));
      params_.push_back(param);
    }
  }
  ~ParamOverride() {
    for (config::ParamBase* p : params_) p->set_override(std::nullopt);
  }
  ParamOverride(const ParamOverride&) = delete;
  ParamOverride& operator=(const ParamOverride&) = delete;

 private:
  std::vector<config::ParamBase*> params_;
};

/// A listener cap of `max` unauthenticated connections whose graces never end, however slow the
/// machine: for tests of the cap itself (transport/admission.hpp).
inline ParamOverride pending_cap_only(const char* max) {
  return ParamOverride{{&params::bootstrap_pending_max, max},
                       {&params::bootstrap_pending_grace, "3600"},
                       {&params::bootstrap_silent_grace, "3600"}};
}

}  // namespace coccl::test
