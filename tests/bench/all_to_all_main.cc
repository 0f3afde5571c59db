// vmmipc_all_to_all: an all-to-all registration benchmark shaped like a
// framework (docs/benchmarks.md). One binary, three roles chosen by argv[1]:
// the launcher (all_to_all_launcher.cc), a rank process it starts
// (all_to_all_rank.cc), and a child that only counts GPUs, so that the
// launcher itself never initialises CUDA.
#include <cstring>

#include "all_to_all.h"

int main(int argc, char** argv) {
  using namespace vmmipc_all_to_all;
  if (argc >= 2 && std::strcmp(argv[1], "--vmmipc_rank_child") == 0) return RankMain(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "--vmmipc_count_gpus") == 0) return CountGpusMain();
  return LauncherMain(argc, argv);
}
