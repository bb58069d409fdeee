#include "transport/stream.hpp"

namespace coccl::transport {

std::size_t Stream::write_some_now(asio::const_buffer buffer, boost::system::error_code& ec) {
  if (impl_) return impl_->write_some_now(buffer, ec);
  if (!socket_) {
    ec = asio::error::bad_descriptor;
    return 0;
  }
  socket_->non_blocking(true, ec);
  if (ec) return 0;
  return socket_->write_some(buffer, ec);
}

void Stream::close(boost::system::error_code& ec) {
  if (socket_)
    socket_->close(ec);
  else if (impl_)
    impl_->close(ec);
}

bool Stream::is_open() const {
  if (socket_) return socket_->is_open();
  return impl_ && impl_->is_open();
}

}  // namespace coccl::transport
