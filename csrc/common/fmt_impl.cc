// fmt's compiled part, once for the whole library. With FMT_HEADER_ONLY every
// file that formats a line compiled fmt's formatting engine again (a few
// seconds of -O2 each, most of the build); without it, those files only call
// fmt::vformat and the rest, defined here as fmt's own src/format.cc defines
// them, for the fmt 9.x headers this file is written against
// (csrc/CMakeLists.txt uses it only with such a system fmt; any other fmt
// stays header-only). Nothing of fmt is exported: the layers are hidden and
// libvmmipc.so's version script exports the hooks only.
#ifndef FMT_HEADER_ONLY
#include <fmt/format-inl.h>

#if FMT_VERSION < 90000 || FMT_VERSION >= 100000
#error "common/fmt_impl.cc instantiates fmt 9.x; other versions are used header-only"
#endif

FMT_BEGIN_NAMESPACE
namespace detail {

template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;

#ifndef FMT_STATIC_THOUSANDS_SEPARATOR
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
#endif

template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API void buffer<char>::append(const char*, const char*);
template FMT_API void vformat_to(buffer<char>&, string_view,
                                 basic_format_args<FMT_BUFFER_CONTEXT(char)>, locale_ref);

template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
template FMT_API void buffer<wchar_t>::append(const wchar_t*, const wchar_t*);

}  // namespace detail
FMT_END_NAMESPACE
#endif  // FMT_HEADER_ONLY
