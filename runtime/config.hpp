// Typed COCCL_* parameters read from the environment, in one registry.
//
// Each parameter is declared once, beside the code that reads it (the header of its module; see
// runtime/params.hpp), with its name, default, documentation and an optional NCCL_* alias. Its
// value is read from the environment on first use and cached; tests may override it with
// set_override(). print_parameters() lists every parameter with its value and where it came from;
// the engine calls it once at COCCL_DEBUG=INFO.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace coccl::config {

/// Common, untyped part of a parameter: name, documentation and the raw text of its value.
class ParamBase {
 public:
  ParamBase(const char* name, const char* nccl_alias, std::string default_text, const char* doc);
  ParamBase(const ParamBase&) = delete;
  ParamBase& operator=(const ParamBase&) = delete;

  const char* name() const noexcept { return name_; }
  const char* doc() const noexcept { return doc_; }
  /// Raw text of the value in force and where it came from ("default", "env", "env NCCL_X",
  /// "override").
  std::pair<std::string, std::string> text() const;
  /// True when the environment (the name or its NCCL alias) or an override gives the value, false
  /// when it is the default: for settings whose default depends on more than the parameter.
  bool is_set() const;
  /// Forces a value for this process (tests, tools); an empty optional returns to the environment.
  void set_override(std::optional<std::string> text);

 protected:
  // The resolved text; resolved lazily because parameters are often read before main().
  const std::string& resolved() const;

 private:
  void resolve_locked() const;

  const char* name_;
  const char* alias_;
  std::string default_text_;
  const char* doc_;
  mutable std::mutex mutex_;
  mutable bool resolved_ = false;
  mutable std::string value_;
  mutable std::string source_;
  std::optional<std::string> override_;
};

/// A parameter of type T (bool, std::int64_t, double or std::string). A malformed value in the
/// environment falls back to the default and logs a warning naming the variable.
template <typename T>
class Param : public ParamBase {
 public:
  Param(const char* name, T def, const char* doc, const char* nccl_alias = nullptr);
  /// The value in force (environment, override or default).
  T get() const;

 private:
  T default_;
};

/// Every registered parameter: the library's (runtime/params.hpp, params::library()) and any a
/// program declares itself, in the order of their construction.
std::vector<ParamBase*> all_parameters();

/// Writes "NAME=value (source): doc" for every parameter through the logger at INFO.
void print_parameters();

}  // namespace coccl::config
