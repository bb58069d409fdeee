#include "transport/shm.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/error.hpp>
#include <cstring>

#include "transport/hmac.hpp"
#include "transport/link_setup.hpp"

namespace coccl::params {

config::Param<std::string> shm_dir{
    "COCCL_SHM_DIR", "",
    "directory for the shm transport's segments (files there instead of POSIX shared memory in "
    "/dev/shm); every rank of a host must see the same one"};

}  // namespace coccl::params

namespace coccl::transport {

// Ring layout. The segment starts with the receiver's tail on a cache line of its own (the
// receiver writes it; the sender reads it only when its cached copy says the ring is full). Slots
// follow, each a cache-line-aligned record: a 16-byte header (sequence number, size, fingerprint)
// and the payload right after it. The sequence number is stored last, with release order, so a
// receiver polling a slot's first line takes a chunk of up to 48 bytes (an 8-byte all_reduce's
// data) in one cache-line transfer and an operation header (op_check.hpp) in two, where a shared
// head counter and a metadata array cost two more each time.
constexpr std::size_t cache_line = 64;
struct ShmRing {
  alignas(cache_line) std::atomic<std::uint64_t> tail;  // chunks released by the receiver
};
struct ShmSlot {
  std::atomic<std::uint64_t> seq;  // k + 1 once chunk k (counted from 0) is published here
  std::uint32_t size;
  std::uint32_t fingerprint;
};
constexpr std::size_t slots_offset = cache_line;
static_assert(sizeof(ShmRing) <= slots_offset && sizeof(ShmSlot) == 16);

namespace {

constexpr std::size_t payload_offset = sizeof(ShmSlot);

constexpr std::size_t slot_stride(std::size_t slot_bytes) {
  return (payload_offset + slot_bytes + cache_line - 1) / cache_line * cache_line;
}

std::system_error sys_error(const std::string& what) {
  return std::system_error(errno, std::system_category(), what);
}

// Segments are POSIX shared memory (/dev/shm), or files under COCCL_SHM_DIR when it is set.
int open_segment(const std::string& name, int flags, mode_t mode) {
  const std::string dir = params::shm_dir.get();
  if (dir.empty()) return ::shm_open(name.c_str(), flags, mode);
  return ::open((dir + name).c_str(), flags | O_CLOEXEC, mode);
}

void unlink_segment(const std::string& name) {
  const std::string dir = params::shm_dir.get();
  if (dir.empty())
    ::shm_unlink(name.c_str());
  else
    ::unlink((dir + name).c_str());
}

std::string where() {
  const std::string dir = params::shm_dir.get();
  return dir.empty() ? "/dev/shm" : dir;
}

}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::create(std::size_t bytes) {
  std::array<std::uint8_t, 8> rnd{};
  detail::random_bytes(rnd);
  char name[64];
  std::snprintf(name, sizeof name, "/coccl-%d-%02x%02x%02x%02x%02x%02x%02x%02x", ::getpid(), rnd[0],
                rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
  int fd = open_segment(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw sys_error(std::string("shm_open ") + name + " in " + where());
  // The pages are reserved now: a segment only sized (sparse) would fault with SIGBUS on first
  // touch once its filesystem (a small /dev/shm, as in containers) ran out of space.
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    ::close(fd);
    unlink_segment(name);
    throw std::system_error(err, std::system_category(),
                            "cannot reserve " + std::to_string(bytes) +
                                " bytes of shared memory in " + where() +
                                " for a shm link (enlarge it, e.g. docker --shm-size, or set "
                                "COCCL_SHM_DISABLE=1 to link over tcp)");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    auto e = sys_error("mmap shm segment");
    unlink_segment(name);
    throw e;
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, p, bytes, true));
}

std::unique_ptr<ShmSegment> ShmSegment::open(const std::string& name, std::size_t bytes) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.rfind("/coccl-", 0) != 0)
    throw std::system_error(make_error_code(errc::bad_message), "bad shm segment name");
  int fd = open_segment(name, O_RDWR, 0);
  if (fd < 0) throw sys_error("shm_open " + name);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes) {
    ::close(fd);
    throw std::system_error(make_error_code(errc::bad_message), "shm segment too small");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw sys_error("mmap " + name);
  auto seg = std::unique_ptr<ShmSegment>(new ShmSegment(name, p, bytes, false));
  // Once both sides hold a mapping the name only risks a leak if a process dies.
  seg->unlink();
  return seg;
}

