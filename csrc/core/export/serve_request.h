// The export side's answer to one request of a peer (transport/serve calls
// it for every authenticated request): the run of chunks from the handle's
// chunk to the end of its contiguous mapped run, each with its fd, or a
// refusal with its reason and a line that says why.
#pragma once

#include "transport/serve/serve_handler.h"

namespace vmmipc::core {

// Called by the listener for every authenticated request.
transport::ServeReply Serve(const transport::ServeRequest& request);

}  // namespace vmmipc::core
