// The one place that knows which transports this build has.
#include "transport/link_setup.hpp"

#include <coccl/error.hpp>

#if COCCL_HAVE_IB
#include "transport/ib_link.hpp"
#include "transport/ib_verbs.hpp"
#endif

namespace coccl::transport {

std::unique_ptr<LinkSetup> make_link_setup(LinkKind kind, const LinkEnv& env, int peer,
                                           std::size_t slots) {
  switch (kind) {
    case LinkKind::tcp:
      return make_tcp_setup(env, peer, slots);
    case LinkKind::shm:
      return make_shm_setup(env, slots);
    case LinkKind::ib:
#if COCCL_HAVE_IB
      if (env.ib_device) return make_ib_setup(env, slots);
      throw std::system_error(make_error_code(errc::unsupported),
                              "an ib link, but this rank has no usable ib device");
#else
      throw std::system_error(make_error_code(errc::unsupported),
                              "an ib link, but coccl was built without ibverbs headers");
#endif
  }
  throw std::system_error(make_error_code(errc::bad_message), "unknown link kind");
}

std::shared_ptr<ib::Device> ib_device_for(const std::string& transport) {
#if COCCL_HAVE_IB
  // auto takes ib across hosts where both ends have a usable device (tcp otherwise).
  if (transport == "auto") return ib::Device::get();
  if (transport == "ib") {
    std::string why;
    auto device = ib::Device::get(&why);
    if (!device)
      throw std::system_error(make_error_code(errc::unsupported),
                              "COCCL_TRANSPORT=ib, but the ib transport is not available: " + why);
    return device;
  }
#else
  if (transport == "ib")
    throw std::system_error(make_error_code(errc::unsupported),
                            "COCCL_TRANSPORT=ib, but coccl was built without ibverbs headers");
#endif
  return nullptr;
}

std::shared_ptr<UserBuffers> make_user_buffers(const std::shared_ptr<ib::Device>& device) {
#if COCCL_HAVE_IB
  if (device) return std::make_shared<UserBuffers>(&ib::registrations(device));
#endif
  (void)device;
  return std::make_shared<UserBuffers>(nullptr);
}

}  // namespace coccl::transport
