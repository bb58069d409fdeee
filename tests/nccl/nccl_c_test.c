/* The NCCL C API of coccl, exercised as an NCCL program would: C, nccl.h only, one process per
 * rank. Usage: nccl_c_test NRANKS.
 *
 * Built twice from this file: with host buffers (the coccl extension that makes the API usable on
 * machines without GPUs), and with COCCL_TEST_GPU defined, where every buffer is device memory,
 * rank r drives GPU r, and the test exits with 77 (skipped) unless NRANKS GPUs are present.
 *
 * The parent forks the ranks before touching the library; rank 0 makes the unique id and hands
 * it to the others through pipes. Each check that fails prints the rank and what differed; the
 * exit code is 0 when every rank passed, 77 when the ranks skipped, else 1. */
#include <errno.h>
#include <math.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { skip_code = 77 };

static int rank_, nranks_;
static int failures_;
static cudaStream_t stream_;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "rank %d: %s:%d: ", rank_, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
      ++failures_;                                                    \
    }                                                                 \
  } while (0)

/* Expects `call` to return `want`. */
#define EXPECT_RESULT(call, want)                                                               \
  do {                                                                                          \
    ncclResult_t got_ = (call);                                                                 \
    CHECK(got_ == (want), "%s returned %d (%s), expected %d; last error: %s", #call, (int)got_, \
          ncclGetErrorString(got_), (int)(want), ncclGetLastError(NULL));                       \
  } while (0)

