// A connection served to the end on the calling thread, both phases in a
// row (serve_connection.h's ServeConnection and AnswerRequest): what tests
// and the fuzz target drive; the listener runs the phases itself.
#include <poll.h>

#include "transport/reaper/fd_reaper.h"
#include "transport/serve/serve_connection.h"

namespace vmmipc::transport {

void AnswerRequest(PendingRequest request, const ServeContext& context) noexcept {
  ServeReply reply;
  if (PrepareReply(request, context, &reply)) SendReply(std::move(request), reply, context);
}

void ServeConnection(ScopedFd fd, const ServeContext& context) noexcept {
  Connection connection;
  if (!StartConnection(std::move(fd), context, &connection)) return;
  while (true) {
    const IoResult io = WaitFor(connection.fd.get(), POLLIN, connection.deadline, context.stop_fd);
    if (io.status == IoStatus::kStopped) {
      if (CloseConnection(std::move(connection.fd)) && context.events.reaped != nullptr)
        context.events.reaped();
      return;
    }
    if (io.status == IoStatus::kTimeout) {
      DropSilent(std::move(connection), context);
      return;
    }
    PendingRequest request;
    switch (ReadRequest(connection, context, &request)) {
      case ReadOutcome::kWaiting:
        continue;
      case ReadOutcome::kDone:
        return;
      case ReadOutcome::kReady:
        AnswerRequest(std::move(request), context);
        return;
    }
  }
}

}  // namespace vmmipc::transport
