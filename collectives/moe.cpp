// coccl::moe (include/coccl/moe.hpp): argument checks, the device forms' plumbing and the host
// forms, which run over the communicator's host collectives.
#include <algorithm>
#include <cmath>
#include <coccl/moe.hpp>
#include <cstring>
#include <limits>
#include <type_traits>

#include "collectives/moe_state.hpp"
#include "collectives/reduce_cpu.hpp"

namespace coccl::moe {
namespace {

[[noreturn]] void invalid(const std::string& why) {
  throw std::system_error(make_error_code(errc::invalid_argument), "coccl::moe: " + why);
}

// Makes the arena on first use (collective).
template <class State>
detail::DeviceArena& arena_of(State& s, std::size_t bytes) {
  if (!s.arena) s.arena = detail::make_arena(s.comm, bytes);
  return *s.arena;
}

// The dispatcher's device side, made on first use (collective): an arena mapped by every peer on
// one host, or a local buffer whose rows go through the network path across hosts.
void prepare_device_side(detail::DispatchState& s) {
  if (s.across_hosts) {
    if (!s.net) s.net = detail::make_net_dispatch(s.comm, s.shape);
    return;
  }
  arena_of(s, s.layout.total);
}

// Every slot of every token of every rank may name an expert of one rank (ids may repeat).
std::size_t worst_case_rows(const DispatchConfig& c, int nranks) {
  return static_cast<std::size_t>(nranks) * static_cast<std::size_t>(c.max_tokens) *
         static_cast<std::size_t>(c.top_k);
}

kernels::moe::MoeShape shape_of(const DispatchConfig& c, int nranks) {
  kernels::moe::MoeShape s{};
  s.nranks = nranks;
  s.max_tokens = c.max_tokens;
  s.hidden = c.hidden;
  s.type = c.type;
  s.top_k = c.top_k;
  s.num_experts = c.num_experts;
  s.capacity = c.max_recv_rows != 0 ? c.max_recv_rows : worst_case_rows(c, nranks);
  return s;
}

kernels::moe::MoeLayout checked_layout(const kernels::moe::MoeShape& s) {
  kernels::moe::MoeLayout L{};
  if (!kernels::moe::moe_layout(s, L)) {
    invalid(
        "invalid dispatch config: need 1 <= top_k <= 16, num_experts a multiple of the " +
        std::string("ranks and <= 512, hidden * size_of(type) a multiple of 16, type float32, ") +
        "float16 or bfloat16, at most 8 ranks, max_tokens >= 1, capacity < 2^31 rows");
  }
  return L;
}

kernels::moe::NetMoeLayout checked_net_layout(const kernels::moe::MoeShape& s) {
  kernels::moe::NetMoeLayout L{};
  if (!kernels::moe::net_moe_layout(s, L)) {
    invalid("invalid dispatch config across hosts: need 1 <= top_k <= 16, num_experts a multiple " +
            std::string("of the ranks and <= 512, hidden * size_of(type) a multiple of 16, type ") +
            "float32, float16 or bfloat16, at most " +
            std::to_string(kernels::moe::net_moe_max_ranks) +
            " ranks, max_tokens >= 1, capacity < 2^31 rows");
  }
  return L;
}

// ---- host all_to_allv ----

template <class Count>
void host_a2av(detail::A2avState& s, const void* send, const Count* sc, const Count* sd, void* recv,
               Count* rc, const Count* rd) {
  Communicator& comm = s.comm;
  const int n = comm.size();
  if (sc == nullptr || rc == nullptr) invalid("all_to_allv: null counts");
  std::vector<std::int64_t> out(n), in(n);
  std::int64_t bad = 0;
  for (int q = 0; q < n; ++q) {
    out[q] = static_cast<std::int64_t>(sc[q]);
    if (out[q] < 0 || static_cast<std::uint64_t>(out[q]) > s.max_count) bad = 1;
  }
  comm.all_to_all(out.data(), in.data(), 1, DataType::int64);
  for (int q = 0; q < n; ++q) {
    if (in[q] < 0 || static_cast<std::uint64_t>(in[q]) > s.max_count) bad = 1;
  }
  // Every rank learns whether any count was bad, so all of them fail (or none does).
  comm.all_reduce(&bad, &bad, 1, DataType::int64, ReduceOp::max);
  if (bad) {
    invalid("all_to_allv: a send count on some rank is negative or above max_count " +
            std::to_string(s.max_count));
  }
  std::vector<std::size_t> scount(n), sdispl(n), rcount(n), rdispl(n);
  std::size_t so = 0, ro = 0;
  for (int q = 0; q < n; ++q) {
    scount[q] = static_cast<std::size_t>(out[q]);
    rcount[q] = static_cast<std::size_t>(in[q]);
    sdispl[q] = sd ? static_cast<std::size_t>(sd[q]) : so;
    rdispl[q] = rd ? static_cast<std::size_t>(rd[q]) : ro;
    so += scount[q];
    ro += rcount[q];
    rc[q] = static_cast<Count>(in[q]);
  }
  comm.all_to_allv(send, std::move(scount), std::move(sdispl), recv, std::move(rcount),
                   std::move(rdispl), s.type);
}

template <class Count>
void device_a2av(detail::A2avState& s, const void* send, const Count* sc, const Count* sd,
                 void* recv, Count* rc, const Count* rd, cuda_stream stream) {
  if (sc == nullptr || rc == nullptr) invalid("all_to_allv: null counts");
  const std::size_t elt = size_of(s.type);
  kernels::moe::A2av args{};
  args.send = send;
  args.send_counts = sc;
  args.send_displs = sd;
  args.recv = recv;
  args.recv_counts = rc;
  args.recv_displs = rd;
  args.counts64 = std::is_same_v<Count, std::int64_t>;
  args.max_count = s.max_count;
  args.elem_bytes = elt;
  if (s.max_count > 0 && (send == nullptr || recv == nullptr)) invalid("all_to_allv: null buffer");
  if (detail::spans_hosts(s.comm)) {
    detail::launch_a2av_net(s, args, stream);
    return;
  }
  auto& a = arena_of(s, kernels::moe::a2av_arena_bytes(s.max_count, elt, s.comm.size()));
  detail::launch_a2av(a, args, stream);
}

// ---- host dispatch and combine ----

float widen(DataType t, const char* p) {
  std::uint16_t h;
  switch (t) {
    case DataType::float16:
      std::memcpy(&h, p, 2);
      return coccl::detail::half_to_float(h);
    case DataType::bfloat16:
      std::memcpy(&h, p, 2);
      return coccl::detail::bf16_to_float(h);
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

void narrow(DataType t, float f, char* p) {
  std::uint16_t h;
  switch (t) {
    case DataType::float16:
      h = coccl::detail::float_to_half(f);
      std::memcpy(p, &h, 2);
      break;
    case DataType::bfloat16:
      h = coccl::detail::float_to_bf16(f);
      std::memcpy(p, &h, 2);
      break;
    default:
      std::memcpy(p, &f, 4);
  }
}

Received host_dispatch(detail::DispatchState& s, const void* xv, int tokens,
                       const std::int32_t* idx) {
  Communicator& comm = s.comm;
  const int n = comm.size(), me = comm.rank();
  const int E = s.config.num_experts, El = E / n, k = s.config.top_k;
  const std::size_t row = static_cast<std::size_t>(s.config.hidden) * size_of(s.config.type);
  const std::size_t cap = s.shape.capacity;
  const char* x = static_cast<const char*>(xv);
  detail::HostSide& h = s.host;
  // Until this dispatch completes there is no layout for combine to use.
  h.sent.clear();

  // Own histogram plus one "bad input" word, gathered from every rank in one collective.
  std::vector<std::int64_t> mine(E + 1, 0);
  const bool tokens_ok = tokens >= 0 && tokens <= s.config.max_tokens &&
                         (tokens == 0 || (xv != nullptr && idx != nullptr));
  if (!tokens_ok) mine[E] = 1;
  for (int i = 0; tokens_ok && i < tokens * k; ++i) {
    if (idx[i] < -1 || idx[i] >= E)
      mine[E] = 1;
    else if (idx[i] >= 0)
      ++mine[idx[i]];
  }
  std::vector<std::int64_t> all(static_cast<std::size_t>(n) * (E + 1));
  comm.all_gather(mine.data(), all.data(), E + 1, DataType::int64);
  auto cnt = [&](int src, int ex) { return all[static_cast<std::size_t>(src) * (E + 1) + ex]; };
  for (int q = 0; q < n; ++q) {
    if (cnt(q, E) != 0)
      invalid("dispatch: rank " + std::to_string(q) +
              " passed tokens out of [0, max_tokens], a null buffer or an expert id out of "
              "[-1, num_experts)");
  }
  // The device layout: on each rank, experts in order, within an expert source ranks in order,
  // then the source's (token, slot) entries in order.
  std::vector<std::int64_t> seg(E), tot(E), below(E);
  for (int ex = 0; ex < E; ++ex) {
    for (int q = 0; q < n; ++q) {
      tot[ex] += cnt(q, ex);
      if (q < me) below[ex] += cnt(q, ex);
    }
  }
  for (int d = 0; d < n; ++d) {
    std::int64_t run = 0;
    for (int j = 0; j < El; ++j) {
      seg[d * El + j] = run;
      run += tot[d * El + j];
    }
    if (static_cast<std::size_t>(run) > cap)
      invalid("dispatch: rank " + std::to_string(d) + " would receive " + std::to_string(run) +
              " rows, more than its capacity " + std::to_string(cap));
  }
  h.counts.assign(all.size() - n, 0);
  for (int q = 0; q < n; ++q)
    for (int ex = 0; ex < E; ++ex) h.counts[static_cast<std::size_t>(q) * E + ex] = cnt(q, ex);

  // Own entries, by destination in the receiver's row order (experts, then entry order).
  h.tokens = tokens;
  h.dest.assign(static_cast<std::size_t>(tokens) * k, -1);
  h.pos.assign(static_cast<std::size_t>(tokens) * k, -1);
  std::vector<std::vector<std::int32_t>> by_expert(E);
  for (int i = 0; i < tokens * k; ++i) {
    if (idx[i] >= 0) by_expert[idx[i]].push_back(i);
  }
  h.sent.assign(n, {});
  for (int ex = 0; ex < E; ++ex) {
    std::int64_t p = seg[ex] + below[ex];
    for (std::int32_t i : by_expert[ex]) {
      h.dest[i] = ex / El;
      h.pos[i] = static_cast<std::int32_t>(p++);
      h.sent[ex / El].push_back(i);
    }
  }
  // Rows and Row records, packed by destination.
  std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n), msc(n), msd(n), mrc(n), mrd(n);
  std::size_t total_send = 0, total_recv = 0;
  for (int q = 0; q < n; ++q) {
    std::size_t from_q = 0;
    for (int j = 0; j < El; ++j) from_q += static_cast<std::size_t>(cnt(q, me * El + j));
    sc[q] = h.sent[q].size() * row;
    sd[q] = total_send * row;
    rc[q] = from_q * row;
    rd[q] = total_recv * row;
    msc[q] = h.sent[q].size() * 4;
    msd[q] = total_send * 4;
    mrc[q] = from_q * 4;
    mrd[q] = total_recv * 4;
    total_send += h.sent[q].size();
    total_recv += from_q;
  }
  std::vector<char> sbuf(std::max<std::size_t>(1, total_send * row));
  std::vector<Row> smeta(std::max<std::size_t>(1, total_send));
  std::size_t at = 0;
  for (int q = 0; q < n; ++q) {
    for (std::int32_t i : h.sent[q]) {
      std::memcpy(sbuf.data() + at * row, x + static_cast<std::size_t>(i / k) * row, row);
      smeta[at] = Row{me, i / k, i % k, idx[i]};
      ++at;
    }
  }
  std::vector<char> rbuf(std::max<std::size_t>(1, total_recv * row));
  std::vector<Row> rmeta(std::max<std::size_t>(1, total_recv));
  comm.all_to_allv(sbuf.data(), sc, sd, rbuf.data(), rc, rd, DataType::uint8);
  comm.all_to_allv(smeta.data(), msc, msd, rmeta.data(), mrc, mrd, DataType::int32);

  // Into place: from source q, expert by expert, rows in the order q sent them.
  h.x.resize(cap * row);
  h.rows.assign(cap, Row{-1, -1, -1, -1});
  std::size_t got = 0;
  for (int q = 0; q < n; ++q) {
    for (int j = 0; j < El; ++j) {
      const int ex = me * El + j;
      std::int64_t p = seg[ex];
      for (int r = 0; r < q; ++r) p += cnt(r, ex);
      for (std::int64_t c = 0; c < cnt(q, ex); ++c, ++got) {
        std::memcpy(h.x.data() + static_cast<std::size_t>(p + c) * row, rbuf.data() + got * row,
                    row);
        h.rows[static_cast<std::size_t>(p + c)] = rmeta[got];
      }
    }
  }
  h.expert_counts.resize(El);
  h.expert_offsets.resize(El + 1);
  for (int j = 0; j < El; ++j) {
    h.expert_offsets[j] = static_cast<std::int32_t>(seg[me * El + j]);
    h.expert_counts[j] = static_cast<std::int32_t>(tot[me * El + j]);
  }
  h.expert_offsets[El] = static_cast<std::int32_t>(seg[me * El + El - 1] + tot[me * El + El - 1]);
  return Received{h.x.data(), h.rows.data(), h.expert_counts.data(), h.expert_offsets.data(), cap,
                  El,         me * El};
}

void host_combine(detail::DispatchState& s, const void* yv, const float* w, void* outv) {
  Communicator& comm = s.comm;
  const int n = comm.size(), me = comm.rank();
  const int E = s.config.num_experts, El = E / n, k = s.config.top_k;
  const DataType t = s.config.type;
  const std::size_t elt = size_of(t);
  const std::size_t row = static_cast<std::size_t>(s.config.hidden) * elt;
  const detail::HostSide& h = s.host;
  if (h.sent.size() != static_cast<std::size_t>(n)) invalid("combine: no host dispatch before it");
  const char* y = static_cast<const char*>(yv);
  if (h.tokens > 0 && (w == nullptr || outv == nullptr)) invalid("combine: null buffer");
  if (y == nullptr && !h.rows.empty()) invalid("combine: null expert output");
  // Back to each source, in the order it sent them (expert by expert).
  std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
  std::size_t total_send = 0, total_recv = 0;
  std::vector<std::size_t> order;
  for (int q = 0; q < n; ++q) {
    std::size_t from_q = 0;
    for (int j = 0; j < El; ++j) {
      const int ex = me * El + j;
      std::int64_t p = h.expert_offsets[j];
      for (int r = 0; r < q; ++r) p += h.counts[static_cast<std::size_t>(r) * E + ex];
      for (std::int64_t c = 0; c < h.counts[static_cast<std::size_t>(q) * E + ex]; ++c) {
        order.push_back(static_cast<std::size_t>(p + c));
        ++from_q;
      }
    }
    sc[q] = from_q * row;
    sd[q] = total_send * row;
    rc[q] = h.sent[q].size() * row;
    rd[q] = total_recv * row;
    total_send += from_q;
    total_recv += h.sent[q].size();
  }
  std::vector<char> sbuf(std::max<std::size_t>(1, total_send * row));
  for (std::size_t i = 0; i < order.size(); ++i)
    std::memcpy(sbuf.data() + i * row, y + order[i] * row, row);
  std::vector<char> rbuf(std::max<std::size_t>(1, total_recv * row));
  comm.all_to_allv(sbuf.data(), sc, sd, rbuf.data(), rc, rd, DataType::uint8);
  // Where each own entry's expert output is now.
  std::vector<const char*> src(static_cast<std::size_t>(h.tokens) * k, nullptr);
  for (int q = 0, at = 0; q < n; ++q) {
    for (std::int32_t i : h.sent[q]) src[i] = rbuf.data() + static_cast<std::size_t>(at++) * row;
  }
  char* out = static_cast<char*>(outv);
  for (int tok = 0; tok < h.tokens; ++tok) {
    for (int c = 0; c < s.config.hidden; ++c) {
      float acc = 0;
      for (int sl = 0; sl < k; ++sl) {
        const std::size_t i = static_cast<std::size_t>(tok) * k + sl;
        if (h.pos[i] < 0) continue;
        acc = std::fma(w[i], widen(t, src[i] + c * elt), acc);
      }
      narrow(t, acc, out + static_cast<std::size_t>(tok) * row + c * elt);
    }
  }
}

}  // namespace

// ---- AllToAllv ----

AllToAllv::AllToAllv(Communicator comm, std::size_t max_count, DataType type)
    : s_(std::make_unique<detail::A2avState>()) {
  if (!comm) invalid("AllToAllv needs a communicator");
  if (!is_valid(type)) invalid("AllToAllv: unknown data type");
  if (max_count >= (std::size_t{1} << 31)) invalid("AllToAllv: max_count must be below 2^31");
  s_->comm = std::move(comm);
  s_->max_count = max_count;
  s_->type = type;
}
AllToAllv::~AllToAllv() = default;
AllToAllv::AllToAllv(AllToAllv&&) noexcept = default;
AllToAllv& AllToAllv::operator=(AllToAllv&&) noexcept = default;

std::size_t AllToAllv::device_bytes_for(std::size_t max_count, DataType type, int nranks) {
  return kernels::moe::a2av_arena_bytes(max_count, size_of(type), nranks);
}

std::size_t AllToAllv::device_bytes() const {
  return s_ && s_->arena ? detail::arena_bytes(*s_->arena) : 0;
}

void AllToAllv::prepare() {
  if (detail::spans_hosts(s_->comm)) {
    detail::prepare_a2av_net(*s_);
    return;
  }
  arena_of(*s_, kernels::moe::a2av_arena_bytes(s_->max_count, size_of(s_->type), s_->comm.size()));
}

void AllToAllv::run(const void* send, const std::int64_t* sc, const std::int64_t* sd, void* recv,
                    std::int64_t* rc, const std::int64_t* rd, cuda_stream stream) {
  device_a2av(*s_, send, sc, sd, recv, rc, rd, stream);
}
void AllToAllv::run(const void* send, const std::int32_t* sc, const std::int32_t* sd, void* recv,
                    std::int32_t* rc, const std::int32_t* rd, cuda_stream stream) {
  device_a2av(*s_, send, sc, sd, recv, rc, rd, stream);
}
void AllToAllv::run(const void* send, const std::int64_t* sc, const std::int64_t* sd, void* recv,
                    std::int64_t* rc, const std::int64_t* rd) {
  host_a2av(*s_, send, sc, sd, recv, rc, rd);
}
void AllToAllv::run(const void* send, const std::int32_t* sc, const std::int32_t* sd, void* recv,
                    std::int32_t* rc, const std::int32_t* rd) {
  host_a2av(*s_, send, sc, sd, recv, rc, rd);
}

std::error_code AllToAllv::device_status(std::string* what) {
  if (s_ && s_->net_errors) return detail::take_net_errors(*s_, what);
  return s_ && s_->arena ? detail::take_errors(*s_->arena, what) : std::error_code();
}

// ---- Dispatcher ----

Dispatcher::Dispatcher(Communicator comm, const DispatchConfig& config)
    : s_(std::make_unique<detail::DispatchState>()) {
  if (!comm) invalid("Dispatcher needs a communicator");
  s_->shape = shape_of(config, comm.size());
  // Every rank sees the same host table, so all of them choose the same path.
  s_->across_hosts = detail::spans_hosts(comm);
  if (s_->across_hosts)
    s_->net_layout = checked_net_layout(s_->shape);
  else
    s_->layout = checked_layout(s_->shape);
  s_->comm = std::move(comm);
  s_->config = config;
}
Dispatcher::~Dispatcher() = default;
Dispatcher::Dispatcher(Dispatcher&&) noexcept = default;
Dispatcher& Dispatcher::operator=(Dispatcher&&) noexcept = default;

std::size_t Dispatcher::device_bytes_for(const DispatchConfig& config, int nranks,
                                         bool across_hosts) {
  const kernels::moe::MoeShape shape = shape_of(config, nranks);
  return across_hosts ? checked_net_layout(shape).total : checked_layout(shape).total;
}

std::size_t Dispatcher::device_bytes() const {
  if (!s_) return 0;
  if (s_->net) return detail::net_dispatch_bytes(*s_->net);
  return s_->arena ? detail::arena_bytes(*s_->arena) : 0;
}

std::size_t Dispatcher::capacity() const { return s_->shape.capacity; }

void Dispatcher::prepare() { prepare_device_side(*s_); }

Received Dispatcher::dispatch(const void* x, int tokens, const std::int32_t* topk_idx,
                              cuda_stream stream) {
  detail::DispatchState& s = *s_;
  if (tokens < 0 || tokens > s.config.max_tokens)
    invalid("dispatch: tokens " + std::to_string(tokens) + " out of [0, max_tokens]");
  if (tokens > 0 && (x == nullptr || topk_idx == nullptr)) invalid("dispatch: null buffer");
  if (reinterpret_cast<std::uintptr_t>(x) % 16 != 0) invalid("dispatch: x must be 16-byte aligned");
  prepare_device_side(s);
  const int El = s.config.num_experts / s.comm.size();
  if (s.across_hosts) {
    detail::net_dispatch(*s.net, s.comm, x, tokens, topk_idx, stream);
    s.device_tokens = tokens;
    char* base = detail::net_dispatch_base(*s.net);
    const kernels::moe::NetMoeLayout& L = s.net_layout;
    return Received{base + L.x,
                    reinterpret_cast<const Row*>(base + L.rows),
                    reinterpret_cast<const std::int32_t*>(base + L.expert_counts),
                    reinterpret_cast<const std::int32_t*>(base + L.expert_offsets),
                    s.shape.capacity,
                    El,
                    s.comm.rank() * El};
  }
  auto& a = *s.arena;
  detail::launch_dispatch(a, s.shape, x, tokens, topk_idx, stream);
  s.device_tokens = tokens;
  char* base = detail::arena_base(a);
  return Received{base + s.layout.recv,
                  reinterpret_cast<const Row*>(base + s.layout.rows),
                  reinterpret_cast<const std::int32_t*>(base + s.layout.expert_counts),
                  reinterpret_cast<const std::int32_t*>(base + s.layout.expert_offsets),
                  s.shape.capacity,
                  El,
                  s.comm.rank() * El};
}

void Dispatcher::combine(const void* y, const float* weights, void* out, cuda_stream stream) {
  detail::DispatchState& s = *s_;
  if (!s.arena && !s.net) invalid("combine: no device dispatch before it");
  if (y == nullptr || reinterpret_cast<std::uintptr_t>(y) % 16 != 0)
    invalid("combine: y must be a 16-byte aligned device buffer");
  if (s.device_tokens > 0 &&
      (weights == nullptr || out == nullptr || reinterpret_cast<std::uintptr_t>(out) % 16 != 0))
    invalid("combine: null weights or out, or out not 16-byte aligned");
  if (s.net)
    detail::net_combine(*s.net, s.comm, y, weights, out, s.device_tokens, stream);
  else
    detail::launch_combine(*s.arena, s.shape, y, weights, out, s.device_tokens, stream);
}

Received Dispatcher::dispatch(const void* x, int tokens, const std::int32_t* topk_idx) {
  return host_dispatch(*s_, x, tokens, topk_idx);
}

void Dispatcher::combine(const void* y, const float* weights, void* out) {
  host_combine(*s_, y, weights, out);
}

std::error_code Dispatcher::device_status(std::string* what) {
  if (s_ && s_->net) return detail::take_net_dispatch_errors(*s_->net, s_->comm, what);
  return s_ && s_->arena ? detail::take_errors(*s_->arena, what) : std::error_code();
}

}  // namespace coccl::moe
