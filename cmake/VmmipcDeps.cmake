# fmt and spdlog, compiled into the library from their headers (spdlog header-only on the
# external fmt; fmt below): libvmmipc.so links neither, so any copy of their headers does.
# Found on the system first (find_package: libfmt-dev, libspdlog-dev, a prefix on
# CMAKE_PREFIX_PATH); where either is missing, both are fetched as one pinned pair of upstream
# release tarballs (FetchContent, checked by SHA-256), so that a build needs no root and no
# system package: pip install . in a manylinux image, a user without apt. The pair is fetched
# together because spdlog only works with the fmt versions it was released for.
#
#   VMMIPC_FETCH_DEPS=OFF         never download: a missing fmt or spdlog is an error
#   VMMIPC_FMT_URL, VMMIPC_SPDLOG_URL
#                                 another place for the same tarballs (a mirror, file://...);
#                                 the SHA-256 below still has to match
#   FETCHCONTENT_SOURCE_DIR_VMMIPC_FMT, FETCHCONTENT_SOURCE_DIR_VMMIPC_SPDLOG
#                                 an unpacked source tree instead (offline builds)
#
# Defines, for csrc/, vmmipc_fmt (fmt's headers) and vmmipc_spdlog_headers (spdlog's include
# folder and definitions only, never its library): from the system's targets or from the
# fetched sources, of which nothing of their own build is used. A system fmt 9.x is compiled
# once, into the common layer (csrc/common/fmt_impl.cc: VMMIPC_FMT_COMPILED); any other fmt is
# used with FMT_HEADER_ONLY, which compiles its formatting engine into every file that formats
# (the build takes about twice as long; the library is the same).
option(VMMIPC_FETCH_DEPS "Fetch fmt and spdlog (pinned release tarballs) when not installed" ON)
set(VMMIPC_FMT_VERSION 10.2.1)
set(VMMIPC_SPDLOG_VERSION 1.13.0)
set(VMMIPC_FMT_URL "https://github.com/fmtlib/fmt/archive/${VMMIPC_FMT_VERSION}.tar.gz"
    CACHE STRING "Where the fmt release tarball is fetched from when fmt is not installed")
set(VMMIPC_SPDLOG_URL
    "https://github.com/gabime/spdlog/archive/v${VMMIPC_SPDLOG_VERSION}.tar.gz"
    CACHE STRING "Where the spdlog release tarball is fetched from when spdlog is not installed")
# The SHA-256 of GitHub's tarballs of the tags (git archive | gzip -n of the tag reproduces them).
set(_vmmipc_fmt_sha256 1250e4cc58bf06ee631567523f48848dc4596133e163f02615c97f78bab6c811)
set(_vmmipc_spdlog_sha256 534f2ee1a4dcbeb22249856edfb2be76a1cf4f708a20b0ac2ed090ee24cfdbc9)

find_package(fmt QUIET)
find_package(spdlog QUIET)
if(fmt_FOUND AND spdlog_FOUND AND TARGET fmt::fmt-header-only
   AND TARGET spdlog::spdlog_header_only)
  message(STATUS "vmmipc: fmt ${fmt_VERSION} and spdlog ${spdlog_VERSION} from the system")
  add_library(vmmipc_fmt INTERFACE)
  if(fmt_VERSION VERSION_GREATER_EQUAL 9 AND fmt_VERSION VERSION_LESS 10)
    # Its headers only; its implementation from csrc/common/fmt_impl.cc, never libfmt.so.
    set(VMMIPC_FMT_COMPILED ON)
    target_include_directories(vmmipc_fmt INTERFACE
      $<TARGET_PROPERTY:fmt::fmt-header-only,INTERFACE_INCLUDE_DIRECTORIES>)
  else()
    set(VMMIPC_FMT_COMPILED OFF)
    target_link_libraries(vmmipc_fmt INTERFACE fmt::fmt-header-only)
  endif()
  # Not linked: the system's spdlog target would bring the compiled libfmt.so along. Nor its
  # FMT_SHARED, which would give fmt's functions default visibility in the common layer.
  add_library(vmmipc_spdlog_headers INTERFACE)
  target_include_directories(vmmipc_spdlog_headers INTERFACE
    $<TARGET_PROPERTY:spdlog::spdlog_header_only,INTERFACE_INCLUDE_DIRECTORIES>)
  target_compile_definitions(vmmipc_spdlog_headers INTERFACE
    $<FILTER:$<TARGET_PROPERTY:spdlog::spdlog_header_only,INTERFACE_COMPILE_DEFINITIONS>,EXCLUDE,^FMT_SHARED$>)
  return()
endif()
if(fmt_FOUND)
  set(_vmmipc_missing spdlog)
elseif(spdlog_FOUND)
  set(_vmmipc_missing fmt)
else()
  set(_vmmipc_missing "fmt and spdlog")
endif()
if(NOT VMMIPC_FETCH_DEPS)
  message(FATAL_ERROR "vmmipc: ${_vmmipc_missing} not found, and VMMIPC_FETCH_DEPS is OFF: "
    "install libfmt-dev and libspdlog-dev (scripts/setup.sh), or set CMAKE_PREFIX_PATH")
endif()
message(STATUS "vmmipc: ${_vmmipc_missing} not installed: fetching fmt ${VMMIPC_FMT_VERSION} "
  "and spdlog ${VMMIPC_SPDLOG_VERSION} (header-only)")

include(FetchContent)
if(POLICY CMP0135)
  cmake_policy(SET CMP0135 NEW)  # unpacked files dated now, so that a new tarball rebuilds
endif()
# SOURCE_SUBDIR names a folder without a CMakeLists.txt: the sources are only unpacked, not
# added to the build (their own projects would build and install libraries).
FetchContent_Declare(vmmipc_fmt URL ${VMMIPC_FMT_URL}
  URL_HASH SHA256=${_vmmipc_fmt_sha256} SOURCE_SUBDIR vmmipc-headers-only)
FetchContent_Declare(vmmipc_spdlog URL ${VMMIPC_SPDLOG_URL}
  URL_HASH SHA256=${_vmmipc_spdlog_sha256} SOURCE_SUBDIR vmmipc-headers-only)
FetchContent_MakeAvailable(vmmipc_fmt vmmipc_spdlog)
foreach(_dir ${vmmipc_fmt_SOURCE_DIR}/include/fmt ${vmmipc_spdlog_SOURCE_DIR}/include/spdlog)
  if(NOT IS_DIRECTORY ${_dir})
    message(FATAL_ERROR "vmmipc: ${_dir} missing: not the fmt/spdlog release expected")
  endif()
endforeach()

# Headers and definitions only; not installed (libvmmipc.so carries the code it instantiates
# and exports none of it). spdlog on this fmt, not on the copy it bundles.
set(VMMIPC_FMT_COMPILED OFF)
add_library(vmmipc_fmt INTERFACE)
target_include_directories(vmmipc_fmt SYSTEM INTERFACE ${vmmipc_fmt_SOURCE_DIR}/include)
target_compile_definitions(vmmipc_fmt INTERFACE FMT_HEADER_ONLY=1)
add_library(vmmipc_spdlog_headers INTERFACE)
target_include_directories(vmmipc_spdlog_headers SYSTEM INTERFACE
  ${vmmipc_spdlog_SOURCE_DIR}/include)
target_compile_definitions(vmmipc_spdlog_headers INTERFACE SPDLOG_FMT_EXTERNAL)
