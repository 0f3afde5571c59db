# What `cmake --install <build> [--prefix P]` puts where (GNUInstallDirs):
#   P/lib/libvmmipc.so                        the library (its install() is in csrc/CMakeLists.txt)
#   P/bin/vmmipc-run                          the launcher and `--check`
#   P/share/vmmipc/python/                    the vmmipc Python package and its sitecustomize hook
#   P/share/doc/vmmipc/                       README.md, LICENSE, docs/*.md and *.png (links work)
#   P/include/vmmipc/*.h                      header-only constants to recognise a VMM2 handle
#   P/lib/pkgconfig/vmmipc.pc                 pkg-config --cflags --libs vmmipc
#   P/lib/cmake/vmmipc/vmmipcConfig.cmake     find_package(vmmipc): imported target vmmipc::vmmipc
# Nothing installed names the prefix chosen at configure time: the .pc file is relative to
# ${pcfiledir}, the CMake package to its own folder, the launcher to its own location, so
# `--prefix` at install time and a moved tree both work.
include(CMakePackageConfigHelpers)

install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/vmmipc-run DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/
        DESTINATION ${CMAKE_INSTALL_DATADIR}/vmmipc/python
        FILES_MATCHING PATTERN "*.py"
        PATTERN "__pycache__" EXCLUDE)

install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/LICENSE
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs
        FILES_MATCHING PATTERN "*.md" PATTERN "*.png")

