// Stream: the byte stream the bootstrap, the link handshake and the tcp link run on. It is either
// a tcp socket or another implementation (the in-memory network of transport/memory.hpp, which
// lets many ranks of one process form communicators without sockets or descriptors).
//
// A Stream meets Asio's AsyncReadStream and AsyncWriteStream requirements, so asio::async_read,
// async_write, use_awaitable and redirect_error work on it as on a socket. Over a tcp socket each
// operation goes straight to the socket with the caller's own handler (no type erasure, nothing
// changes for tcp); any other stream is reached through the virtual Impl with a type-erased
// handler.
#pragma once

#include <array>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstddef>
#include <memory>
#include <optional>

namespace coccl::transport {

namespace asio = boost::asio;

class Stream {
 public:
  using executor_type = asio::any_io_executor;
  /// The completion handler of a read or write, type-erased.
  using Handler = asio::any_completion_handler<void(boost::system::error_code, std::size_t)>;

  /// At most this many buffers of a sequence reach an Impl; a read or write of fewer is a partial
  /// one, which the composed operations (async_read, async_write) continue.
  static constexpr std::size_t max_buffers = 8;
  template <typename Buffer>
  struct Buffers {
    std::array<Buffer, max_buffers> at{};
    std::size_t count = 0;
    std::size_t size() const noexcept {
      std::size_t n = 0;
      for (std::size_t i = 0; i < count; ++i) n += at[i].size();
      return n;
    }
  };
  using MutableBuffers = Buffers<asio::mutable_buffer>;
  using ConstBuffers = Buffers<asio::const_buffer>;

  /// A stream that is not a tcp socket. Called on the stream's executor (single-threaded, like a
  /// socket). Reads and writes complete through their handler, never inside the call, with
  /// operation_aborted when the stream is closed under them; at most one read and one write are
  /// in flight at a time (as for any AsyncReadStream/AsyncWriteStream).
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual executor_type get_executor() = 0;
    virtual void async_read_some(MutableBuffers buffers, Handler handler) = 0;
    virtual void async_write_some(ConstBuffers buffers, Handler handler) = 0;
    /// Writes what fits now without waiting (possibly nothing); sets `ec` when the stream is
    /// closed or the peer has gone.
    virtual std::size_t write_some_now(asio::const_buffer buffer,
                                       boost::system::error_code& ec) = 0;
    virtual void close(boost::system::error_code& ec) = 0;
    virtual bool is_open() const = 0;
  };

  /// An empty stream: neither open nor usable until another is moved into it.
  Stream() = default;
  /// A stream over a tcp socket.
  explicit Stream(asio::ip::tcp::socket socket) : socket_(std::move(socket)) {}
  /// A stream over another implementation.
  explicit Stream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Stream(Stream&&) noexcept = default;
  Stream& operator=(Stream&&) noexcept = default;

  executor_type get_executor() { return socket_ ? socket_->get_executor() : impl_->get_executor(); }

  /// Reads some bytes; completion signature void(error_code, std::size_t). An end of stream is
  /// asio::error::eof.
  template <typename MutableBufferSequence, typename Token>
  auto async_read_some(const MutableBufferSequence& buffers, Token&& token) {
    return asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this](auto handler, const MutableBufferSequence& b) {
          if (socket_)
            socket_->async_read_some(b, std::move(handler));
          else
            impl_->async_read_some(gather<asio::mutable_buffer>(b), Handler(std::move(handler)));
        },
        token, buffers);
  }

  /// Writes some bytes; completion signature void(error_code, std::size_t). A write to a peer
  /// that has closed fails (broken_pipe or connection_reset).
  template <typename ConstBufferSequence, typename Token>
  auto async_write_some(const ConstBufferSequence& buffers, Token&& token) {
    return asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this](auto handler, const ConstBufferSequence& b) {
          if (socket_)
            socket_->async_write_some(b, std::move(handler));
          else
            impl_->async_write_some(gather<asio::const_buffer>(b), Handler(std::move(handler)));
        },
        token, buffers);
  }

  /// Writes what fits now without blocking (a tcp socket is put in non-blocking mode): for notices
  /// sent while closing, which a stopped peer must not be able to hold up.
  std::size_t write_some_now(asio::const_buffer buffer, boost::system::error_code& ec);

  /// Closes the stream; pending operations complete with operation_aborted, the peer reads an end
  /// of stream.
  void close(boost::system::error_code& ec);
  bool is_open() const;

  /// The tcp socket under this stream, or null for another kind (socket options, io_uring).
  asio::ip::tcp::socket* tcp() noexcept { return socket_ ? &*socket_ : nullptr; }
  const asio::ip::tcp::socket* tcp() const noexcept { return socket_ ? &*socket_ : nullptr; }

 private:
  template <typename Buffer, typename Sequence>
  static Buffers<Buffer> gather(const Sequence& sequence) {
    Buffers<Buffer> out;
    for (auto it = asio::buffer_sequence_begin(sequence);
         it != asio::buffer_sequence_end(sequence) && out.count < max_buffers; ++it) {
      Buffer b(*it);
      if (b.size() > 0) out.at[out.count++] = b;
    }
    return out;
  }

  std::optional<asio::ip::tcp::socket> socket_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace coccl::transport
