// Tests for runtime/config.hpp: typed COCCL_* parameters read from the environment.
//
// Every parameter is declared here at namespace scope (the registry keeps pointers to them for the
// life of the process) under a name no other test uses, so each test sees a fresh, unresolved
// parameter whatever order the tests run in.
#include "runtime/config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "runtime/deadline.hpp"
#include "runtime/params.hpp"

namespace coccl::config {
namespace {

Param<std::int64_t> int_default{"COCCL_TEST_INT_DEFAULT", 42, "test"};
Param<bool> bool_default{"COCCL_TEST_BOOL_DEFAULT", true, "test"};
Param<double> double_default{"COCCL_TEST_DOUBLE_DEFAULT", 1.5, "test"};
Param<std::string> string_default{"COCCL_TEST_STRING_DEFAULT", "abc", "test"};

Param<std::int64_t> int_env{"COCCL_TEST_INT_ENV", 1, "test"};
Param<bool> bool_env{"COCCL_TEST_BOOL_ENV", false, "test"};
Param<double> double_env{"COCCL_TEST_DOUBLE_ENV", 1.0, "test"};
Param<std::string> string_env{"COCCL_TEST_STRING_ENV", "", "test"};

Param<std::string> alias_only{"COCCL_TEST_ALIAS_ONLY", "def", "test", "NCCL_TEST_ALIAS_ONLY"};
Param<std::int64_t> alias_both{"COCCL_TEST_ALIAS_BOTH", 0, "test", "NCCL_TEST_ALIAS_BOTH"};

Param<std::int64_t> suffix_k{"COCCL_TEST_SUFFIX_K", 0, "test"};
Param<std::int64_t> suffix_m{"COCCL_TEST_SUFFIX_M", 0, "test"};
Param<std::int64_t> suffix_g{"COCCL_TEST_SUFFIX_G", 0, "test"};
Param<std::int64_t> suffix_lower{"COCCL_TEST_SUFFIX_LOWER", 0, "test"};
Param<std::int64_t> suffix_overflow{"COCCL_TEST_SUFFIX_OVERFLOW", 5, "test"};
Param<std::int64_t> hex_int{"COCCL_TEST_HEX_INT", 0, "test"};

Param<std::int64_t> bad_int{"COCCL_TEST_BAD_INT", 9, "test"};
Param<std::int64_t> bad_suffix{"COCCL_TEST_BAD_SUFFIX", 9, "test"};
Param<std::int64_t> empty_int{"COCCL_TEST_EMPTY_INT", 9, "test"};
Param<bool> bad_bool{"COCCL_TEST_BAD_BOOL", true, "test"};
Param<double> bad_double{"COCCL_TEST_BAD_DOUBLE", 2.5, "test"};

Param<std::int64_t> override_env{"COCCL_TEST_OVERRIDE_ENV", 1, "test"};
Param<std::int64_t> override_back{"COCCL_TEST_OVERRIDE_BACK", 1, "test"};
Param<std::string> override_text{"COCCL_TEST_OVERRIDE_TEXT", "d", "test"};
Param<std::int64_t> cached{"COCCL_TEST_CACHED", 1, "test"};

Param<std::int64_t> is_set_default{"COCCL_TEST_IS_SET_DEFAULT", 1, "test"};
Param<std::int64_t> is_set_env{"COCCL_TEST_IS_SET_ENV", 1, "test"};
Param<std::int64_t> is_set_alias{"COCCL_TEST_IS_SET_ALIAS", 1, "test", "NCCL_TEST_IS_SET_ALIAS"};
Param<std::int64_t> is_set_override{"COCCL_TEST_IS_SET_OVERRIDE", 1, "test"};

void set_env(const char* name, const char* value) { ASSERT_EQ(::setenv(name, value, 1), 0); }

TEST(Param, IsSetByTheEnvironmentItsAliasOrAnOverrideOnly) {
  EXPECT_FALSE(is_set_default.is_set());
  set_env("COCCL_TEST_IS_SET_ENV", "3");
  EXPECT_TRUE(is_set_env.is_set());
  set_env("NCCL_TEST_IS_SET_ALIAS", "4");
  EXPECT_TRUE(is_set_alias.is_set());
  is_set_override.set_override("5");
  EXPECT_TRUE(is_set_override.is_set());
  is_set_override.set_override(std::nullopt);
  EXPECT_FALSE(is_set_override.is_set());
}

TEST(Param, ReadsItsDefaultWhenTheEnvironmentIsUnset) {
  EXPECT_EQ(int_default.get(), 42);
  EXPECT_EQ(bool_default.get(), true);
  EXPECT_EQ(double_default.get(), 1.5);
  EXPECT_EQ(string_default.get(), "abc");
  EXPECT_EQ(int_default.text().second, "default");
}

TEST(Param, ReadsTheEnvironmentOnFirstGet) {
  set_env("COCCL_TEST_INT_ENV", "-17");
  set_env("COCCL_TEST_BOOL_ENV", "yes");
  set_env("COCCL_TEST_DOUBLE_ENV", "0.25");
  set_env("COCCL_TEST_STRING_ENV", "^lo,eth");
  EXPECT_EQ(int_env.get(), -17);
  EXPECT_EQ(bool_env.get(), true);
  EXPECT_EQ(double_env.get(), 0.25);
  EXPECT_EQ(string_env.get(), "^lo,eth");
  EXPECT_EQ(int_env.text(), std::make_pair(std::string("-17"), std::string("env")));
}

TEST(Param, ReadsItsNcclAliasWhenOnlyTheAliasIsSet) {
  set_env("NCCL_TEST_ALIAS_ONLY", "from-nccl");
  EXPECT_EQ(alias_only.get(), "from-nccl");
  EXPECT_EQ(alias_only.text().second, "env NCCL_TEST_ALIAS_ONLY");
}

TEST(Param, PrefersTheCocclNameOverItsAlias) {
  set_env("NCCL_TEST_ALIAS_BOTH", "1");
  set_env("COCCL_TEST_ALIAS_BOTH", "2");
  EXPECT_EQ(alias_both.get(), 2);
  EXPECT_EQ(alias_both.text().second, "env");
}

TEST(Param, ScalesIntegersByKMGSuffix) {
  set_env("COCCL_TEST_SUFFIX_K", "4K");
  set_env("COCCL_TEST_SUFFIX_M", "3M");
  set_env("COCCL_TEST_SUFFIX_G", "2G");
  set_env("COCCL_TEST_SUFFIX_LOWER", "5k");
  EXPECT_EQ(suffix_k.get(), 4096);
  EXPECT_EQ(suffix_m.get(), 3 * (std::int64_t{1} << 20));
  EXPECT_EQ(suffix_g.get(), 2 * (std::int64_t{1} << 30));
  EXPECT_EQ(suffix_lower.get(), 5 * 1024);
}

TEST(Param, AcceptsHexIntegers) {
  set_env("COCCL_TEST_HEX_INT", "0x40");
  EXPECT_EQ(hex_int.get(), 64);
}

// 2^34 G is 2^64: the product does not fit an int64, so the value is malformed.
TEST(Param, FallsBackToDefaultWhenASuffixOverflows) {
  set_env("COCCL_TEST_SUFFIX_OVERFLOW", "17179869184G");
  EXPECT_EQ(suffix_overflow.get(), 5);
}

TEST(Param, FallsBackToDefaultOnMalformedValues) {
  set_env("COCCL_TEST_BAD_INT", "12abc");
  set_env("COCCL_TEST_BAD_SUFFIX", "4KB");
  set_env("COCCL_TEST_EMPTY_INT", "");
  set_env("COCCL_TEST_BAD_BOOL", "maybe");
  set_env("COCCL_TEST_BAD_DOUBLE", "1.5x");
  EXPECT_EQ(bad_int.get(), 9);
  EXPECT_EQ(bad_suffix.get(), 9);
  EXPECT_EQ(empty_int.get(), 9);
  EXPECT_EQ(bad_bool.get(), true);
  EXPECT_EQ(bad_double.get(), 2.5);
}

TEST(Param, OverrideWinsOverTheEnvironment) {
  set_env("COCCL_TEST_OVERRIDE_ENV", "7");
  EXPECT_EQ(override_env.get(), 7);
  override_env.set_override("8");
  EXPECT_EQ(override_env.get(), 8);
  EXPECT_EQ(override_env.text().second, "override");
  override_env.set_override(std::nullopt);
}

TEST(Param, ClearingTheOverrideReturnsToTheEnvironment) {
  set_env("COCCL_TEST_OVERRIDE_BACK", "7");
  override_back.set_override("8");
  EXPECT_EQ(override_back.get(), 8);
  override_back.set_override(std::nullopt);
  EXPECT_EQ(override_back.get(), 7);
  EXPECT_EQ(override_back.text().second, "env");
}

TEST(Param, OverrideWinsOverTheDefault) {
  override_text.set_override("forced");
  EXPECT_EQ(override_text.get(), "forced");
  override_text.set_override(std::nullopt);
  EXPECT_EQ(override_text.get(), "d");
}

TEST(Param, CachesTheEnvironmentAfterFirstGet) {
  set_env("COCCL_TEST_CACHED", "3");
  EXPECT_EQ(cached.get(), 3);
  set_env("COCCL_TEST_CACHED", "4");
  EXPECT_EQ(cached.get(), 3);
}

std::vector<std::string> registered_names() {
  std::vector<std::string> names;
  for (ParamBase* p : all_parameters()) names.emplace_back(p->name());
  return names;
}

TEST(AllParameters, ListsTheLibraryParameters) {
  auto names = registered_names();
  for (const char* want :
       {"COCCL_TIMEOUT", "COCCL_SOCKET_IFNAME", "COCCL_ALGO", "COCCL_TRANSPORT",
        "COCCL_SHM_DISABLE", "COCCL_PROXY_THREADS", "COCCL_SPIN_US", "COCCL_SLOT_BYTES",
        "COCCL_SLOTS", "COCCL_ALLREDUCE_ONESHOT_MAX", "COCCL_COMM_ID", "COCCL_SECRET",
        "COCCL_COLLTRACE_SIZE", "COCCL_TCP_ENGINE", "COCCL_TCP_SOCKETS", "COCCL_TCP_ZC_MIN"})
    EXPECT_EQ(std::count(names.begin(), names.end(), want), 1) << want;
}

// No parameter that nothing reads: COCCL_PROTO chose a device protocol that coccl never had.
TEST(AllParameters, OmitsTheDeadProtocolParameter) {
  auto names = registered_names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "COCCL_PROTO"), 0);
}

