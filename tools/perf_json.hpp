// A reader for the JSON that coccl-perf --json writes, so that --plot-from can draw a run made
// on another machine (a GPU host without gnuplot, say). It reads any JSON document, without
// extensions; what coccl-perf needs of it is checked by the caller.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace perf::json {

struct Value;
using Array = std::vector<Value>;
using Object = std::map<std::string, Value>;

/// One JSON value: null, a boolean, a number, a string, an array or an object.
struct Value {
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<Array>,
               std::shared_ptr<Object>>
      v;
  const double* number() const { return std::get_if<double>(&v); }
  const std::string* string() const { return std::get_if<std::string>(&v); }
  const Array* array() const;
  const Object* object() const;
};

/// Parses one JSON document (RFC 8259; \u escapes beyond ASCII are kept as '?'). Throws
/// std::runtime_error naming the byte offset of the first error.
Value parse(const std::string& text);

}  // namespace perf::json
