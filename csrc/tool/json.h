// A small JSON writer for vmmipc-config's report: objects, arrays, strings,
// numbers, booleans and null, one member or element per line, indented.
// Strings are written as UTF-8 with the escapes JSON requires; nothing is
// parsed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vmmipc::tool {

class Json {
 public:
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  // The next value is the member `key` of the object open.
  void Key(std::string_view key);

  void String(std::string_view value);
  void Int(int64_t value);
  void Uint(uint64_t value);
  void Bool(bool value);
  void Null();

  // Key then value, for the usual member; an empty optional is null.
  void Field(std::string_view key, std::string_view value);
  void Field(std::string_view key, const char* value) { Field(key, std::string_view(value)); }
  void Field(std::string_view key, const std::string& value) {
    Field(key, std::string_view(value));
  }
  void Field(std::string_view key, int64_t value);
  void Field(std::string_view key, int value) { Field(key, static_cast<int64_t>(value)); }
  void Field(std::string_view key, uint64_t value);
  void Field(std::string_view key, bool value);
  void FieldOrNull(std::string_view key, const std::optional<std::string>& value);
  void FieldOrNull(std::string_view key, std::optional<int64_t> value);

  // The document so far; complete once every object and array is closed.
  const std::string& text() const { return out_; }

 private:
  void Open(char bracket);
  void Close(char bracket);
  // Before a value: the comma and line break after a previous one, the indent.
  void BeforeValue();
  void Indent();

  std::string out_;
  std::vector<bool> empty_;  // per open object or array: nothing in it yet
  bool after_key_ = false;
};

// `text` as a JSON string literal, quotes included.
std::string Quote(std::string_view text);

}  // namespace vmmipc::tool
