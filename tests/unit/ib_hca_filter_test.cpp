// COCCL_IB_HCA parsing and matching (NCCL_IB_HCA syntax): prefixes, ports, ^ and =.
#include <gtest/gtest.h>

#include <coccl/error.hpp>

#include "transport/ib_verbs.hpp"

namespace coccl::transport::ib {
namespace {

TEST(HcaFilter, EmptyAllowsEveryDeviceAndPort) {
  HcaFilter f("");
  EXPECT_TRUE(f.allows("mlx5_0", 1));
  EXPECT_TRUE(f.allows("rxe0", 2));
}

TEST(HcaFilter, NamesArePrefixes) {
  HcaFilter f("mlx5");
  EXPECT_TRUE(f.allows("mlx5_0", 1));
  EXPECT_TRUE(f.allows("mlx5_11", 1));
  EXPECT_FALSE(f.allows("rxe0", 1));
}

TEST(HcaFilter, PortRestrictsOnlyItsEntry) {
  HcaFilter f("mlx5_0:1,mlx5_1");
  EXPECT_TRUE(f.allows("mlx5_0", 1));
  EXPECT_FALSE(f.allows("mlx5_0", 2));
  EXPECT_TRUE(f.allows("mlx5_1", 2));
  EXPECT_FALSE(f.allows("rxe0", 1));
}

TEST(HcaFilter, EqualsMatchesWholeNamesOnly) {
  HcaFilter f("=mlx5_1");
  EXPECT_TRUE(f.allows("mlx5_1", 1));
  EXPECT_FALSE(f.allows("mlx5_10", 1));
}

TEST(HcaFilter, CaretExcludesTheListed) {
  HcaFilter f("^mlx5_0:1");
  EXPECT_FALSE(f.allows("mlx5_0", 1));
  EXPECT_TRUE(f.allows("mlx5_0", 2));
  EXPECT_TRUE(f.allows("rxe0", 1));
}

TEST(HcaFilter, CaretAndEqualsCombine) {
  HcaFilter f("^=rxe0");
  EXPECT_FALSE(f.allows("rxe0", 1));
  EXPECT_TRUE(f.allows("rxe01", 1));
}

TEST(HcaFilter, MalformedEntriesAreInvalidArguments) {
  for (const char* bad :
       {"mlx5_0:", "mlx5_0:x", ":1", "a,,b", "a,", "^", "=", "mlx5_0:0", "mlx5_0:256"}) {
    SCOPED_TRACE(bad);
    try {
      HcaFilter f(bad);
      ADD_FAILURE() << "accepted";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument));
      EXPECT_NE(std::string(e.what()).find("COCCL_IB_HCA"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace coccl::transport::ib