void ShmSegment::unlink() noexcept {
  if (linked_) unlink_segment(name_);
  linked_ = false;
}

ShmSegment::~ShmSegment() {
  if (owner_) unlink();
  ::munmap(data_, bytes_);
}

std::size_t ShmConnection::segment_bytes(std::size_t slots, std::size_t slot_bytes) {
  return slots_offset + slots * slot_stride(slot_bytes);
}

ShmConnection::ShmConnection(int self, int peer, Stream socket, std::size_t slots,
                             std::size_t slot_bytes, std::unique_ptr<ShmSegment> own,
                             std::unique_ptr<ShmSegment> peer_ring, ShmPoller& poller,
                             FailureHandler on_failure)
    : SocketConnection(self, peer, std::move(socket), std::move(on_failure)),
      slots_(slots),
      slot_bytes_(slot_bytes),
      slot_mask_(slots != 0 && (slots & (slots - 1)) == 0 ? slots - 1 : 0),
      stride_(slot_stride(slot_bytes)),
      own_(std::move(own)),
      peer_(std::move(peer_ring)),
      recv_ring_(static_cast<ShmRing*>(own_->data())),
      send_ring_(static_cast<ShmRing*>(peer_->data())),
      poller_(poller) {}

ShmConnection::~ShmConnection() { poller_.forget(this); }

inline ShmSlot& ShmConnection::slot(void* ring, std::uint64_t i) const noexcept {
  // A mask where the slot count is a power of two (the default 8): the division it replaces was
  // 3% of a small operation.
  const std::uint64_t k = slot_mask_ ? (i & slot_mask_) : (i % slots_);
  return *reinterpret_cast<ShmSlot*>(static_cast<std::byte*>(ring) + slots_offset + k * stride_);
}

bool ShmConnection::can_put() const noexcept {
  // The peer's tail is read (a cache miss: the peer wrote it last) only when the copy seen before
  // leaves no free slot.
  if (sent_ - tail_seen_ >= slots_) tail_seen_ = send_ring_->tail.load(std::memory_order_acquire);
  return sent_ - tail_seen_ < slots_;
}

void ShmConnection::learn_credit() noexcept {
  tail_seen_ = send_ring_->tail.load(std::memory_order_acquire);
}

inline bool ShmConnection::published(std::uint64_t i) const noexcept {
  return slot(own_->data(), i).seq.load(std::memory_order_acquire) == i + 1;
}

bool ShmConnection::can_recv() const noexcept { return published(consumed_); }

bool ShmConnection::settled() const noexcept {
  // Chunk released_ is published exactly while some published chunk is not released yet.
  return !closed_ && !published(released_) &&
         send_ring_->tail.load(std::memory_order_acquire) == sent_ && !recv_waiter_ &&
         !credit_waiter_ && idle_writer();
}

bool ShmConnection::check() {
  bool progress = false;
  if (recv_waiter_ && (closed_ || departed_ || can_recv())) {
    resume_inline(recv_waiter_);
    progress = true;
  }
  if (credit_waiter_ && (closed_ || departed_ || can_put())) {
    resume_inline(credit_waiter_);
    progress = true;
  }
  return progress;
}

void ShmConnection::resume_inline(Waiter& w) {
  // Resuming inline saves a trip through the io_context on the latency path; the waiter is taken
  // out first because the resumed coroutine may park a new one.
  Resume h(std::move(*w));
  w.reset();
  std::move(h)(boost::system::error_code{});
}

