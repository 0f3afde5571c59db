// The library's constructor: the one thing done at load time
// (core/load_time.h). A static function, so nothing is exported for it. It
// may run before the dynamic initialisers of the library's other files (their
// order is the link's): what it reaches uses constants and its own locals only.
#include "core/load_time.h"

namespace vmmipc::entry {
namespace {

[[gnu::constructor]] void GrowFdTableAtLoad() { core::GrowFdTableAtLoad(); }

}  // namespace
}  // namespace vmmipc::entry
