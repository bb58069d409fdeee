// Tests for runtime/log.hpp: level, subsystem filter, and the host:pid:rank prefixed log file.
//
// Each test sets the environment, calls log::reload(), and restores the default configuration
// (warnings to stderr) when it ends.
#include "runtime/log.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace coccl::log {
namespace {

std::string host_name() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class LogTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* v : {"COCCL_DEBUG", "COCCL_DEBUG_SUBSYS", "COCCL_DEBUG_FILE", "NCCL_DEBUG",
                          "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"})
      ::unsetenv(v);
    reload();
    for (const auto& p : files_) std::remove(p.c_str());
  }

  // Sends the log to a fresh file named after the test; returns the expanded path.
  std::string log_to_file() {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::string pattern = "/tmp/coccl_log_test." + name + ".%h.%p";
    std::string path =
        "/tmp/coccl_log_test." + name + "." + host_name() + "." + std::to_string(::getpid());
    std::remove(path.c_str());
    files_.push_back(path);
    ::setenv("COCCL_DEBUG_FILE", pattern.c_str(), 1);
    return path;
  }

  std::vector<std::string> files_;
};

TEST_F(LogTest, InfoLinesGoToTheExpandedFileWithHostPidRankPrefix) {
  ::setenv("COCCL_DEBUG", "INFO", 1);
  std::string path = log_to_file();
  reload();
  COCCL_INFO(init, 3, "hello %d", 5);
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], host_name() + ":" + std::to_string(::getpid()) + ":3 [coccl] INFO hello 5");
}

TEST_F(LogTest, LinesWithoutARankHaveHostPidPrefix) {
  ::setenv("COCCL_DEBUG", "INFO", 1);
  std::string path = log_to_file();
  reload();
  COCCL_WARN(net, -1, "no rank");
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], host_name() + ":" + std::to_string(::getpid()) + " [coccl] WARN no rank");
}

TEST_F(LogTest, NcclAliasesConfigureTheLog) {
  ::setenv("NCCL_DEBUG", "INFO", 1);
  ::setenv("NCCL_DEBUG_SUBSYS", "COLL", 1);
  reload();
  EXPECT_TRUE(enabled(Level::info, Subsys::coll));
  EXPECT_FALSE(enabled(Level::info, Subsys::init));
}

TEST_F(LogTest, SubsysListEnablesOnlyTheNamedSubsystems) {
  ::setenv("COCCL_DEBUG", "INFO", 1);
  ::setenv("COCCL_DEBUG_SUBSYS", "NET", 1);
  reload();
  EXPECT_TRUE(enabled(Level::info, Subsys::net));
  EXPECT_FALSE(enabled(Level::info, Subsys::init));
  EXPECT_FALSE(enabled(Level::warn, Subsys::init));
}

TEST_F(LogTest, CaretSubsysListEnablesAllButTheNamedSubsystems) {
  ::setenv("COCCL_DEBUG", "INFO", 1);
  ::setenv("COCCL_DEBUG_SUBSYS", "^NET", 1);
  reload();
  EXPECT_FALSE(enabled(Level::info, Subsys::net));
  EXPECT_TRUE(enabled(Level::info, Subsys::init));
  EXPECT_TRUE(enabled(Level::info, Subsys::coll));
}

TEST_F(LogTest, SubsysListAcceptsSeveralNamesInAnyCase) {
  ::setenv("COCCL_DEBUG", "INFO", 1);
  ::setenv("COCCL_DEBUG_SUBSYS", "init,Shm", 1);
  reload();
  EXPECT_TRUE(enabled(Level::info, Subsys::init));
  EXPECT_TRUE(enabled(Level::info, Subsys::shm));
  EXPECT_FALSE(enabled(Level::info, Subsys::net));
}

TEST_F(LogTest, FilteredSubsystemWritesNothing) {
  ::setenv("COCCL_DEBUG", "INFO", 1);
  ::setenv("COCCL_DEBUG_SUBSYS", "NET", 1);
  std::string path = log_to_file();
  reload();
  COCCL_INFO(init, 0, "filtered");
  COCCL_INFO(net, 0, "kept");
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], host_name() + ":" + std::to_string(::getpid()) + ":0 [coccl] INFO kept");
}

TEST_F(LogTest, WarnLevelHidesInfo) {
  ::setenv("COCCL_DEBUG", "WARN", 1);
  std::string path = log_to_file();
  reload();
  EXPECT_TRUE(enabled(Level::warn, Subsys::init));
  EXPECT_FALSE(enabled(Level::info, Subsys::init));
  COCCL_INFO(init, 1, "hidden");
  COCCL_WARN(init, 1, "shown");
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], host_name() + ":" + std::to_string(::getpid()) + ":1 [coccl] WARN shown");
}

TEST_F(LogTest, DefaultLevelIsWarn) {
  reload();
  EXPECT_TRUE(enabled(Level::warn, Subsys::init));
  EXPECT_FALSE(enabled(Level::info, Subsys::init));
}

TEST_F(LogTest, InfoLevelHidesTrace) {
  ::setenv("COCCL_DEBUG", "INFO", 1);
  reload();
  EXPECT_TRUE(enabled(Level::info, Subsys::proxy));
  EXPECT_FALSE(enabled(Level::trace, Subsys::proxy));
}

TEST_F(LogTest, NoneHidesWarnings) {
  ::setenv("COCCL_DEBUG", "NONE", 1);
  reload();
  EXPECT_FALSE(enabled(Level::warn, Subsys::init));
}

TEST_F(LogTest, ReloadWithoutAFileReturnsToStderrAndClosesTheFile) {
  ::setenv("COCCL_DEBUG", "INFO", 1);
  std::string path = log_to_file();
  reload();
  COCCL_INFO(init, 0, "first");
  ::unsetenv("COCCL_DEBUG_FILE");
  reload();
  testing::internal::CaptureStderr();
  COCCL_INFO(init, 0, "second");
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, host_name() + ":" + std::to_string(::getpid()) + ":0 [coccl] INFO second\n");
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], host_name() + ":" + std::to_string(::getpid()) + ":0 [coccl] INFO first");
}

}  // namespace
}  // namespace coccl::log