TEST(AllParameters, ListsParametersDeclaredOutsideTheLibrary) {
  auto names = registered_names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "COCCL_TEST_INT_DEFAULT"), 1);
  EXPECT_EQ(std::count(names.begin(), names.end(), "COCCL_TEST_CACHED"), 1);
}

// The index (params::library()) and the registry agree: every indexed parameter is registered
// once, and every registered parameter but this test's own is in the index.
TEST(AllParameters, IndexAndRegistryHoldTheSameLibraryParameters) {
  auto names = registered_names();
  std::vector<std::string> indexed;
  for (const ParamBase* p : params::library()) {
    indexed.emplace_back(p->name());
    EXPECT_EQ(std::count(names.begin(), names.end(), p->name()), 1) << p->name();
  }
  for (const std::string& name : names) {
    if (name.rfind("COCCL_TEST_", 0) == 0) continue;
    EXPECT_EQ(std::count(indexed.begin(), indexed.end(), name), 1) << name;
  }
}

TEST(AllParameters, DocumentsEveryParameter) {
  for (ParamBase* p : all_parameters()) {
    ASSERT_NE(p->doc(), nullptr) << p->name();
    EXPECT_NE(std::string(p->doc()), "") << p->name();
  }
}

TEST(LibraryParameters, TimeoutDefaultsTo300Seconds) {
  if (std::getenv("COCCL_TIMEOUT")) GTEST_SKIP() << "COCCL_TIMEOUT is set";
  EXPECT_EQ(params::timeout_s.get(), 300.0);
}

// COCCL_TIMEOUT with the value `text` for one call of default_timeout().
std::chrono::steady_clock::duration timeout_for(const std::string& text) {
  params::timeout_s.set_override(text);
  auto t = runtime::default_timeout();
  params::timeout_s.set_override(std::nullopt);
  return t;
}

TEST(LibraryParameters, HugeTimeoutsSaturateInsteadOfOverflowing) {
  // 1e300 seconds does not fit a nanosecond count: converting it was undefined (and in practice
  // a negative duration, which made every wait time out at once).
  EXPECT_EQ(timeout_for("1e300"), std::chrono::seconds(1000000000));
  EXPECT_EQ(timeout_for("inf"), std::chrono::seconds(1000000000));
  EXPECT_EQ(timeout_for("2.5"), std::chrono::milliseconds(2500));
}

TEST(LibraryParameters, NegativeTimeoutIsZero) {
  EXPECT_EQ(timeout_for("-1e300"), std::chrono::steady_clock::duration::zero());
}

TEST(Param, RejectsNotANumberAsADouble) {
  bad_double.set_override("nan");
  EXPECT_EQ(bad_double.get(), 2.5);
  bad_double.set_override(std::nullopt);
}

}  // namespace
}  // namespace coccl::config
