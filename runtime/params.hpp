// The parameter registry's index.
//
// Each parameter is declared beside the code that reads it (the header of its module) and defined
// at the top of the source that reads it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "runtime/config.hpp"

namespace coccl::params {

/// Every parameter of the library in this build (those of device collectives with CUDA only, those
/// of the ib transport with the verbs headers only). A static library keeps only the objects that
/// a program refers to; config::all_parameters() refers to this list, so that a program listing
/// the registry sees every parameter, also of modules it never calls.
std::span<const config::ParamBase* const> library();

}  // namespace coccl::params
