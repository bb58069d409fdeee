#include "transport/ib_verbs.hpp"

#include <dlfcn.h>

#include <coccl/error.hpp>
#include <cstring>
#include <fstream>
#include <mutex>

#include "runtime/log.hpp"

namespace coccl::params {

config::Param<std::string> ib_hca{
    "COCCL_IB_HCA", "",
    "RDMA devices and ports for the ib transport: mlx5_0:1,mlx5_1 (name prefixes), ^ to exclude, "
    "= for exact names (empty: the first active port)",
    "NCCL_IB_HCA"};
config::Param<std::int64_t> ib_gid_index{
    "COCCL_IB_GID_INDEX", -1,
    "GID table index for RoCE (-1: the first RoCE v2 GID, IPv4-mapped preferred)",
    "NCCL_IB_GID_INDEX"};

}  // namespace coccl::params

namespace coccl::transport::ib {

namespace {

template <typename F>
bool load(void* lib, const char* name, F& fn, std::string& why) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (!fn && why.empty()) {
    // Appended, not `std::string(...) + name`: GCC 12 at -O1 (the TSan tree) reports a false
    // out-of-bounds memcpy for the temporary's move (-Warray-bounds).
    why = "libibverbs.so.1 lacks ";
    why += name;
  }
  return fn != nullptr;
}

struct Loaded {
  Verbs table{};
  bool ok = false;
  std::string why;
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    // Never unloaded: provider plugins and the process's device stay in use until exit.
    void* lib = ::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = ::dlerror();
      r.why = std::string("cannot load libibverbs.so.1: ") + (e ? e : "unknown error");
      return r;
    }
    Verbs& v = r.table;
    bool ok = true;
    ok &= load(lib, "ibv_get_device_list", v.get_device_list, r.why);
    ok &= load(lib, "ibv_free_device_list", v.free_device_list, r.why);
    ok &= load(lib, "ibv_get_device_name", v.get_device_name, r.why);
    ok &= load(lib, "ibv_open_device", v.open_device, r.why);
    ok &= load(lib, "ibv_close_device", v.close_device, r.why);
    ok &= load(lib, "ibv_query_device", v.query_device, r.why);
    ok &= load(lib, "ibv_query_port", v.query_port, r.why);
    ok &= load(lib, "ibv_query_gid", v.query_gid, r.why);
    ok &= load(lib, "ibv_alloc_pd", v.alloc_pd, r.why);
    ok &= load(lib, "ibv_dealloc_pd", v.dealloc_pd, r.why);
    ok &= load(lib, "ibv_reg_mr", v.reg_mr, r.why);
    ok &= load(lib, "ibv_dereg_mr", v.dereg_mr, r.why);
    ok &= load(lib, "ibv_create_comp_channel", v.create_comp_channel, r.why);
    ok &= load(lib, "ibv_destroy_comp_channel", v.destroy_comp_channel, r.why);
    ok &= load(lib, "ibv_create_cq", v.create_cq, r.why);
    ok &= load(lib, "ibv_destroy_cq", v.destroy_cq, r.why);
    ok &= load(lib, "ibv_get_cq_event", v.get_cq_event, r.why);
    ok &= load(lib, "ibv_ack_cq_events", v.ack_cq_events, r.why);
    ok &= load(lib, "ibv_create_qp", v.create_qp, r.why);
    ok &= load(lib, "ibv_modify_qp", v.modify_qp, r.why);
    ok &= load(lib, "ibv_destroy_qp", v.destroy_qp, r.why);
    ok &= load(lib, "ibv_wc_status_str", v.wc_status_str, r.why);
    r.ok = ok;
    return r;
  }();
  return l;
}

[[noreturn]] void bad_spec(const std::string& spec, const std::string& what) {
  throw std::system_error(make_error_code(errc::invalid_argument),
                          "COCCL_IB_HCA='" + spec + "': " + what);
}

bool ipv4_mapped(const ibv_gid& g) {
  static constexpr std::uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, sizeof prefix) == 0;
}

bool zero(const ibv_gid& g) {
  static constexpr ibv_gid none{};
  return std::memcmp(g.raw, none.raw, sizeof g.raw) == 0;
}

}  // namespace

const Verbs* verbs(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why) *why = l.why;
  return l.ok ? &l.table : nullptr;
}

HcaFilter::HcaFilter(const std::string& spec) {
  std::string s = spec;
  if (!s.empty() && s[0] == '^') {
    exclude_ = true;
    s.erase(0, 1);
  }
  if (!s.empty() && s[0] == '=') {
    exact_ = true;
    s.erase(0, 1);
  }
  std::size_t at = 0;
  while (at <= s.size() && !s.empty()) {
    std::size_t end = s.find(',', at);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(at, end - at);
    if (item.empty()) bad_spec(spec, "empty entry");
    Entry e{item, -1};
    if (auto colon = item.find(':'); colon != std::string::npos) {
      e.name = item.substr(0, colon);
      std::string port = item.substr(colon + 1);
      if (e.name.empty() || port.empty() ||
          port.find_first_not_of("0123456789") != std::string::npos || port.size() > 3)
        bad_spec(spec, "'" + item + "' is not name or name:port");
      e.port = std::stoi(port);
      if (e.port < 1 || e.port > 255) bad_spec(spec, "port out of range in '" + item + "'");
    }
    entries_.push_back(std::move(e));
    at = end + 1;
  }
  if ((exclude_ || exact_) && entries_.empty()) bad_spec(spec, "no device listed");
}

