// The JSON writer: layout (commas, line breaks, indents) and string escapes.
#include "tool/json.h"

#include <fmt/format.h>

namespace vmmipc::tool {

std::string Quote(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\u{:04x}", byte);
    } else {
      out += c;  // UTF-8 passes through as it is
    }
  }
  out += '"';
  return out;
}

void Json::Indent() { out_.append(2 * empty_.size(), ' '); }

void Json::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (empty_.empty()) return;  // the document's one value
  if (!empty_.back()) out_ += ',';
  out_ += '\n';
  empty_.back() = false;
  Indent();
}

void Json::Open(char bracket) {
  BeforeValue();
  out_ += bracket;
  empty_.push_back(true);
}

void Json::Close(char bracket) {
  const bool was_empty = empty_.back();
  empty_.pop_back();
  if (!was_empty) {
    out_ += '\n';
    Indent();
  }
  out_ += bracket;
  if (empty_.empty()) out_ += '\n';
}

void Json::Key(std::string_view key) {
  BeforeValue();
  out_ += Quote(key);
  out_ += ": ";
  after_key_ = true;
}

void Json::String(std::string_view value) {
  BeforeValue();
  out_ += Quote(value);
}

void Json::Int(int64_t value) {
  BeforeValue();
  out_ += std::to_string(value);
}

void Json::Uint(uint64_t value) {
  BeforeValue();
  out_ += std::to_string(value);
}

void Json::Bool(bool value) {
  BeforeValue();
  out_ += value ? "true" : "false";
}

void Json::Null() {
  BeforeValue();
  out_ += "null";
}

void Json::Field(std::string_view key, std::string_view value) {
  Key(key);
  String(value);
}

void Json::Field(std::string_view key, int64_t value) {
  Key(key);
  Int(value);
}

void Json::Field(std::string_view key, uint64_t value) {
  Key(key);
  Uint(value);
}

void Json::Field(std::string_view key, bool value) {
  Key(key);
  Bool(value);
}

void Json::FieldOrNull(std::string_view key, const std::optional<std::string>& value) {
  Key(key);
  if (value)
    String(*value);
  else
    Null();
}

void Json::FieldOrNull(std::string_view key, std::optional<int64_t> value) {
  Key(key);
  if (value)
    Int(*value);
  else
    Null();
}

}  // namespace vmmipc::tool
