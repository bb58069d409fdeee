// coccl/version.hpp: library version.
#pragma once

namespace coccl {

/// Version of the library the program was compiled against.
inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;

/// Version of the library the program runs with, as major*10000 + minor*100 + patch.
int runtime_version() noexcept;

}  // namespace coccl
