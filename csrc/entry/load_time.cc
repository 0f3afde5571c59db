// The library's constructor: the one thing done at load time
// (core/load_time.h). A static function, so nothing is exported for it.
#include "core/load_time.h"

namespace vmmipc::entry {
namespace {

[[gnu::constructor]] void GrowFdTableAtLoad() { core::GrowFdTableAtLoad(); }

}  // namespace
}  // namespace vmmipc::entry
