// vmmipc-config --markdown: the table of every VMMIPC_* variable that
// docs/configuration.md shows, generated from params.def (name, default,
// what each accepts: its kind's spellings and its rule; the documentation).
#pragma once

#include <string>

namespace vmmipc::tool {

// The two tables (the user's, then the one for tests and benchmarks), each
// header first, one row per variable in params.def's order, each line
// ending in "\n". docs/configuration.md holds it between the markers
// kTableBegin and kTableEnd; tests/scripts/test_vmmipc_run.py compares.
std::string VariablesTable();

inline constexpr const char* kTableBegin =
    "<!-- generated: vmmipc-config --markdown (from csrc/config/params.def); edit params.def -->";
inline constexpr const char* kTableEnd = "<!-- end of the generated table -->";

}  // namespace vmmipc::tool