void ShmConnection::publish(const void* src, std::size_t n, std::uint32_t fp, const void* head,
                            std::size_t head_n) {
  ShmSlot& s = slot(peer_->data(), sent_);
  std::byte* payload = reinterpret_cast<std::byte*>(&s) + payload_offset;
  if (head_n) std::memcpy(payload, head, head_n);
  if (n) std::memcpy(payload + head_n, src, n);
  s.size = static_cast<std::uint32_t>(head_n + n);
  s.fingerprint = fp;
  ++sent_;
  // Publishes the payload and the size and fingerprint above.
  s.seq.store(sent_, std::memory_order_release);
}

Chunk ShmConnection::chunk_at(std::uint64_t i) const {
  ShmSlot& s = slot(own_->data(), i);
  return Chunk{reinterpret_cast<std::byte*>(&s) + payload_offset, s.size, s.fingerprint};
}

asio::awaitable<void> ShmConnection::put(const void* src, std::size_t n, std::uint32_t fp) {
  if (n > slot_bytes_) throw LinkError(make_error_code(errc::internal), "put larger than a slot");
  co_await park_for_credit();
  if (departed_) fail_departed("was sending to it");
  if (closed_) throw_failure();
  publish(src, n, fp);
}

asio::awaitable<Chunk> ShmConnection::wait() {
  co_await park_for_data();
  // Published chunks are delivered even after the peer left or the link closed (see tcp).
  if (!can_recv()) {
    if (departed_) fail_departed("was waiting for data from it");
    throw_failure();
  }
  co_return chunk_at(consumed_++);
}

bool ShmConnection::try_put_gathered(const void* head, std::size_t head_n, const void* src,
                                     std::size_t n, std::uint32_t fp) {
  if (closed_ || departed_ || head_n + n > slot_bytes_ || !can_put()) return false;
  publish(src, n, fp, head, head_n);
  return true;
}

std::optional<Chunk> ShmConnection::peek() {
  if (closed_ || departed_ || !can_recv()) return std::nullopt;
  return chunk_at(consumed_);
}

void ShmConnection::release() {
  ++released_;
  // The receiver is done reading the slot before the sender may overwrite it.
  recv_ring_->tail.store(released_, std::memory_order_release);
}

namespace {

// A shm link: each end creates the segment of its own receive ring and sends its name; the other
// maps it. A name is unlinked once both ends have it mapped.
class ShmSetup final : public LinkSetup {
 public:
  ShmSetup(const LinkEnv& env, std::size_t slots)
      : env_(env), slots_(slots), bytes_(ShmConnection::segment_bytes(slots, env.slot_bytes)) {}

  std::vector<std::uint8_t> offer() override {
    own_ = ShmSegment::create(bytes_);
    return name_bytes();
  }
  std::vector<std::uint8_t> accept(std::span<const std::uint8_t> theirs) override {
    theirs_ = ShmSegment::open(std::string(theirs.begin(), theirs.end()), bytes_);
    own_ = ShmSegment::create(bytes_);
    return name_bytes();
  }
  void complete(std::span<const std::uint8_t> theirs) override {
    theirs_ = ShmSegment::open(std::string(theirs.begin(), theirs.end()), bytes_);
    own_->unlink();  // the peer mapped it before it answered
  }
  std::unique_ptr<Connection> make(int peer, Stream control, std::vector<Stream> further) override {
    if (!further.empty())
      throw std::system_error(make_error_code(errc::internal), "a shm link has one socket");
    auto c = std::make_unique<ShmConnection>(env_.rank, peer, std::move(control), slots_,
                                             env_.slot_bytes, std::move(own_), std::move(theirs_),
                                             *env_.poller, env_.on_failure);
    c->start();
    return c;
  }

 private:
  std::vector<std::uint8_t> name_bytes() const {
    return std::vector<std::uint8_t>(own_->name().begin(), own_->name().end());
  }

  LinkEnv env_;
  std::size_t slots_;
  std::size_t bytes_;
  std::unique_ptr<ShmSegment> own_, theirs_;
};

}  // namespace

std::unique_ptr<LinkSetup> make_shm_setup(const LinkEnv& env, std::size_t slots) {
  return std::make_unique<ShmSetup>(env, slots);
}

}  // namespace coccl::transport