/* A call that must succeed; the rank gives up on failure (later checks would only cascade). */
#define MUST(call)                                                                              \
  do {                                                                                          \
    ncclResult_t got_ = (call);                                                                 \
    if (got_ != ncclSuccess) {                                                                  \
      fprintf(stderr, "rank %d: %s:%d: %s failed: %s (%s)\n", rank_, __FILE__, __LINE__, #call, \
              ncclGetErrorString(got_), ncclGetLastError(NULL));                                \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

/* ---- Buffers: host memory, or device memory in the GPU build ---- */

#ifdef COCCL_TEST_GPU
static void* buf_alloc(size_t bytes) {
  void* p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
    fprintf(stderr, "rank %d: cudaMalloc failed\n", rank_);
    exit(1);
  }
  return p;
}
static void buf_free(void* p) { cudaFree(p); }
static void buf_put(void* dst, const void* src, size_t bytes) {
  cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
}
static void buf_get(void* dst, const void* src, size_t bytes) {
  cudaStreamSynchronize(stream_);
  cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
}
#else
static void* buf_alloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }
static void buf_free(void* p) { free(p); }
static void buf_put(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static void buf_get(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
#endif

/* ---- Typed elements as doubles (the values used are small integers, exact in every type) ---- */

static const ncclDataType_t types_[] = {ncclInt8,  ncclUint8,  ncclInt32,   ncclUint32,
                                        ncclInt64, ncclUint64, ncclFloat32, ncclFloat64};
enum { ntypes_ = sizeof(types_) / sizeof(types_[0]) };

static size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

static int is_float(ncclDataType_t t) { return t == ncclFloat32 || t == ncclFloat64; }

static void set_elem(void* b, ncclDataType_t t, size_t i, double v) {
  switch (t) {
    case ncclInt8:
      ((int8_t*)b)[i] = (int8_t)v;
      break;
    case ncclUint8:
      ((uint8_t*)b)[i] = (uint8_t)v;
      break;
    case ncclInt32:
      ((int32_t*)b)[i] = (int32_t)v;
      break;
    case ncclUint32:
      ((uint32_t*)b)[i] = (uint32_t)v;
      break;
    case ncclInt64:
      ((int64_t*)b)[i] = (int64_t)v;
      break;
    case ncclUint64:
      ((uint64_t*)b)[i] = (uint64_t)v;
      break;
    case ncclFloat32:
      ((float*)b)[i] = (float)v;
      break;
    default:
      ((double*)b)[i] = v;
      break;
  }
}

static double get_elem(const void* b, ncclDataType_t t, size_t i) {
  switch (t) {
    case ncclInt8:
      return ((const int8_t*)b)[i];
    case ncclUint8:
      return ((const uint8_t*)b)[i];
    case ncclInt32:
      return ((const int32_t*)b)[i];
    case ncclUint32:
      return ((const uint32_t*)b)[i];
    case ncclInt64:
      return (double)((const int64_t*)b)[i];
    case ncclUint64:
      return (double)((const uint64_t*)b)[i];
    case ncclFloat32:
      return ((const float*)b)[i];
    default:
      return ((const double*)b)[i];
  }
}

/* The value rank r contributes at index i: 1..5, so products over 3 ranks fit in int8. */
static double value(int r, size_t i) { return (double)((r * 3 + i) % 5 + 1); }

static double reduce_ref(ncclRedOp_t op, ncclDataType_t t, size_t i) {
  double acc = value(0, i);
  for (int r = 1; r < nranks_; ++r) {
    double v = value(r, i);
    switch (op) {
      case ncclProd:
        acc *= v;
        break;
      case ncclMax:
        acc = v > acc ? v : acc;
        break;
      case ncclMin:
        acc = v < acc ? v : acc;
        break;
      default:
        acc += v;
        break;
    }
  }
  if (op == ncclAvg) acc = is_float(t) ? acc / nranks_ : floor(acc / nranks_);
  return acc;
}

static int close_enough(double got, double want, ncclDataType_t t) {
  if (!is_float(t)) return got == want;
  return fabs(got - want) <= 1e-6 * fabs(want);
}

/* Fills a host staging buffer with rank r's values at indices [offset, offset+count) and
 * uploads it to `dev` at element `at`. */
static void fill(void* dev, ncclDataType_t t, size_t at, size_t count, int r, size_t offset) {
  size_t es = type_size(t);
  unsigned char* h = malloc(count * es + 1);
  for (size_t i = 0; i < count; ++i) set_elem(h, t, i, value(r, offset + i));
  buf_put((unsigned char*)dev + at * es, h, count * es);
  free(h);
}

static void* download(const void* dev, size_t bytes) {
  void* h = malloc(bytes + 1);
  buf_get(h, dev, bytes);
  return h;
}

/* ---- Collectives against their reference ---- */

static const size_t counts_[] = {1, 1027, 20000};
enum { ncounts_ = sizeof(counts_) / sizeof(counts_[0]) };

static void test_all_reduce(ncclComm_t comm, ncclDataType_t t, size_t n, int in_place) {
  static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  size_t es = type_size(t);
  for (int o = 0; o < 5; ++o) {
    void* send = buf_alloc(n * es);
    void* recv = in_place ? send : buf_alloc(n * es);
    fill(send, t, 0, n, rank_, 0);
    MUST(ncclAllReduce(send, recv, n, t, ops[o], comm, stream_));
    unsigned char* h = download(recv, n * es);
    for (size_t i = 0; i < n; ++i) {
      double want = reduce_ref(ops[o], t, i);
      if (!close_enough(get_elem(h, t, i), want, t)) {
        CHECK(0, "all_reduce type %d op %d count %zu%s: [%zu] = %g, expected %g", t, ops[o], n,
              in_place ? " in place" : "", i, get_elem(h, t, i), want);
        break;
      }
    }
    free(h);
    if (!in_place) buf_free(recv);
    buf_free(send);
  }
}

static void test_broadcast(ncclComm_t comm, ncclDataType_t t, size_t n, int in_place) {
  size_t es = type_size(t);
  int root = nranks_ - 1;
  void* send = buf_alloc(n * es);
  void* recv = in_place ? send : buf_alloc(n * es);
  fill(send, t, 0, n, rank_, 0);
  if (in_place)
    MUST(ncclBcast(send, n, t, root, comm, stream_));
  else
    MUST(ncclBroadcast(send, recv, n, t, root, comm, stream_));
  unsigned char* h = download(recv, n * es);
  for (size_t i = 0; i < n; ++i)
    if (get_elem(h, t, i) != value(root, i)) {
      CHECK(0, "broadcast type %d count %zu: [%zu] = %g, expected %g", t, n, i, get_elem(h, t, i),
            value(root, i));
      break;
    }
  free(h);
  if (!in_place) buf_free(recv);
  buf_free(send);
}

static void test_reduce(ncclComm_t comm, ncclDataType_t t, size_t n) {
  size_t es = type_size(t);
  int root = 0;
  void* send = buf_alloc(n * es);
  void* recv = buf_alloc(n * es);
  fill(send, t, 0, n, rank_, 0);
  MUST(ncclReduce(send, rank_ == root ? recv : NULL, n, t, ncclMax, root, comm, stream_));
  if (rank_ == root) {
    unsigned char* h = download(recv, n * es);
    for (size_t i = 0; i < n; ++i)
      if (get_elem(h, t, i) != reduce_ref(ncclMax, t, i)) {
        CHECK(0, "reduce type %d count %zu: [%zu] = %g, expected %g", t, n, i, get_elem(h, t, i),
              reduce_ref(ncclMax, t, i));
        break;
      }
    free(h);
  }
  buf_free(recv);
  buf_free(send);
}

static void test_all_gather(ncclComm_t comm, ncclDataType_t t, size_t n, int in_place) {
  size_t es = type_size(t);
  void* recv = buf_alloc(n * nranks_ * es);
  void* send = in_place ? (unsigned char*)recv + rank_ * n * es : buf_alloc(n * es);
  fill(send, t, 0, n, rank_, 0);
  MUST(ncclAllGather(send, recv, n, t, comm, stream_));
  unsigned char* h = download(recv, n * nranks_ * es);
  for (int r = 0; r < nranks_; ++r)
    for (size_t i = 0; i < n; ++i)
      if (get_elem(h, t, r * n + i) != value(r, i)) {
        CHECK(0, "all_gather type %d count %zu: block %d [%zu] = %g, expected %g", t, n, r, i,
              get_elem(h, t, r * n + i), value(r, i));
        r = nranks_;
        break;
      }
  free(h);
  if (!in_place) buf_free(send);
  buf_free(recv);
}

static void test_reduce_scatter(ncclComm_t comm, ncclDataType_t t, size_t n, int in_place) {
  size_t es = type_size(t);
  void* send = buf_alloc(n * nranks_ * es);
  void* recv = in_place ? (unsigned char*)send + rank_ * n * es : buf_alloc(n * es);
  fill(send, t, 0, n * nranks_, rank_, 0);
  MUST(ncclReduceScatter(send, recv, n, t, ncclSum, comm, stream_));
  unsigned char* h = download(recv, n * es);
  for (size_t i = 0; i < n; ++i) {
    double want = reduce_ref(ncclSum, t, rank_ * n + i);
    if (get_elem(h, t, i) != want) {
      CHECK(0, "reduce_scatter type %d count %zu: [%zu] = %g, expected %g", t, n, i,
            get_elem(h, t, i), want);
      break;
    }
  }
  free(h);
  if (!in_place) buf_free(recv);
  buf_free(send);
}

/* Rank r's block for peer p in all-to-all tests: value(r * nranks + p, i). */
static void test_all_to_all(ncclComm_t comm, ncclDataType_t t, size_t n, int in_place) {
  size_t es = type_size(t);
  void* send = buf_alloc(n * nranks_ * es);
  void* recv = in_place ? send : buf_alloc(n * nranks_ * es);
  for (int p = 0; p < nranks_; ++p) fill(send, t, p * n, n, rank_ * nranks_ + p, 0);
  MUST(ncclAlltoAll(send, recv, n, t, comm, stream_));
  unsigned char* h = download(recv, n * nranks_ * es);
  for (int p = 0; p < nranks_; ++p)
    for (size_t i = 0; i < n; ++i)
      if (get_elem(h, t, p * n + i) != value(p * nranks_ + rank_, i)) {
        CHECK(0, "all_to_all type %d count %zu%s: from %d [%zu] = %g, expected %g", t, n,
              in_place ? " in place" : "", p, i, get_elem(h, t, p * n + i),
              value(p * nranks_ + rank_, i));
        p = nranks_;
        break;
      }
  free(h);
  if (!in_place) buf_free(recv);
  buf_free(send);
}

static void test_gather_scatter(ncclComm_t comm, ncclDataType_t t, size_t n) {
  size_t es = type_size(t);
  int root = 1 % nranks_;
  void* small = buf_alloc(n * es);
  void* big = buf_alloc(n * nranks_ * es);
  fill(small, t, 0, n, rank_, 0);
  MUST(ncclGather(small, rank_ == root ? big : NULL, n, t, root, comm, stream_));
  if (rank_ == root) {
    unsigned char* h = download(big, n * nranks_ * es);
    for (int r = 0; r < nranks_; ++r)
      for (size_t i = 0; i < n; ++i)
        if (get_elem(h, t, r * n + i) != value(r, i)) {
          CHECK(0, "gather type %d count %zu: block %d [%zu] = %g, expected %g", t, n, r, i,
                get_elem(h, t, r * n + i), value(r, i));
          r = nranks_;
          break;
        }
    free(h);
  }
  /* Scatter from root: rank r receives the values of "rank" 10 + r. */
  if (rank_ == root)
    for (int r = 0; r < nranks_; ++r) fill(big, t, r * n, n, 10 + r, 0);
  MUST(ncclScatter(rank_ == root ? big : NULL, small, n, t, root, comm, stream_));
  unsigned char* h = download(small, n * es);
  for (size_t i = 0; i < n; ++i)
    if (get_elem(h, t, i) != value(10 + rank_, i)) {
      CHECK(0, "scatter type %d count %zu: [%zu] = %g, expected %g", t, n, i, get_elem(h, t, i),
            value(10 + rank_, i));
      break;
    }
  free(h);
  buf_free(big);
  buf_free(small);
}

/* A ring shift by send/recv in a group: rank r receives rank r-1's values. */
static void test_send_recv(ncclComm_t comm, ncclDataType_t t, size_t n) {
  size_t es = type_size(t);
  int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
  void* send = buf_alloc(n * es);
  void* recv = buf_alloc(n * es);
  fill(send, t, 0, n, rank_, 0);
  MUST(ncclGroupStart());
  MUST(ncclSend(send, n, t, next, comm, stream_));
  MUST(ncclRecv(recv, n, t, prev, comm, stream_));
  MUST(ncclGroupEnd());
  unsigned char* h = download(recv, n * es);
  for (size_t i = 0; i < n; ++i)
    if (get_elem(h, t, i) != value(prev, i)) {
      CHECK(0, "send/recv type %d count %zu: [%zu] = %g, expected %g", t, n, i, get_elem(h, t, i),
            value(prev, i));
      break;
    }
  free(h);
  buf_free(recv);
  buf_free(send);
}

static void test_collectives(ncclComm_t comm) {
  for (int ti = 0; ti < ntypes_; ++ti) {
    ncclDataType_t t = types_[ti];
    for (int ci = 0; ci < ncounts_; ++ci) {
      size_t n = counts_[ci];
      test_all_reduce(comm, t, n, 0);
      test_all_reduce(comm, t, n, 1);
      test_broadcast(comm, t, n, 0);
      test_broadcast(comm, t, n, 1);
      test_reduce(comm, t, n);
      test_all_gather(comm, t, n, 0);
      test_all_gather(comm, t, n, 1);
      test_reduce_scatter(comm, t, n, 0);
      test_reduce_scatter(comm, t, n, 1);
      test_all_to_all(comm, t, n, 0);
      test_all_to_all(comm, t, n, 1);
      test_gather_scatter(comm, t, n);
      test_send_recv(comm, t, n);
    }
  }
  /* No elements: nothing moves, every call succeeds, NULL buffers included. */
  MUST(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comm, stream_));
  MUST(ncclAllGather(NULL, NULL, 0, ncclFloat, comm, stream_));
  MUST(ncclSend(NULL, 0, ncclFloat, (rank_ + 1) % nranks_, comm, stream_));
}

/* ---- Groups: collectives and sends/receives of one launch, all checked ---- */

static void test_group_mix(ncclComm_t comm) {
  const size_t n = 513;
  const ncclDataType_t t = ncclInt32;
  int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
  void* ar = buf_alloc(n * 4);
  void* ag = buf_alloc(n * nranks_ * 4);
  void* s = buf_alloc(n * 4);
  void* r = buf_alloc(n * 4);
  void* bc = buf_alloc(n * 4);
  fill(ar, t, 0, n, rank_, 0);
  fill(s, t, 0, n, rank_ + 20, 0);
  fill(bc, t, 0, n, rank_ + 40, 0);
  MUST(ncclGroupStart());
  MUST(ncclRecv(r, n, t, prev, comm, stream_)); /* a receive first: order must not matter */
  MUST(ncclAllReduce(ar, ar, n, t, ncclSum, comm, stream_));
  MUST(ncclGroupStart()); /* nested: only the outermost end runs the group */
  MUST(ncclAllGather(s, ag, n, t, comm, stream_));
  MUST(ncclSend(s, n, t, next, comm, stream_));
  MUST(ncclGroupEnd());
  MUST(ncclBroadcast(bc, bc, n, t, 0, comm, stream_));
  MUST(ncclGroupEnd());
  int32_t* h_ar = download(ar, n * 4);
  int32_t* h_ag = download(ag, n * nranks_ * 4);
  int32_t* h_r = download(r, n * 4);
  int32_t* h_bc = download(bc, n * 4);
  for (size_t i = 0; i < n; ++i) {
    CHECK(h_ar[i] == reduce_ref(ncclSum, t, i), "group all_reduce [%zu] = %d", i, h_ar[i]);
    CHECK(h_r[i] == value(prev + 20, i), "group recv [%zu] = %d", i, h_r[i]);
    CHECK(h_bc[i] == value(40, i), "group broadcast [%zu] = %d", i, h_bc[i]);
    for (int q = 0; q < nranks_; ++q)
      CHECK(h_ag[q * n + i] == value(q + 20, i), "group all_gather %d [%zu] = %d", q, i,
            h_ag[q * n + i]);
    if (failures_) break;
  }
  free(h_ar);
  free(h_ag);
  free(h_r);
  free(h_bc);
  buf_free(ar);
  buf_free(ag);
  buf_free(s);
  buf_free(r);
  buf_free(bc);
}

/* ---- PreMulSum: result = sum over ranks of scalar_r * x_r ---- */

static void test_premulsum(ncclComm_t comm) {
  const size_t n = 1000;
  /* float with a host scalar, read at creation. */
  {
    float scalar = (float)(rank_ + 1);
    ncclRedOp_t op;
    MUST(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
    scalar = 100.0f; /* must not matter any more */
    void* send = buf_alloc(n * 4);
    void* recv = buf_alloc(n * 4);
    fill(send, ncclFloat32, 0, n, rank_, 0);
    MUST(ncclAllReduce(send, recv, n, ncclFloat32, op, comm, stream_));
    float* h = download(recv, n * 4);
    for (size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int r = 0; r < nranks_; ++r) want += (r + 1) * value(r, i);
      if (h[i] != want) {
        CHECK(0, "premulsum all_reduce [%zu] = %g, expected %g", i, h[i], want);
        break;
      }
    }
    free(h);
    /* The input is unchanged (the multiply happens on a copy). */
    float* in = download(send, n * 4);
    CHECK(in[0] == value(rank_, 0), "premulsum changed the send buffer: %g", in[0]);
    free(in);
    /* Destroying the operator right after the call, before the group runs, is allowed. */
    fill(recv, ncclFloat32, 0, n, 99, 0);
    MUST(ncclGroupStart());
    MUST(ncclAllReduce(send, recv, n, ncclFloat32, op, comm, stream_));
    MUST(ncclRedOpDestroy(op, comm));
    MUST(ncclGroupEnd());
    h = download(recv, n * 4);
    double want0 = 0;
    for (int r = 0; r < nranks_; ++r) want0 += (r + 1) * value(r, 0);
    CHECK(h[0] == want0, "premulsum destroyed inside the group: [0] = %g, expected %g", h[0],
          want0);
    free(h);
    EXPECT_RESULT(ncclAllReduce(send, recv, n, ncclFloat32, op, comm, stream_),
                  ncclInvalidArgument);
    buf_free(recv);
    buf_free(send);
  }
  /* int32 reduce_scatter with a scalar read at each use (device memory in the GPU build). */
  {
    int32_t scalar = 2 * rank_ + 1;
    void* dscalar = buf_alloc(4);
    buf_put(dscalar, &scalar, 4);
    ncclRedOp_t op;
    MUST(ncclRedOpCreatePreMulSum(&op, dscalar, ncclInt32, ncclScalarDevice, comm));
    void* send = buf_alloc(n * nranks_ * 4);
    void* recv = buf_alloc(n * 4);
    fill(send, ncclInt32, 0, n * nranks_, rank_, 0);
    MUST(ncclReduceScatter(send, recv, n, ncclInt32, op, comm, stream_));
    int32_t* h = download(recv, n * 4);
    for (size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int r = 0; r < nranks_; ++r) want += (2 * r + 1) * value(r, rank_ * n + i);
      if (h[i] != want) {
        CHECK(0, "premulsum reduce_scatter [%zu] = %d, expected %g", i, h[i], want);
        break;
      }
    }
    free(h);
    /* A new scalar value is seen by the next collective. */
    scalar = 3;
    buf_put(dscalar, &scalar, 4);
    MUST(ncclReduce(send, rank_ == 0 ? recv : NULL, n, ncclInt32, op, 0, comm, stream_));
    if (rank_ == 0) {
      int32_t* g = download(recv, n * 4);
      double want = 0;
      for (int r = 0; r < nranks_; ++r) want += 3 * value(r, 0);
      CHECK(g[0] == want, "premulsum reduce [0] = %d, expected %g", g[0], want);
      free(g);
    }
    EXPECT_RESULT(ncclAllReduce(send, recv, n, ncclFloat32, op, comm, stream_),
                  ncclInvalidArgument); /* made for int32 */
    MUST(ncclRedOpDestroy(op, comm));
    buf_free(recv);
    buf_free(send);
    buf_free(dscalar);
  }
}

