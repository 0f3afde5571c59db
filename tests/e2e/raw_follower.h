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
//
// `raw_watch HEX FOLLOWER MODE` picks another behaviour: `silent` sends the
// watch request and then nothing (it neither reads nor acks: a silent
// watcher, issue 36 item 3); `held` logs the events as they come but acks
// them only on `raw_ack` (a follower that answers late, at the test's word:
// a deterministic stand-in for one that is slow). `raw_ack` acks "done"
// every event logged and not acked yet. `raw_fetch HEX FOLLOWER` fetches a
// handle without the watch flag under that follower id (its chunks are then
// the follower's too), keeping the fds.
//
// `raw_watches HEX FIRST COUNT` makes COUNT watch fetches of the handle, the
// i-th with follower id FIRST + i, each on a connection of its own, and
// keeps every watch connection it is given (silent): one process asking for
// many watches (issue 36 item 4). It answers "ok GRANTED": the fetches
// granted (how many connections the exporter keeps is the exporter's to
// count: it closes those it does not keep after their reply).
#pragma once

#include <string>
#include <vector>

namespace vmmipc::testing {

// vmmipc_peer's raw_watch, raw_fetch, raw_events, raw_ack and raw_watches;
// false when `a` is none of them.
bool RawFollowerCommand(const std::vector<std::string>& a, std::string* reply);

}  // namespace vmmipc::testing