bool HcaFilter::listed(const std::string& device, int port) const {
  for (const Entry& e : entries_) {
    bool name = exact_ ? device == e.name : device.compare(0, e.name.size(), e.name) == 0;
    if (name && (e.port < 0 || e.port == port)) return true;
  }
  return false;
}

bool HcaFilter::allows(const std::string& device, int port) const {
  if (entries_.empty()) return true;
  return exclude_ ? !listed(device, port) : listed(device, port);
}

bool is_roce_v2(const std::string& device, int port, int index) {
  std::ifstream f("/sys/class/infiniband/" + device + "/ports/" + std::to_string(port) +
                  "/gid_attrs/types/" + std::to_string(index));
  std::string type;
  std::getline(f, type);
  return type == "RoCE v2";
}

std::shared_ptr<Device> Device::get(std::string* why) {
  static std::mutex m;
  static std::shared_ptr<Device> device;
  static std::string reason;
  static bool decided = false;
  std::lock_guard lock(m);
  if (!decided) {
    decided = true;
    try {
      device = open(reason);
    } catch (const std::exception& e) {
      reason = e.what();
    }
    if (device)
      COCCL_INFO(ib, -1, "ib: using %s port %d, GID index %d (%s)", device->name().c_str(),
                 device->port(), device->gid_index(),
                 device->ethernet() ? "RoCE v2" : "InfiniBand");
    else
      COCCL_INFO(ib, -1, "ib transport not offered: %s", reason.c_str());
  }
  if (!device && why) *why = reason;
  return device;
}

std::shared_ptr<Device> Device::open(std::string& why) {
  const Verbs* v = ib::verbs(&why);
  if (!v) return nullptr;
  HcaFilter filter(params::ib_hca.get());
  const std::int64_t want_gid = params::ib_gid_index.get();
  int n = 0;
  ibv_device** list = v->get_device_list(&n);
  if (!list || n == 0) {
    if (list) v->free_device_list(list);
    why = "no RDMA device found";
    return nullptr;
  }
  std::shared_ptr<Device> chosen;
  std::string seen;
  for (int i = 0; i < n && !chosen; ++i) {
    std::string name = v->get_device_name(list[i]);
    seen += (seen.empty() ? "" : ", ") + name;
    ibv_context* ctx = v->open_device(list[i]);
    if (!ctx) continue;
    ibv_device_attr dattr{};
    if (v->query_device(ctx, &dattr) != 0) {
      v->close_device(ctx);
      continue;
    }
    for (int port = 1; port <= dattr.phys_port_cnt && !chosen; ++port) {
      ibv_port_attr pattr{};
      if (!filter.allows(name, port) || v->query_port(ctx, port, &pattr) != 0 ||
          pattr.state != IBV_PORT_ACTIVE)
        continue;
      const bool eth = pattr.link_layer == IBV_LINK_LAYER_ETHERNET;
      int index = -1;
      ibv_gid gid{};
      if (want_gid >= 0) {
        if (want_gid >= pattr.gid_tbl_len || v->query_gid(ctx, port, int(want_gid), &gid) != 0)
          throw std::system_error(make_error_code(errc::invalid_argument),
                                  "COCCL_IB_GID_INDEX=" + std::to_string(want_gid) +
                                      " is not in the GID table of " + name + " port " +
                                      std::to_string(port));
        index = static_cast<int>(want_gid);
      } else if (!eth) {
        if (v->query_gid(ctx, port, 0, &gid) == 0) index = 0;
      } else {
        // RoCE v2 (routable UDP/IP) rather than v1; among those an IPv4-mapped GID, which is
        // what an IPv4 fabric routes.
        int fallback = -1;
        ibv_gid fallback_gid{};
        for (int g = 0; g < pattr.gid_tbl_len && index < 0; ++g) {
          ibv_gid candidate{};
          if (v->query_gid(ctx, port, g, &candidate) != 0 || zero(candidate) ||
              !is_roce_v2(name, port, g))
            continue;
          if (ipv4_mapped(candidate)) {
            index = g;
            gid = candidate;
          } else if (fallback < 0) {
            fallback = g;
            fallback_gid = candidate;
          }
        }
        if (index < 0 && fallback >= 0) {
          index = fallback;
          gid = fallback_gid;
        }
      }
      if (index < 0) {
        why = name + " port " + std::to_string(port) + " has no usable RoCE v2 GID";
        continue;
      }
      ibv_pd* pd = v->alloc_pd(ctx);
      if (!pd) {
        why = "ibv_alloc_pd failed on " + name;
        continue;
      }
      chosen.reset(new Device);
      chosen->verbs_ = v;
      chosen->ctx_ = ctx;
      chosen->pd_ = pd;
      chosen->name_ = name;
      chosen->port_ = static_cast<std::uint8_t>(port);
      chosen->gid_index_ = index;
      chosen->gid_ = gid;
      chosen->lid_ = pattr.lid;
      chosen->ethernet_ = eth;
      chosen->mtu_ = pattr.active_mtu;
      chosen->max_qp_wr_ = dattr.max_qp_wr;
      chosen->max_cqe_ = dattr.max_cqe;
    }
    if (!chosen) v->close_device(ctx);
  }
  v->free_device_list(list);
  if (!chosen && why.empty())
    why = "no active port on the RDMA devices (" + seen + ") allowed by COCCL_IB_HCA='" +
          params::ib_hca.get() + "'";
  return chosen;
}

Device::~Device() {
  if (pd_) verbs_->dealloc_pd(pd_);
  if (ctx_) verbs_->close_device(ctx_);
}

}  // namespace coccl::transport::ib