/* ---- Argument errors: a clear result code and a message, nothing run ---- */

static void expect_message(const char* what) {
  const char* m = ncclGetLastError(NULL);
  CHECK(m && m[0] != '\0', "no ncclGetLastError message after %s", what);
}

/* The last error names the call and contains `needle` (the reason). */
static void expect_message_has(const char* call, const char* needle) {
  const char* m = ncclGetLastError(NULL);
  CHECK(m && strstr(m, call) && strstr(m, needle),
        "ncclGetLastError is \"%s\", expected %s with \"%s\"", m ? m : "(null)", call, needle);
}

/* Counts whose byte size overflows are refused before any buffer is sized from them: a
   PreMulSum all_reduce and an in-place all_to_all stage a copy of the input. */
static void test_count_overflow(ncclComm_t comm) {
  void* b = buf_alloc(64);
  float scalar = 2.0f;
  ncclRedOp_t op;
  MUST(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
  EXPECT_RESULT(ncclAllReduce(b, b, SIZE_MAX, ncclFloat32, op, comm, stream_), ncclInvalidArgument);
  expect_message_has("ncclAllReduce", "overflows");
  MUST(ncclRedOpDestroy(op, comm));
  EXPECT_RESULT(ncclAlltoAll(b, b, SIZE_MAX, ncclFloat32, comm, stream_), ncclInvalidArgument);
  expect_message_has("ncclAlltoAll", "overflows");
  EXPECT_RESULT(ncclAllReduce(b, b, SIZE_MAX / 2, ncclFloat32, ncclSum, comm, stream_),
                ncclInvalidArgument);
  expect_message_has("ncclAllReduce", "overflows");
  EXPECT_RESULT(ncclBroadcast(b, b, 4, ncclFloat, nranks_ + 5, comm, stream_), ncclInvalidArgument);
  expect_message_has("ncclBroadcast", "out of range");
  buf_free(b);
}

static void test_errors(ncclComm_t comm) {
  void* b = buf_alloc(64);
  EXPECT_RESULT(ncclAllReduce(b, b, 4, (ncclDataType_t)99, ncclSum, comm, stream_),
                ncclInvalidArgument);
  expect_message("a bad datatype");
  EXPECT_RESULT(ncclAllReduce(b, b, 4, ncclFloat, (ncclRedOp_t)77, comm, stream_),
                ncclInvalidArgument);
  EXPECT_RESULT(ncclAllReduce(NULL, b, 4, ncclFloat, ncclSum, comm, stream_), ncclInvalidArgument);
  EXPECT_RESULT(ncclAllReduce(b, b, 4, ncclFloat, ncclSum, NULL, stream_), ncclInvalidArgument);
  EXPECT_RESULT(ncclBroadcast(b, b, 4, ncclFloat, nranks_, comm, stream_), ncclInvalidArgument);
  EXPECT_RESULT(ncclReduce(b, b, 4, ncclFloat, ncclSum, -1, comm, stream_), ncclInvalidArgument);
  EXPECT_RESULT(ncclSend(b, 4, ncclFloat, nranks_, comm, stream_), ncclInvalidArgument);
  EXPECT_RESULT(ncclRecv(b, 4, ncclFloat, -1, comm, stream_), ncclInvalidArgument);
  /* A send to self without its receive: refused by the layer below the argument checks. */
  EXPECT_RESULT(ncclSend(b, 4, ncclFloat, rank_, comm, stream_), ncclInvalidArgument);
  EXPECT_RESULT(ncclCommCount(comm, NULL), ncclInvalidArgument);
  EXPECT_RESULT(ncclCommCount(NULL, NULL), ncclInvalidArgument);
  EXPECT_RESULT(ncclGetVersion(NULL), ncclInvalidArgument);
  EXPECT_RESULT(ncclGroupEnd(), ncclInvalidUsage);
  expect_message("ncclGroupEnd without ncclGroupStart");
  EXPECT_RESULT(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument);
  EXPECT_RESULT(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclInvalidUsage);
  EXPECT_RESULT(ncclCommDeregister(comm, b), ncclInvalidArgument);
  {
    ncclComm_t bad = NULL;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    EXPECT_RESULT(ncclCommInitRank(&bad, 2, id, 5), ncclInvalidArgument);
    EXPECT_RESULT(ncclCommInitRank(&bad, 0, id, 0), ncclInvalidArgument);
    ncclConfig_t config; /* not from NCCL_CONFIG_INITIALIZER */
    memset(&config, 0, sizeof config);
    EXPECT_RESULT(ncclCommInitRankConfig(&bad, 2, id, 0, &config), ncclInvalidArgument);
  }
  /* A group with a bad call runs none of its calls and reports the failure at its end. */
  MUST(ncclGroupStart());
  EXPECT_RESULT(ncclAllReduce(b, b, 4, (ncclDataType_t)99, ncclSum, comm, stream_),
                ncclInvalidArgument);
  EXPECT_RESULT(ncclGroupEnd(), ncclInvalidArgument);
  /* The communicator is still usable after argument errors. */
  ncclResult_t async_error = ncclInternalError;
  MUST(ncclCommGetAsyncError(comm, &async_error));
  CHECK(async_error == ncclSuccess, "ncclCommGetAsyncError after argument errors: %d", async_error);
  buf_free(b);
}

static void test_error_strings(void) {
  CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "ncclSuccess: %s",
        ncclGetErrorString(ncclSuccess));
  for (int r = ncclUnhandledCudaError; r < ncclNumResults; ++r) {
    const char* s = ncclGetErrorString((ncclResult_t)r);
    CHECK(s && strlen(s) > 0 && strcmp(s, ncclGetErrorString(ncclSuccess)) != 0,
          "no description of result %d", r);
  }
  int v = 0;
  MUST(ncclGetVersion(&v));
  CHECK(v == NCCL_VERSION_CODE && v == NCCL_VERSION(2, 28, 9), "version %d", v);
}

