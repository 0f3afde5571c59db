# vmmipc_layer(NAME SOURCES... DEPS ...): one static, PIC, hidden-visibility
# library per layer (docs/architecture.md), linked whole into libvmmipc.so.
function(vmmipc_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS" ${ARGN})
  add_library(vmmipc_${name} STATIC ${L_SOURCES})
  target_include_directories(vmmipc_${name} PUBLIC ${PROJECT_SOURCE_DIR}/csrc ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(vmmipc_${name} PUBLIC ${L_DEPS})
  # initial-exec TLS: no __tls_get_addr, hence no NEEDED on ld-linux; right for
  # a library that is preloaded (its TLS is static), as mimalloc does.
  target_compile_options(vmmipc_${name} PRIVATE -ftls-model=initial-exec)
  set_target_properties(vmmipc_${name} PROPERTIES
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
endfunction()
