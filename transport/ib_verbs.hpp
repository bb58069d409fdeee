// ib transport, part 1: libibverbs at run time and the device this process uses.
//
// libibverbs is dlopen'ed on first use, so one coccl binary runs on machines with and without
// RDMA. Only the calls that verbs.h implements as real library symbols go through the table
// below; the data-path calls (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) are
// inline in verbs.h and jump through the provider's ops table, so they need no symbol.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/config.hpp"

namespace coccl::transport::ib {

/// The libibverbs entry points coccl uses (names without the ibv_ prefix: verbs.h defines macros
/// for some of the prefixed names).
struct Verbs {
  ibv_device** (*get_device_list)(int*);
  void (*free_device_list)(ibv_device**);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  int (*close_device)(ibv_context*);
  int (*query_device)(ibv_context*, ibv_device_attr*);
  // The exported symbol fills the leading (compatible) part of ibv_port_attr.
  int (*query_port)(ibv_context*, std::uint8_t, ibv_port_attr*);
  int (*query_gid)(ibv_context*, std::uint8_t, int, ibv_gid*);
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, std::size_t, int);
  int (*dereg_mr)(ibv_mr*);
  ibv_comp_channel* (*create_comp_channel)(ibv_context*);
  int (*destroy_comp_channel)(ibv_comp_channel*);
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroy_cq)(ibv_cq*);
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**);
  void (*ack_cq_events)(ibv_cq*, unsigned);
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
  int (*destroy_qp)(ibv_qp*);
  const char* (*wc_status_str)(ibv_wc_status);
};

/// The loaded library (loaded once per process), or null when libibverbs.so.1 or one of its
/// symbols is missing; then `why` (if given) says which.
const Verbs* verbs(std::string* why = nullptr);

/// COCCL_IB_HCA, in NCCL_IB_HCA's syntax: a comma-separated list of `name[:port]`; a leading `^`
/// excludes the listed devices instead of selecting them; a leading `=` (after any `^`) compares
/// names exactly instead of as prefixes. Empty selects everything.
class HcaFilter {
 public:
  /// Parses `spec`; throws std::system_error(errc::invalid_argument) on a malformed entry.
  explicit HcaFilter(const std::string& spec);
  /// True if port `port` of device `device` may be used.
  bool allows(const std::string& device, int port) const;

 private:
  struct Entry {
    std::string name;
    int port;  // -1: every port
  };
  bool listed(const std::string& device, int port) const;
  std::vector<Entry> entries_;
  bool exclude_ = false;
  bool exact_ = false;
};

/// Whether a GID table entry can carry RoCE v2 (from the kernel's gid_attrs in sysfs).
bool is_roce_v2(const std::string& device, int port, int index);

/// The device, port and GID this process uses, with its protection domain. Shared by every ib
/// connection of the process; thread-safe (its members are fixed after open()).
class Device {
 public:
  /// The process's device, opened on first call; null when none can be used, with the reason in
  /// `why` (library missing, no device, no active port, no usable GID, COCCL_IB_HCA matches
  /// nothing). The outcome is decided once per process.
  static std::shared_ptr<Device> get(std::string* why = nullptr);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const Verbs& verbs() const noexcept { return *verbs_; }
  ibv_context* context() const noexcept { return ctx_; }
  ibv_pd* pd() const noexcept { return pd_; }
  const std::string& name() const noexcept { return name_; }
  std::uint8_t port() const noexcept { return port_; }
  int gid_index() const noexcept { return gid_index_; }
  const ibv_gid& gid() const noexcept { return gid_; }
  std::uint16_t lid() const noexcept { return lid_; }
  bool ethernet() const noexcept { return ethernet_; }
  ibv_mtu mtu() const noexcept { return mtu_; }
  int max_qp_wr() const noexcept { return max_qp_wr_; }
  int max_cqe() const noexcept { return max_cqe_; }

 private:
  Device() = default;
  static std::shared_ptr<Device> open(std::string& why);

  const Verbs* verbs_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  std::string name_;
  std::uint8_t port_ = 0;
  int gid_index_ = 0;
  ibv_gid gid_{};
  std::uint16_t lid_ = 0;
  bool ethernet_ = false;
  ibv_mtu mtu_ = IBV_MTU_1024;
  int max_qp_wr_ = 0;
  int max_cqe_ = 0;
};

}  // namespace coccl::transport::ib

namespace coccl::params {

extern config::Param<std::string> ib_hca;         // COCCL_IB_HCA
extern config::Param<std::int64_t> ib_gid_index;  // COCCL_IB_GID_INDEX

}  // namespace coccl::params