/* ---- Queries, registration, memory ---- */

static void test_queries(ncclComm_t comm) {
  int count = -1, rank = -1, device = -2;
  MUST(ncclCommCount(comm, &count));
  MUST(ncclCommUserRank(comm, &rank));
  MUST(ncclCommCuDevice(comm, &device));
  CHECK(count == nranks_, "ncclCommCount %d", count);
  CHECK(rank == rank_, "ncclCommUserRank %d", rank);
#ifdef COCCL_TEST_GPU
  CHECK(device == rank_, "ncclCommCuDevice %d", device);
#endif
  void* p = NULL;
  MUST(ncclMemAlloc(&p, 4096));
  CHECK(p != NULL, "ncclMemAlloc gave NULL");
  void* handle = NULL;
  MUST(ncclCommRegister(comm, p, 4096, &handle));
  ncclWindow_t win = NULL;
  MUST(ncclCommWindowRegister(comm, p, 4096, &win, NCCL_WIN_COLL_SYMMETRIC));
  /* Memory from ncclMemAlloc works as a collective buffer. */
  fill(p, ncclInt32, 0, 1024, rank_, 0);
  MUST(ncclAllReduce(p, p, 1024, ncclInt32, ncclSum, comm, stream_));
  int32_t* h = download(p, 4096);
  CHECK(h[5] == reduce_ref(ncclSum, ncclInt32, 5), "all_reduce on ncclMemAlloc memory: %d", h[5]);
  free(h);
  MUST(ncclCommWindowDeregister(comm, win));
  MUST(ncclCommDeregister(comm, handle));
  EXPECT_RESULT(ncclCommDeregister(comm, handle), ncclInvalidArgument);
  MUST(ncclMemFree(p));
}