file(GLOB _vmmipc_headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/vmmipc/*.h)
if(_vmmipc_headers)
  install(FILES ${_vmmipc_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/vmmipc)
endif()

# pkg-config: the prefix is found from the .pc file's own folder.
set(_vmmipc_pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE ${CMAKE_INSTALL_LIBDIR})
  set(_vmmipc_pc_prefix ${CMAKE_INSTALL_PREFIX})
else()
  file(RELATIVE_PATH _vmmipc_pc_up /prefix/${_vmmipc_pc_dir} /prefix)
  string(REGEX REPLACE "/$" "" _vmmipc_pc_up ${_vmmipc_pc_up})
  set(_vmmipc_pc_prefix "\${pcfiledir}/${_vmmipc_pc_up}")
endif()
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE ${CMAKE_INSTALL_${dir}})
    set(_vmmipc_pc_${dir} ${CMAKE_INSTALL_${dir}})
  else()
    set(_vmmipc_pc_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/install/vmmipc.pc @ONLY CONTENT
[[# vmmipc: legacy CUDA IPC on VMM memory. Usually loaded with LD_PRELOAD (bin/vmmipc-run).
# It exports no API of its own: link it (-lvmmipc, before -lcuda) only to load it without a
# preload. include/vmmipc/vmmipc.h (Cflags) is header-only: constants to recognise a VMM2 handle.
prefix=@_vmmipc_pc_prefix@
libdir=@_vmmipc_pc_LIBDIR@
includedir=@_vmmipc_pc_INCLUDEDIR@

Name: vmmipc
Description: Legacy CUDA IPC (cuIpc*) on VMM memory, as an LD_PRELOAD interposer
Version: @PROJECT_VERSION@
Libs: -L${libdir} -lvmmipc
Cflags: -I${includedir}
]])
install(FILES ${PROJECT_BINARY_DIR}/install/vmmipc.pc DESTINATION ${_vmmipc_pc_dir})

# CMake package: an imported target for the installed library, found relative to this file.
file(WRITE ${PROJECT_BINARY_DIR}/install/vmmipcConfig.cmake.in
[[# find_package(vmmipc) for an installed vmmipc.
#   vmmipc::vmmipc           imported target of libvmmipc.so (link it before CUDA::cuda_driver)
#   vmmipc_LIBRARY           the library's path, for LD_PRELOAD in a test's ENVIRONMENT
#   vmmipc_RUN_EXECUTABLE    bin/vmmipc-run
@PACKAGE_INIT@

set_and_check(vmmipc_LIBRARY "@PACKAGE_CMAKE_INSTALL_LIBDIR@/libvmmipc.so")
set(vmmipc_RUN_EXECUTABLE "@PACKAGE_CMAKE_INSTALL_BINDIR@/vmmipc-run")
if(NOT TARGET vmmipc::vmmipc)
  add_library(vmmipc::vmmipc SHARED IMPORTED)
  set_target_properties(vmmipc::vmmipc PROPERTIES
    IMPORTED_LOCATION "${vmmipc_LIBRARY}"
    IMPORTED_SONAME "libvmmipc.so")
  if(EXISTS "@PACKAGE_CMAKE_INSTALL_INCLUDEDIR@/vmmipc")
    set_target_properties(vmmipc::vmmipc PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "@PACKAGE_CMAKE_INSTALL_INCLUDEDIR@")
  endif()
endif()
check_required_components(vmmipc)
]])
configure_package_config_file(
  ${PROJECT_BINARY_DIR}/install/vmmipcConfig.cmake.in
  ${PROJECT_BINARY_DIR}/install/vmmipcConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/vmmipc
  PATH_VARS CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_BINDIR CMAKE_INSTALL_INCLUDEDIR)
# 0.x: only the same minor version counts as compatible.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/install/vmmipcConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/install/vmmipcConfig.cmake
              ${PROJECT_BINARY_DIR}/install/vmmipcConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/vmmipc)

# Debug info: the build keeps it (RelWithDebInfo by default: 50 MB of libvmmipc.so, nearly
# all DWARF); the installed library and vmmipc-config go without it, and it goes beside each
# in a .debug folder (lib/.debug/libvmmipc.so.debug), linked by .gnu_debuglink, where gdb
# looks for it wherever the tree is moved. `cmake --install --strip` strips instead (no .debug
# files); VMMIPC_INSTALL_SPLIT_DEBUG=OFF installs the files as built.
option(VMMIPC_INSTALL_SPLIT_DEBUG "Install debug info apart, in .debug/ beside each binary" ON)
if(VMMIPC_INSTALL_SPLIT_DEBUG AND CMAKE_OBJCOPY AND CMAKE_READELF)
  install(CODE "
    set(_root \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}\")
    foreach(_file ${VMMIPC_LIBRARY_DESTINATION}/libvmmipc.so ${VMMIPC_TOOL_DESTINATION}/vmmipc-config)
      if(NOT IS_ABSOLUTE \"\${_file}\")
        set(_file \"\${_root}/\${_file}\")
      endif()
      if(CMAKE_INSTALL_DO_STRIP OR NOT EXISTS \"\${_file}\")
        continue()
      endif()
      execute_process(COMMAND \"${CMAKE_READELF}\" -S --wide \"\${_file}\"
                      OUTPUT_VARIABLE _sections RESULT_VARIABLE _rc)
      if(NOT _rc EQUAL 0 OR NOT _sections MATCHES \"[.]debug_info\")
        continue()
      endif()
      get_filename_component(_dir \"\${_file}\" DIRECTORY)
      get_filename_component(_name \"\${_file}\" NAME)
      file(MAKE_DIRECTORY \"\${_dir}/.debug\")
      message(STATUS \"Splitting debug info: \${_dir}/.debug/\${_name}.debug\")
      execute_process(COMMAND \"${CMAKE_OBJCOPY}\" --only-keep-debug \"\${_file}\"
                              \"\${_dir}/.debug/\${_name}.debug\" COMMAND_ERROR_IS_FATAL ANY)
      execute_process(COMMAND \"${CMAKE_OBJCOPY}\" --strip-debug
                              \"--add-gnu-debuglink=\${_dir}/.debug/\${_name}.debug\" \"\${_file}\"
                      COMMAND_ERROR_IS_FATAL ANY)
    endforeach()
  ")
endif()
