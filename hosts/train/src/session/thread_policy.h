// How many intra-op threads LibTorch gets in one rank of ampkit-train.
#pragma once

#include <algorithm>

namespace ampkit {

// An explicit --threads wins. Otherwise ranks sharing a node split its cores (oversubscribed
// OpenMP threads spin against each other: a step can take 30x longer), unless the launcher set
// OMP_NUM_THREADS (torchrun sets 1), which LibTorch then follows. 0 keeps LibTorch's choice.
inline int threads_for_rank(int explicit_threads, int ranks_on_node, bool omp_num_threads_set,
                            unsigned cores) {
  if (explicit_threads > 0) return explicit_threads;
  if (ranks_on_node <= 1 || omp_num_threads_set) return 0;
  return static_cast<int>(std::max(1u, std::max(1u, cores) / static_cast<unsigned>(ranks_on_node)));
}

}  // namespace ampkit