/* ---- Communicators made from communicators ---- */

/* Shares a new unique id made by rank 0 over `comm` (a host-memory broadcast). */
static ncclUniqueId share_id(ncclComm_t comm) {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (rank_ == 0) MUST(ncclGetUniqueId(&id));
  MUST(ncclBroadcast(&id, &id, sizeof id, ncclUint8, 0, comm, NULL));
  return id;
}

/* Sum over the ranks of `c` of (parent rank + 1), by all_reduce on the new communicator. */
static int32_t member_sum(ncclComm_t c) {
  void* b = buf_alloc(4);
  int32_t mine = rank_ + 1, got = -1;
  buf_put(b, &mine, 4);
  MUST(ncclAllReduce(b, b, 1, ncclInt32, ncclSum, c, stream_));
  buf_get(&got, b, 4);
  buf_free(b);
  return got;
}

static void test_nonblocking_init(ncclComm_t comm) {
  ncclUniqueId id = share_id(comm);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t nb = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&nb, nranks_, id, rank_, &config);
  CHECK(r == ncclInProgress || r == ncclSuccess, "nonblocking init returned %d", r);
  ncclResult_t state = ncclInProgress;
  do {
    MUST(ncclCommGetAsyncError(nb, &state));
  } while (state == ncclInProgress);
  CHECK(state == ncclSuccess, "nonblocking init ended with %d: %s", state, ncclGetLastError(nb));
  int32_t want = nranks_ * (nranks_ + 1) / 2;
  CHECK(member_sum(nb) == want, "all_reduce on the nonblocking communicator");
  MUST(ncclCommFinalize(nb));
  MUST(ncclCommDestroy(nb));
}

