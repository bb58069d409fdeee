#include "runtime/config.hpp"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "runtime/log.hpp"
#include "runtime/params.hpp"

namespace coccl::config {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<ParamBase*>& registry() {
  static std::vector<ParamBase*> r;
  return r;
}

std::string to_text(bool v) { return v ? "1" : "0"; }
std::string to_text(std::int64_t v) { return std::to_string(v); }
std::string to_text(double v) { return std::to_string(v); }
std::string to_text(const std::string& v) { return v; }

std::optional<bool> parse(std::string_view s, bool*) {
  if (s == "1" || s == "true" || s == "yes" || s == "on" || s == "TRUE" || s == "ON") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off" || s == "FALSE" || s == "OFF")
    return false;
  return std::nullopt;
}

std::optional<std::int64_t> parse(std::string_view s, std::int64_t*) {
  std::string str(s);
  if (str.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(str.c_str(), &end, 0);
  if (errno != 0) return std::nullopt;
  // Byte sizes are commonly written with a K/M/G suffix, as in nccl-tests.
  std::string_view rest(end);
  long long mul = 1;
  if (rest == "K" || rest == "k")
    mul = 1LL << 10;
  else if (rest == "M" || rest == "m")
    mul = 1LL << 20;
  else if (rest == "G" || rest == "g")
    mul = 1LL << 30;
  else if (!rest.empty())
    return std::nullopt;
  long long out = 0;
  if (__builtin_mul_overflow(v, mul, &out)) return std::nullopt;
  return out;
}

std::optional<double> parse(std::string_view s, double*) {
  std::string str(s);
  if (str.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(str.c_str(), &end);
  // NaN compares false with every bound a consumer would check it against.
  if (errno != 0 || *end != '\0' || v != v) return std::nullopt;
  return v;
}

std::optional<std::string> parse(std::string_view s, std::string*) { return std::string(s); }

}  // namespace

ParamBase::ParamBase(const char* name, const char* nccl_alias, std::string default_text,
                     const char* doc)
    : name_(name), alias_(nccl_alias), default_text_(std::move(default_text)), doc_(doc) {
  std::lock_guard lock(registry_mutex());
  registry().push_back(this);
}

void ParamBase::resolve_locked() const {
  if (resolved_) return;
  if (override_) {
    value_ = *override_;
    source_ = "override";
  } else if (const char* v = std::getenv(name_)) {
    value_ = v;
    source_ = "env";
  } else if (const char* a = alias_ ? std::getenv(alias_) : nullptr) {
    value_ = a;
    source_ = std::string("env ") + alias_;
  } else {
    value_ = default_text_;
    source_ = "default";
  }
  resolved_ = true;
}

const std::string& ParamBase::resolved() const {
  std::lock_guard lock(mutex_);
  resolve_locked();
  return value_;
}

std::pair<std::string, std::string> ParamBase::text() const {
  std::lock_guard lock(mutex_);
  resolve_locked();
  return {value_, source_};
}

bool ParamBase::is_set() const {
  std::lock_guard lock(mutex_);
  resolve_locked();
  return source_ != "default";
}

void ParamBase::set_override(std::optional<std::string> text) {
  std::lock_guard lock(mutex_);
  override_ = std::move(text);
  resolved_ = false;
}

template <typename T>
Param<T>::Param(const char* name, T def, const char* doc, const char* nccl_alias)
    : ParamBase(name, nccl_alias, to_text(def), doc), default_(std::move(def)) {}

template <typename T>
T Param<T>::get() const {
  const std::string& text = resolved();
  if (auto v = parse(text, static_cast<T*>(nullptr))) return *v;
  log::write(log::Level::warn, log::Subsys::init, -1, "%s=\"%s\" is not a valid value; using %s",
             name(), text.c_str(), to_text(default_).c_str());
  return default_;
}

template class Param<bool>;
template class Param<std::int64_t>;
template class Param<double>;
template class Param<std::string>;

std::vector<ParamBase*> all_parameters() {
  // Refers to the index so that a program listing the registry links every library parameter.
  static_cast<void>(params::library());
  std::lock_guard lock(registry_mutex());
  return registry();
}

void print_parameters() {
  for (ParamBase* p : all_parameters()) {
    auto [value, source] = p->text();
    log::write(log::Level::info, log::Subsys::init, -1, "%s=%s (%s): %s", p->name(), value.c_str(),
               source.c_str(), p->doc());
  }
}

}  // namespace coccl::config
