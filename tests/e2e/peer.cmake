# vmmipc_peer: one process driven by commands on stdin (tests/e2e, scripts/demo.sh, the
# wheel's `python -m vmmipc demo`). Included by tests/e2e/CMakeLists.txt, and by the top level
# when only the simulated driver and the peer are built (VMMIPC_BUILD_SIM); in
# <build>/tests/e2e either way.
add_executable(vmmipc_peer ${CMAKE_CURRENT_LIST_DIR}/peer_main.cc
               ${CMAKE_CURRENT_LIST_DIR}/raw_follower.cc)
target_link_libraries(vmmipc_peer PRIVATE vmmipc_sim_cuda vmmipc_ledger vmmipc_transport CUDA::cuda_driver_headers_only ${CMAKE_DL_LIBS})
target_include_directories(vmmipc_peer PRIVATE ${PROJECT_SOURCE_DIR}/tests/sim_driver)
# No RUNPATH to the simulator: the test picks the driver (LD_LIBRARY_PATH or the system's).
set_target_properties(vmmipc_peer PROPERTIES SKIP_BUILD_RPATH ON
  RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/e2e)