static void test_split(ncclComm_t comm) {
  /* Even and odd ranks, in reverse order; with 3 or more ranks the last one joins none. */
  int none = nranks_ >= 3 && rank_ == nranks_ - 1;
  ncclComm_t sub = NULL;
  MUST(ncclCommSplit(comm, none ? NCCL_SPLIT_NOCOLOR : rank_ % 2, -rank_, &sub, NULL));
  if (none) {
    CHECK(sub == NULL, "NCCL_SPLIT_NOCOLOR gave a communicator");
    return;
  }
  int members = 0, expected_rank = 0;
  int32_t want = 0;
  for (int r = 0; r < nranks_; ++r) {
    if (r % 2 != rank_ % 2 || (nranks_ >= 3 && r == nranks_ - 1)) continue;
    ++members;
    want += r + 1;
    if (r > rank_) ++expected_rank;
  }
  int count = -1, rank = -1;
  MUST(ncclCommCount(sub, &count));
  MUST(ncclCommUserRank(sub, &rank));
  CHECK(count == members, "split: %d ranks, expected %d", count, members);
  CHECK(rank == expected_rank, "split: rank %d, expected %d (keys order it)", rank, expected_rank);
  CHECK(member_sum(sub) == want, "split: all_reduce over the members");
  MUST(ncclCommDestroy(sub));
}

