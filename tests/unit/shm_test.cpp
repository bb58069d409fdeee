// shm segments reserve their memory when they are made: a filesystem too small for a segment
// fails its creation with a clear error, where a segment that was only sized would have faulted
// (SIGBUS) on first touch.
#include "transport/shm.hpp"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <system_error>

namespace coccl {
namespace {

constexpr int cannot_mount = 77;

// In a child process: a 64 KiB tmpfs of its own (a mount namespace; a user namespace too when
// not root) as COCCL_SHM_DIR, and a 1 MiB segment made and written there. Exits 0 if creation
// failed with the clear error, 1 if the segment was made and written, 2 on another error.
[[noreturn]] void make_segment_on_small_tmpfs(const char* dir) {
  const int flags = CLONE_NEWNS | (::geteuid() == 0 ? 0 : CLONE_NEWUSER);
  if (::unshare(flags) != 0) ::_exit(cannot_mount);
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(cannot_mount);
  if (::mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0) ::_exit(cannot_mount);
  params::shm_dir.set_override(dir);
  constexpr std::size_t bytes = 1 << 20;
  try {
    auto segment = transport::ShmSegment::create(bytes);
    std::memset(segment->data(), 1, bytes);
    ::_exit(1);
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    const bool clear = e.code() == std::errc::no_space_on_device &&
                       std::string(e.what()).find("cannot reserve") != std::string::npos;
    ::_exit(clear ? 0 : 2);
  }
}

TEST(ShmSegment, TooSmallFilesystemFailsCreationInsteadOfFaultingOnTouch) {
  char dir[] = "/tmp/coccl-shm-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) make_segment_on_small_tmpfs(dir);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::rmdir(dir);
  if (WIFEXITED(status) && WEXITSTATUS(status) == cannot_mount)
    GTEST_SKIP() << "no mount namespace for a small tmpfs here";
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace coccl
