/* The C interface (include/coccl_ext.h) on host memory, written in C so the header is checked as
 * C: all-to-all-v with exact expectations, a count over the maximum failing on every rank, and an
 * MoE dispatch + combine with identity experts. Returns the number of failed checks. */
#include <coccl_ext.h>
#include <stdio.h>
#include <string.h>

int moe_c_api_scenario(int rank, int nranks, const char* id);

static int check(int ok, int rank, const char* what) {
  if (!ok) {
    printf("FAIL rank=%d c_api %s (%s)\n", rank, what, cocclExtLastError());
    fflush(stdout);
  }
  return ok ? 0 : 1;
}

int moe_c_api_scenario(int rank, int nranks, const char* id) {
  cocclComm_t comm = NULL;
  if (cocclExtCommInit(&comm, id, rank, nranks) != cocclExtSuccess) {
    return check(0, rank, "cocclExtCommInit");
  }
  int fails = 0;

  /* Rank r sends r + q + 1 values r * 1000 + q * 100 + i to rank q, packed. A failed exchange
   * ends the scenario: the communicator is unusable after it. */
  cocclAllToAllv_t a2a = NULL;
  fails += check(cocclAllToAllvCreate(&a2a, comm, 64, 2 /* ncclInt32 */) == cocclExtSuccess, rank,
                 "cocclAllToAllvCreate");
  int64_t sc[8], rc[8];
  int32_t send[512], recv[512];
  int at = 0;
  for (int q = 0; q < nranks; ++q) {
    sc[q] = rank + q + 1;
    for (int i = 0; i < sc[q]; ++i) send[at++] = rank * 1000 + q * 100 + i;
  }
  if (check(cocclAllToAllvHost(a2a, send, sc, NULL, recv, rc, NULL) == cocclExtSuccess, rank,
            "cocclAllToAllvHost") != 0) {
    return fails + 1;
  }
  at = 0;
  for (int q = 0; q < nranks; ++q) {
    fails += check(rc[q] == q + rank + 1, rank, "recv_counts");
    for (int i = 0; i < rc[q]; ++i)
      fails += check(recv[at++] == q * 1000 + rank * 100 + i, rank, "data");
  }
  size_t bytes = 1;
  fails += check(cocclAllToAllvDeviceBytes(a2a, &bytes) == cocclExtSuccess && bytes == 0, rank,
                 "no device memory for host calls");
  sc[0] = rank == 0 ? 65 : 1;
  fails +=
      check(cocclAllToAllvHost(a2a, send, sc, NULL, recv, rc, NULL) == cocclExtInvalidArgument &&
                strstr(cocclExtLastError(), "max_count") != NULL,
            rank, "a count over max_count fails on every rank");
  fails += check(cocclAllToAllvDestroy(a2a) == cocclExtSuccess, rank, "cocclAllToAllvDestroy");

  /* MoE: token t goes to expert (t + rank) % nranks (one per rank) with weight 0.5; identity
   * experts, so out = 0.5 * x. */
  cocclMoe_t moe = NULL;
  cocclMoeConfig_t config = {4, 4, 7 /* ncclFloat32 */, 1, nranks, 0};
  fails += check(cocclMoeCreate(&moe, comm, &config) == cocclExtSuccess, rank, "cocclMoeCreate");
  float x[16], out[16], w[4];
  int32_t idx[4];
  for (int t = 0; t < 4; ++t) {
    idx[t] = (t + rank) % nranks;
    w[t] = 0.5f;
    for (int h = 0; h < 4; ++h) x[t * 4 + h] = (float)(rank * 100 + t * 10 + h);
  }
  cocclMoeReceived_t got;
  if (check(cocclMoeDispatchHost(moe, x, 4, idx, &got) == cocclExtSuccess, rank,
            "cocclMoeDispatchHost") != 0) {
    return fails + 1;
  }
  fails += check(got.local_experts == 1 && got.first_expert == rank, rank, "local experts");
  fails += check(cocclMoeCombineHost(moe, got.x, w, out) == cocclExtSuccess, rank,
                 "cocclMoeCombineHost");
  for (int i = 0; i < 16; ++i) fails += check(out[i] == 0.5f * x[i], rank, "combine result");
  fails += check(cocclMoeDestroy(moe) == cocclExtSuccess, rank, "cocclMoeDestroy");
  config.num_experts = nranks + 1;
  fails += check(nranks == 1 || cocclMoeCreate(&moe, comm, &config) == cocclExtInvalidArgument,
                 rank, "experts not a multiple of the ranks is rejected");

  fails += check(cocclExtCommDestroy(comm) == cocclExtSuccess, rank, "cocclExtCommDestroy");
  return fails;
}
