// Park: where objects leaked on purpose stay reachable. A forked child must
// abandon what its parent's threads may hold (the logger and its mutex, the
// listener's std::thread, the process state): it can neither destroy them nor
// free them safely. Parked, they are still leaked, but leak checkers
// (LeakSanitizer) see them reachable and do not fail the child's exit.
#pragma once

namespace vmmipc {

// Keeps `object` reachable for the rest of the process's life; never frees
// it. Lock-free (safe in a forked child); nullptr is ignored.
void Park(const void* object) noexcept;

}  // namespace vmmipc
