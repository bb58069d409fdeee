/* ncclCommInitRankScalable through nccl.h, one process per rank, on host buffers.
 * Usage: nccl_scalable_test NRANKS NIDS [mixed].
 *
 * Ranks 0..NIDS-1 each make one id (ncclGetUniqueId starts its root in that process) and hand it
 * to every rank through pipes; every rank then joins with the whole list, so the hellos are spread
 * over NIDS roots. The ranks check an all_reduce and an all_gather against the expected values,
 * and rank 0 first checks that bad input (nId < 1, NULL ids, more ids than ranks, an id twice) is
 * refused with a clear error.
 *
 * mixed: the upper half of the ranks pass another job's id in place of the last one. No rank may
 * form the communicator, and the ranks must say why (other ids); COCCL_TIMEOUT bounds the wait. */
#include <errno.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { max_ranks = 8, told_why = 10 };

static int rank_;
static int failures_;

#define CHECK(cond, ...)                                      \
  do {                                                        \
    if (!(cond)) {                                            \
      fprintf(stderr, "rank %d: line %d: ", rank_, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                           \
      fprintf(stderr, "\n");                                  \
      ++failures_;                                            \
    }                                                         \
  } while (0)

/* Expects `call` to be refused as invalid with `text` in the error. */
static void expect_refused(ncclResult_t got, const char* text, const char* what) {
  const char* last = ncclGetLastError(NULL);
  CHECK(got == ncclInvalidArgument, "%s: returned %d, expected ncclInvalidArgument", what,
        (int)got);
  CHECK(last && strstr(last, text), "%s: error '%s' does not say '%s'", what, last ? last : "",
        text);
}

static void bad_input(int nranks, ncclUniqueId* ids, int nids) {
  ncclComm_t comm = NULL;
  expect_refused(ncclCommInitRankScalable(&comm, nranks, 0, 0, ids, NULL), "nId must be at least 1",
                 "nId 0");
  expect_refused(ncclCommInitRankScalable(&comm, nranks, 0, -3, ids, NULL),
                 "nId must be at least 1", "nId -3");
  expect_refused(ncclCommInitRankScalable(&comm, nranks, 0, nids, NULL, NULL), "commIds is NULL",
                 "NULL ids");
  ncclUniqueId many[max_ranks + 1];
  for (int i = 0; i <= nranks; ++i) many[i] = ids[i % nids];
  expect_refused(ncclCommInitRankScalable(&comm, nranks, 0, nranks + 1, many, NULL),
                 "is more than nranks", "more ids than ranks");
  if (nids >= 2) {
    ncclUniqueId twice[2] = {ids[0], ids[0]};
    expect_refused(ncclCommInitRankScalable(&comm, nranks, 0, 2, twice, NULL),
                   "is the same as commIds[0]", "an id twice");
  }
  CHECK(comm == NULL, "a refused call left a communicator");
}

static void collectives(ncclComm_t comm, int nranks) {
  int count = -1, me = -1;
  CHECK(ncclCommCount(comm, &count) == ncclSuccess && count == nranks, "count %d", count);
  CHECK(ncclCommUserRank(comm, &me) == ncclSuccess && me == rank_, "user rank %d", me);
  enum { n = 1000 };
  float* in = malloc(n * sizeof(float));
  float* out = malloc(n * sizeof(float));
  for (int i = 0; i < n; ++i) in[i] = (float)((rank_ + 1) * (i % 17));
  CHECK(ncclAllReduce(in, out, n, ncclFloat32, ncclSum, comm, NULL) == ncclSuccess,
        "all_reduce: %s", ncclGetLastError(comm));
  const int sum = nranks * (nranks + 1) / 2;
  int bad = 0;
  for (int i = 0; i < n; ++i)
    if (out[i] != (float)(sum * (i % 17))) ++bad;
  CHECK(bad == 0, "all_reduce: %d wrong elements", bad);
  int32_t mine[4] = {rank_, rank_ * 10, rank_ * 100, -rank_};
  int32_t all[4 * max_ranks];
  CHECK(ncclAllGather(mine, all, 4, ncclInt32, comm, NULL) == ncclSuccess, "all_gather: %s",
        ncclGetLastError(comm));
  for (int r = 0; r < nranks; ++r)
    CHECK(all[4 * r] == r && all[4 * r + 1] == r * 10 && all[4 * r + 2] == r * 100 &&
              all[4 * r + 3] == -r,
          "all_gather: block of rank %d is wrong", r);
  free(in);
  free(out);
}

struct message {
  int index;
  ncclUniqueId id;
};

static int rank_main(int rank, int nranks, int nids, int mixed, int in_fd, const int* out_fds) {
  rank_ = rank;
  ncclUniqueId ids[max_ranks];
  ncclUniqueId other;
  int have = 0;
  /* Another job's id: made by rank 1, used by the upper half in mixed mode. */
  if (rank < nids) {
    struct message m = {rank, {{0}}};
    if (ncclGetUniqueId(&m.id) != ncclSuccess) return 1;
    ids[rank] = m.id;
    ++have;
    for (int r = 0; r < nranks; ++r)
      if (r != rank && write(out_fds[r], &m, sizeof m) != (ssize_t)sizeof m) return 1;
  }
  if (mixed && rank == 1) {
    struct message m = {-1, {{0}}};
    if (ncclGetUniqueId(&m.id) != ncclSuccess) return 1;
    other = m.id;
    for (int r = 0; r < nranks; ++r)
      if (r != rank && write(out_fds[r], &m, sizeof m) != (ssize_t)sizeof m) return 1;
  }
  const int expect = nids + (mixed && rank != 1 ? 1 : 0);
  while (have < expect) {
    struct message m;
    if (read(in_fd, &m, sizeof m) != (ssize_t)sizeof m) return 1;
    if (m.index < 0)
      other = m.id;
    else
      ids[m.index] = m.id;
    ++have;
  }
  if (mixed && rank >= nranks / 2) ids[nids - 1] = other;
  if (rank == 0 && !mixed) bad_input(nranks, ids, nids);
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankScalable(&comm, nranks, rank, nids, ids, NULL);
  if (mixed) {
    const char* last = ncclGetLastError(NULL);
    if (r == ncclSuccess) {
      fprintf(stderr, "rank %d: formed a communicator from mixed ids\n", rank);
      return 1;
    }
    fprintf(stderr, "rank %d: refused as expected: %s\n", rank, last ? last : "");
    return last && strstr(last, "other ids") ? told_why : 0;
  }
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclCommInitRankScalable: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  collectives(comm, nranks);
  CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
  return failures_ ? 1 : 0;
}

int main(int argc, char** argv) {
  const int nranks = argc > 2 ? atoi(argv[1]) : 0;
  const int nids = argc > 2 ? atoi(argv[2]) : 0;
  const int mixed = argc > 3 && strcmp(argv[3], "mixed") == 0;
  if (nranks < 2 || nranks > max_ranks || nids < 1 || nids > nranks || (mixed && nids < 2)) {
    fprintf(stderr, "usage: %s NRANKS (2..8) NIDS (1..NRANKS) [mixed (NIDS >= 2)]\n", argv[0]);
    return 2;
  }
  int fds[max_ranks][2];
  for (int r = 0; r < nranks; ++r)
    if (pipe(fds[r]) != 0) return 1;
  pid_t pids[max_ranks];
  for (int r = 0; r < nranks; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) return 1;
    if (pids[r] == 0) {
      int out[max_ranks];
      for (int q = 0; q < nranks; ++q) out[q] = fds[q][1];
      int rc = rank_main(r, nranks, nids, mixed, fds[r][0], out);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
  }
  int worst = 0, told = 0;
  for (int r = 0; r < nranks; ++r) {
    int status = 0;
    while (waitpid(pids[r], &status, 0) < 0 && errno == EINTR) {
    }
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc == told_why && mixed) {
      ++told;
    } else if (rc != 0) {
      fprintf(stderr, "rank %d exited with %d\n", r, rc);
      worst = 1;
    }
  }
  if (mixed && told == 0) {
    fprintf(stderr, "no rank said that the ranks were given other ids\n");
    worst = 1;
  }
  if (worst) return 1;
  printf("nccl_scalable_test: %d ranks over %d ids passed%s\n", nranks, nids,
         mixed ? " (mixed ids refused)" : "");
  return 0;
}
