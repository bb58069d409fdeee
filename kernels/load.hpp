// kernels/load.hpp: per-source loaders behind kernels::load_kernels() (launch.hpp). Each loads
// every kernel of its translation unit (one CUDA module) onto the current device.
#pragma once

namespace coccl::kernels::detail {

int load_elementwise();
int load_all_reduce();
int load_collectives();
int load_rooted();
int load_p2p();
int load_net();

}  // namespace coccl::kernels::detail
