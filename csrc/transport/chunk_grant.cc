// Names of the refusal reasons, for log lines on both sides of the protocol.
#include "transport/chunk_grant.h"

namespace vmmipc::transport {

const char* RefuseReasonName(RefuseReason reason) {
  switch (reason) {
    case RefuseReason::kNone:
      return "none";
    case RefuseReason::kBadToken:
      return "bad token";
    case RefuseReason::kWrongUser:
      return "wrong user";
    case RefuseReason::kNotExported:
      return "not exported";
    case RefuseReason::kFreed:
      return "freed";
    case RefuseReason::kExportFailed:
      return "export failed";
    case RefuseReason::kTooManyChunks:
      return "too many chunks";
    case RefuseReason::kInternal:
      return "internal error";
    case RefuseReason::kBadRequest:
      return "bad request";
  }
  return "unknown reason";
}

}  // namespace vmmipc::transport