static void test_shrink(ncclComm_t comm) {
  if (nranks_ < 3) return;
  /* Rank 1 is left out and does not call. */
  if (rank_ == 1) return;
  int excluded[1] = {1};
  ncclComm_t small = NULL;
  MUST(ncclCommShrink(comm, excluded, 1, &small, NULL, NCCL_SHRINK_DEFAULT));
  int count = -1, rank = -1;
  MUST(ncclCommCount(small, &count));
  MUST(ncclCommUserRank(small, &rank));
  CHECK(count == nranks_ - 1, "shrink: %d ranks", count);
  CHECK(rank == (rank_ == 0 ? 0 : rank_ - 1), "shrink: rank %d", rank);
  CHECK(member_sum(small) == nranks_ * (nranks_ + 1) / 2 - 2, "shrink: all_reduce");
  MUST(ncclCommDestroy(small));
}

/* One process drives every rank of a communicator: a group over all of them must not
 * deadlock. */
static void test_init_all(void) {
  enum { ndev = 2 };
  ncclComm_t comms[ndev];
  int devs[ndev] = {0, 1};
  MUST(ncclCommInitAll(comms, ndev, devs));
  const size_t n = 3000;
  void* bufs[ndev];
  cudaStream_t streams[ndev];
  for (int d = 0; d < ndev; ++d) {
#ifdef COCCL_TEST_GPU
    cudaSetDevice(d);
    cudaStreamCreate(&streams[d]);
#else
    streams[d] = NULL;
#endif
    bufs[d] = buf_alloc(n * 4);
    fill(bufs[d], ncclFloat32, 0, n, d, 0);
  }
  MUST(ncclGroupStart());
  for (int d = 0; d < ndev; ++d)
    MUST(ncclAllReduce(bufs[d], bufs[d], n, ncclFloat32, ncclSum, comms[d], streams[d]));
  MUST(ncclGroupEnd());
  for (int d = 0; d < ndev; ++d) {
#ifdef COCCL_TEST_GPU
    cudaSetDevice(d);
    cudaStreamSynchronize(streams[d]);
#endif
    float* h = download(bufs[d], n * 4);
    for (size_t i = 0; i < n; ++i)
      if (h[i] != value(0, i) + value(1, i)) {
        CHECK(0, "init_all: comm %d [%zu] = %g", d, i, h[i]);
        break;
      }
    free(h);
    buf_free(bufs[d]);
#ifdef COCCL_TEST_GPU
    cudaStreamDestroy(streams[d]);
#endif
  }
  for (int d = 0; d < ndev; ++d) MUST(ncclCommDestroy(comms[d]));
#ifdef COCCL_TEST_GPU
  cudaSetDevice(rank_);
#endif
}

