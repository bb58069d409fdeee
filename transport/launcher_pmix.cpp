// PmixClient: the few PMIx client calls a UniqueId exchange needs, resolved with dlopen so that
// coccl neither links nor builds against libpmix. The declarations below follow the PMIx standard's
// ABI (v3 and later): fixed-size name arrays, a value that starts with a 16-bit type tag
// followed by an 8-byte aligned union whose first members are scalars and pointers, and an
// attribute that is a key, 32-bit directives and such a value.
#include <dlfcn.h>

#include <algorithm>
#include <coccl/error.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "transport/bootstrap.hpp"
#include "transport/launcher.hpp"

namespace coccl::transport {

namespace {

constexpr std::size_t nspace_len = 256;  // PMIX_MAX_NSLEN + 1
constexpr std::size_t key_len = 512;     // PMIX_MAX_KEYLEN + 1
constexpr std::uint16_t type_string = 3;
constexpr std::uint16_t type_int = 6;
constexpr std::uint16_t type_uint32 = 14;
constexpr int err_timeout = -24;  // PMIX_ERR_TIMEOUT
constexpr std::uint8_t scope_global = 3;
constexpr std::uint32_t rank_wildcard = UINT32_MAX - 1;

struct Proc {
  char nspace[nspace_len];
  std::uint32_t rank;
};

// Only the type tag and the first union members are read or written here; the padding covers the
// largest union member of every PMIx version so that PMIx never reads past the object.
struct Value {
  std::uint16_t type;
  union {
    char* string;
    std::uint32_t uint32;
    int integer;
    unsigned char pad[64];
  } data;
};

// An attribute passed to a call (pmix_info_t): the key, the directives, the value.
struct Info {
  char key[key_len];
  std::uint32_t flags;
  Value value;
};

static_assert(offsetof(Info, flags) == key_len && offsetof(Info, value) == key_len + 8,
              "pmix_info_t: a key of PMIX_MAX_KEYLEN + 1, 32-bit directives, an aligned value");

[[noreturn]] void fail(errc e, const std::string& what) {
  throw std::system_error(make_error_code(e), what);
}

}  // namespace

struct PmixClient::Api {
  void* lib = nullptr;
  int (*init)(Proc*, void*, std::size_t) = nullptr;
  int (*finalize)(const void*, std::size_t) = nullptr;
  int (*put)(std::uint8_t, const char*, Value*) = nullptr;
  int (*commit)() = nullptr;
  int (*fence)(const Proc*, std::size_t, const void*, std::size_t) = nullptr;
  int (*get)(const Proc*, const char*, const void*, std::size_t, Value**) = nullptr;
  void (*destruct)(Value*) = nullptr;
  const char* (*error_string)(int) = nullptr;
  Proc me{};
  int size = 0;

  std::string why(int status) const {
    return error_string ? error_string(status) : "PMIx status " + std::to_string(status);
  }
  // Frees a value PMIx allocated for a get.
  void release(Value* v) const {
    if (!v) return;
    if (destruct) destruct(v);
    std::free(v);
  }
};

std::unique_ptr<PmixClient> PmixClient::open() {
  if (!std::getenv("PMIX_RANK") && !std::getenv("PMIX_NAMESPACE")) return nullptr;
  auto api = std::make_unique<Api>();
  for (const char* name : {"libpmix.so.2", "libpmix.so"}) {
    api->lib = ::dlopen(name, RTLD_NOW | RTLD_GLOBAL);
    if (api->lib) break;
  }
  if (!api->lib) return nullptr;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(api->lib, name));
    return fn != nullptr;
  };
  if (!sym(api->init, "PMIx_Init") || !sym(api->finalize, "PMIx_Finalize") ||
      !sym(api->put, "PMIx_Put") || !sym(api->commit, "PMIx_Commit") ||
      !sym(api->fence, "PMIx_Fence") || !sym(api->get, "PMIx_Get")) {
    ::dlclose(api->lib);
    return nullptr;
  }
  sym(api->destruct, "PMIx_Value_destruct");
  sym(api->error_string, "PMIx_Error_string");
  if (int rc = api->init(&api->me, nullptr, 0); rc != 0) {
    const std::string why = api->why(rc);
    ::dlclose(api->lib);
    fail(errc::unsupported, "PMIx_Init failed: " + why);
  }
  Proc job = api->me;
  job.rank = rank_wildcard;
  Value* v = nullptr;
  int rc = api->get(&job, "pmix.job.size", nullptr, 0, &v);
  if (rc != 0 || !v || v->type != type_uint32) {
    api->release(v);
    api->finalize(nullptr, 0);
    ::dlclose(api->lib);
    fail(errc::unsupported, "PMIx has no job size: " + api->why(rc));
  }
  api->size = static_cast<int>(v->data.uint32);
  api->release(v);
  return std::unique_ptr<PmixClient>(new PmixClient(std::move(api)));
}

