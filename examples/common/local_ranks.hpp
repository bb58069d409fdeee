// examples/common/local_ranks.hpp: how an example program becomes one rank of a job.
//
// An example runs under torchrun, mpirun or srun (every process is a rank and the launcher
// carries rank 0's UniqueId), or on its own with `--ranks N`: it then starts N copies of itself
// as the ranks of a fresh communicator, passing the UniqueId's hex text in the environment.
#pragma once

#include <coccl/coccl.hpp>

namespace example {

/// This process's communicator when it is a rank: one started by run_local_ranks, or one started
/// by a launcher (Communicator::from_env()). An empty handle for a plain start, which should then
/// call run_local_ranks. Throws std::system_error when joining fails.
coccl::Communicator join();

/// Starts this executable `n` times with the arguments `argv`, as the ranks of a new
/// communicator whose root runs in this process, and waits for them; they share this process's
/// stdout and stderr. Each rank that failed is reported on stderr ("rank 2 exited with 1",
/// "rank 3 was killed by signal 9"). Returns 0 when every rank exited with 0, else the status of
/// the lowest failed rank (128 + signal for a killed one).
int run_local_ranks(char** argv, int n);

}  // namespace example