/* A barrier through host memory: on the GPU build, a rank waiting here leaves its GPU idle
 * for another process's kernels. */
static void host_barrier(ncclComm_t comm) {
  int32_t x = 1;
  MUST(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, NULL));
  CHECK(x == nranks_, "host barrier: %d", x);
}

/* The last rank dies; the others see an error, shrink the failed communicator to themselves
 * (NCCL_SHRINK_ABORT), check an all_reduce over it, and abort the parent. */
static void test_abort_dead_peer(ncclComm_t comm) {
  ncclUniqueId id = share_id(comm);
  ncclComm_t c = NULL;
  MUST(ncclCommInitRank(&c, nranks_, id, rank_));
  int32_t want = nranks_ * (nranks_ + 1) / 2;
  CHECK(member_sum(c) == want, "all_reduce before the peer dies");
  if (rank_ == nranks_ - 1) {
    fflush(stderr);
    _exit(failures_ ? 1 : 0);
  }
  /* Host memory even on the GPU build: a device kernel would wait for the dead peer forever
   * (coccl's kernels have no abort flag). */
  int32_t x = 1;
  ncclResult_t r = ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, c, NULL);
  CHECK(r == ncclRemoteError || r == ncclSystemError, "all_reduce with a dead peer returned %d", r);
  ncclResult_t async_error = ncclSuccess;
  MUST(ncclCommGetAsyncError(c, &async_error));
  CHECK(async_error != ncclSuccess, "no asynchronous error after the peer died");
  expect_message("a dead peer");
  int excluded[1] = {nranks_ - 1};
  ncclComm_t rest = NULL;
  MUST(ncclCommShrink(c, excluded, 1, &rest, NULL, NCCL_SHRINK_ABORT));
  int count = -1, rank = -1;
  MUST(ncclCommCount(rest, &count));
  MUST(ncclCommUserRank(rest, &rank));
  CHECK(count == nranks_ - 1, "shrink of a failed parent: %d ranks", count);
  CHECK(rank == rank_, "shrink of a failed parent: rank %d", rank);
  CHECK(member_sum(rest) == want - nranks_, "shrink of a failed parent: all_reduce");
  MUST(ncclCommDestroy(rest));
  MUST(ncclCommAbort(c));
}

static int rank_main(int rank, int nranks, int in_fd, const int* out_fds) {
  rank_ = rank;
  nranks_ = nranks;
#ifdef COCCL_TEST_GPU
  int ngpus = 0;
  if (cudaGetDeviceCount(&ngpus) != cudaSuccess || ngpus < nranks) {
    fprintf(stderr, "rank %d: needs %d GPUs, found %d: skipped\n", rank, nranks, ngpus);
    return skip_code;
  }
  cudaSetDevice(rank);
  cudaStreamCreate(&stream_);
#endif
  ncclUniqueId id;
  if (rank == 0) {
    MUST(ncclGetUniqueId(&id));
    for (int r = 1; r < nranks; ++r)
      if (write(out_fds[r], &id, sizeof id) != (ssize_t)sizeof id) return 1;
  } else if (read(in_fd, &id, sizeof id) != (ssize_t)sizeof id) {
    return 1;
  }
  test_error_strings();
  ncclComm_t comm = NULL;
  MUST(ncclCommInitRank(&comm, nranks, id, rank));
  test_queries(comm);
  test_errors(comm);
  test_count_overflow(comm);
  test_collectives(comm);
  test_group_mix(comm);
  test_premulsum(comm);
  test_nonblocking_init(comm);
  test_split(comm);
  test_shrink(comm);
  /* Rank 0's single-process test runs while the others wait (on the host) around it. */
  host_barrier(comm);
  if (rank == 0) test_init_all();
  host_barrier(comm);
  test_abort_dead_peer(comm);
  MUST(ncclCommFinalize(comm));
  MUST(ncclCommDestroy(comm));
  return failures_ ? 1 : 0;
}

int main(int argc, char** argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 2;
  if (nranks < 2 || nranks > 8) {
    fprintf(stderr, "usage: %s NRANKS (2..8)\n", argv[0]);
    return 2;
  }
  int fds[8][2];
  for (int r = 0; r < nranks; ++r)
    if (pipe(fds[r]) != 0) return 1;
  pid_t pids[8];
  for (int r = 0; r < nranks; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) return 1;
    if (pids[r] == 0) {
      int out[8];
      for (int q = 0; q < nranks; ++q) out[q] = fds[q][1];
      int rc = rank_main(r, nranks, fds[r][0], out);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
  }
  int worst = 0, skipped = 0;
  for (int r = 0; r < nranks; ++r) {
    int status = 0;
    while (waitpid(pids[r], &status, 0) < 0 && errno == EINTR) {
    }
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc == skip_code)
      ++skipped;
    else if (rc != 0) {
      fprintf(stderr, "rank %d exited with %d\n", r, rc);
      worst = 1;
    }
  }
  if (worst) return 1;
  if (skipped) return skip_code;
  printf("nccl_c_test: %d ranks passed\n", nranks);
  return 0;
}