PmixClient::PmixClient(std::unique_ptr<Api> api) : api_(std::move(api)) {}

PmixClient::~PmixClient() {
  // libpmix stays loaded: its threads may outlive PMIx_Finalize by a moment.
  api_->finalize(nullptr, 0);
}

int PmixClient::rank() const noexcept { return static_cast<int>(api_->me.rank); }
int PmixClient::size() const noexcept { return api_->size; }

void PmixClient::put(std::string_view key, std::string_view value) {
  if (key.size() >= key_len) fail(errc::invalid_argument, "PMIx key too long");
  char k[key_len] = {};
  std::memcpy(k, key.data(), key.size());
  std::string text(value);
  Value v{};
  v.type = type_string;
  v.data.string = text.data();
  if (int rc = api_->put(scope_global, k, &v); rc != 0)
    fail(errc::internal, "PMIx_Put(" + std::string(key) + "): " + api_->why(rc));
  if (int rc = api_->commit(); rc != 0) fail(errc::internal, "PMIx_Commit: " + api_->why(rc));
}

void PmixClient::fence(std::chrono::milliseconds timeout) {
  // PMIX_TIMEOUT: a process that never comes (it failed before its from_env(), or it does not
  // call it) fails the fence instead of holding every other one forever.
  Info info{};
  std::memcpy(info.key, "pmix.timeout", sizeof "pmix.timeout");
  info.value.type = type_int;
  const auto seconds = (timeout.count() + 999) / 1000;
  info.value.data.integer = static_cast<int>(std::min<std::int64_t>(seconds, INT32_MAX));
  const bool limited = timeout.count() > 0;
  const int rc = api_->fence(nullptr, 0, limited ? &info : nullptr, limited ? 1 : 0);
  if (rc == err_timeout)
    fail(errc::timed_out, "PMIx_Fence: not every process of the job came within " +
                              std::to_string(seconds) + " s: " + api_->why(rc));
  if (rc != 0) fail(errc::peer_lost, "PMIx_Fence: " + api_->why(rc));
}

std::string PmixClient::get(int rank, std::string_view key) {
  if (key.size() >= key_len) fail(errc::invalid_argument, "PMIx key too long");
  char k[key_len] = {};
  std::memcpy(k, key.data(), key.size());
  Proc who = api_->me;
  who.rank = static_cast<std::uint32_t>(rank);
  Value* v = nullptr;
  int rc = api_->get(&who, k, nullptr, 0, &v);
  if (rc != 0 || !v || v->type != type_string || !v->data.string) {
    api_->release(v);
    fail(errc::bad_message, "PMIx_Get(rank " + std::to_string(rank) + ", " + std::string(key) +
                                "): " + (rc ? api_->why(rc) : "not a string"));
  }
  std::string out(v->data.string);
  api_->release(v);
  return out;
}

std::optional<std::uint32_t> PmixClient::job_info(std::string_view key) {
  if (key.size() >= key_len) fail(errc::invalid_argument, "PMIx key too long");
  char k[key_len] = {};
  std::memcpy(k, key.data(), key.size());
  Proc job = api_->me;
  job.rank = rank_wildcard;
  Value* v = nullptr;
  const int rc = api_->get(&job, k, nullptr, 0, &v);
  std::optional<std::uint32_t> out;
  if (rc == 0 && v && v->type == type_uint32) out = v->data.uint32;
  api_->release(v);
  return out;
}

namespace {

class PmixBook final : public AddressBook {
 public:
  PmixBook(PmixClient& pmix, std::string key, std::chrono::milliseconds timeout)
      : pmix_(pmix), key_(std::move(key) + "/addr"), timeout_(timeout) {}

  void publish(const PeerInfo& self) override {
    pmix_.put(key_, encode_book_entry(self));
    pmix_.fence(timeout_);
  }
  PeerInfo lookup(int rank) override { return decode_book_entry(pmix_.get(rank, key_), rank); }
  std::optional<HostCount> hosts() override {
    // Asked before and after publishing: the launcher's answer is kept from the first time.
    if (asked_) return hosts_;
    asked_ = true;
    // The launcher's nodes are coccl's hosts unless COCCL_HOSTID gives ranks identities of
    // their own, which the launcher does not know.
    if (!params::hostid.get().empty()) return hosts_;
    const auto nodes = pmix_.job_info("pmix.num.nodes");
    const auto local = pmix_.job_info("pmix.local.size");
    if (nodes && local) hosts_ = HostCount{*nodes, *local};
    return hosts_;
  }

 private:
  PmixClient& pmix_;
  std::string key_;
  std::chrono::milliseconds timeout_;
  bool asked_ = false;
  std::optional<HostCount> hosts_;
};

}  // namespace

std::unique_ptr<AddressBook> pmix_book(PmixClient& pmix, std::string key,
                                       std::chrono::milliseconds timeout) {
  return std::make_unique<PmixBook>(pmix, std::move(key), timeout);
}

}  // namespace coccl::transport
