// A follower that speaks the fd protocol itself, with the library's own
// transport code and without libvmmipc.so: the follow tests' view of
// exactly what an exporter sends on one watch connection, which a real
// importer cannot show (it answers an event about memory it does not hold
// "not held", and says nothing).
//
// `raw_watch HEX FOLLOWER` asks the handle's exporter for its chunks with
// the watch flag and that follower id, keeps the granted fds (never mapped)
// and the connection; a thread of its own then takes every event that
// arrives, logs it, and acks it "done" whatever it names: a follower that
// claims to hold everything, so that its answers never keep the exporter
// from sending it more (an exporter that took a follower's word would send
// it the resumed memory of chunks it never was granted). `raw_events`
// answers the log so far; what was sent before the command started is in it.
#pragma once

#include <string>
#include <vector>

namespace vmmipc::testing {

// vmmipc_peer's raw_watch and raw_events; false when `a` is neither.
bool RawFollowerCommand(const std::vector<std::string>& a, std::string* reply);

}  // namespace vmmipc::testing
