// Fuzz target: the text of COCCL_* parameters (runtime/config) as each type parses it, and the
// timeouts made of COCCL_TIMEOUT and COCCL_BOOTSTRAP_AUTH_TIMEOUT. A value that does not parse
// falls back to the default; no text may make a parameter's consumer misbehave (a timeout is
// never negative, whatever the number).
#include <chrono>
#include <cmath>

#include "runtime/config.hpp"
#include "runtime/deadline.hpp"
#include "tests/fuzz/fuzz_input.hpp"
#include "transport/admission.hpp"

using namespace coccl;

namespace {

config::Param<bool> flag{"COCCL_FUZZ_BOOL", false, "fuzz target's boolean"};
config::Param<std::int64_t> number{"COCCL_FUZZ_INT", 7, "fuzz target's integer"};
config::Param<double> real{"COCCL_FUZZ_DOUBLE", 0.5, "fuzz target's real"};
config::Param<std::string> text{"COCCL_FUZZ_TEXT", "x", "fuzz target's text"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Malformed values are logged; the log goes nowhere here (read once, before the first write).
  static const bool quiet = ::setenv("COCCL_DEBUG_FILE", "/dev/null", 1) == 0;
  (void)quiet;
  fuzz::Input in(data, size);
  const std::string value = fuzz::text_of(in.rest());
  flag.set_override(value);
  number.set_override(value);
  real.set_override(value);
  text.set_override(value);
  flag.get();
  number.get();
  if (std::isnan(real.get())) fuzz::violated("a double parameter is NaN");
  if (text.get() != value) fuzz::violated("a text parameter changed");
  params::timeout_s.set_override(value);
  params::bootstrap_auth_timeout.set_override(value);
  if (runtime::default_timeout().count() < 0) fuzz::violated("negative COCCL_TIMEOUT");
  if (transport::auth_timeout().count() < 0) fuzz::violated("negative auth timeout");
  return 0;
}
