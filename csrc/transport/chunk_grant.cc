// Names of the refusal reasons, for log lines on both sides of the protocol.
#include "transport/chunk_grant.h"

namespace vmmipc::transport {

const char* RefuseReasonName(RefuseReason reason) {
  switch (reason) {
    case RefuseReason::kNone:
      return "none";
#define VMMIPC_REFUSE_NAME(id, value, name) \
  case RefuseReason::id:                    \
    return name;
      VMMIPC_REFUSE_REASONS(VMMIPC_REFUSE_NAME)
#undef VMMIPC_REFUSE_NAME
  }
  return "unknown reason";
}

}  // namespace vmmipc::transport
