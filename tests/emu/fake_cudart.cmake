# tests/emu/fake_cudart.cmake - the fake CUDA runtime over the CPU emulator and
# its module builder (included by tests/emu/CMakeLists.txt; test-only).
#
#   <build>/emu-cudart/libcudart.so.13   fake_cudart.c: SONAME libcudart.so.13, every
#                                        symbol in the version node libcudart.so.13
#                                        (libcudart.map) like NVIDIA's runtime, so
#                                        cprun binds to it when this folder is first
#                                        on LD_LIBRARY_PATH (cprun has a RUNPATH, which
#                                        LD_LIBRARY_PATH overrides; an RPATH would not)
#   <build>/emu-cudart/cpc_emu_prepare   prepare.c: builds the emulator modules of a
#                                        .cplan's kernels, named by the PTX's sha256
#   <build>/emu-cudart/libnccl.so.2      fake_nccl.c: NCCL over Unix-domain sockets
#                                        (SONAME libnccl.so.2, libnccl.map), so the
#                                        NCCL transport runs on the fake runtime
#   test_fake_cudart                     test_fake_cudart.c: the fake's semantics
#   test_fake_nccl                       test_fake_nccl.c: the fake NCCL's (thread ranks)
#
# tests/cli/cuda_emu.sh finds both under $CPC_BUILD_DIR/emu-cudart.
if(CPC_HAVE_CUDA AND TARGET cpc_emu)
  set(CPC_FAKE_CUDART_DIR ${CMAKE_BINARY_DIR}/emu-cudart)
  add_library(cpc_fake_cudart SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_cudart.c)
  # One file, libcudart.so.13, no libcudart.so symlink beside it.
  set_target_properties(cpc_fake_cudart PROPERTIES
    PREFIX "lib" OUTPUT_NAME "cudart" SUFFIX ".so.13" NO_SONAME ON
    C_VISIBILITY_PRESET hidden
    LIBRARY_OUTPUT_DIRECTORY ${CPC_FAKE_CUDART_DIR}
    LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/libcudart.map)
  target_link_options(cpc_fake_cudart PRIVATE -Wl,-soname,libcudart.so.13
    -Wl,--version-script=${CMAKE_CURRENT_LIST_DIR}/libcudart.map)
  if(NOT CPC_SANITIZE AND NOT CPC_FUZZ)
    target_link_options(cpc_fake_cudart PRIVATE -Wl,--no-undefined)
  endif()
  target_include_directories(cpc_fake_cudart PRIVATE ${CMAKE_CURRENT_LIST_DIR})
  target_include_directories(cpc_fake_cudart SYSTEM PRIVATE ${CPC_CUDA_ROOT}/include)
  target_link_libraries(cpc_fake_cudart PRIVATE cpc_emu PkgConfig::CRYPTO Threads::Threads)

  # The fake NCCL (fake_nccl.c) beside it: <build>/emu-cudart/libnccl.so.2, SONAME
  # libnccl.so.2, nccl* exported unversioned like NVIDIA's (libnccl.map), linked to the
  # fake runtime (device pointers and streams are its own); the same LD_LIBRARY_PATH
  # makes cprun's libnccl.so.2 this one.
  add_library(cpc_fake_nccl SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_nccl.c)
  set_target_properties(cpc_fake_nccl PROPERTIES
    PREFIX "lib" OUTPUT_NAME "nccl" SUFFIX ".so.2" NO_SONAME ON
    C_VISIBILITY_PRESET hidden
    LIBRARY_OUTPUT_DIRECTORY ${CPC_FAKE_CUDART_DIR}
    LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/libnccl.map)
  target_link_options(cpc_fake_nccl PRIVATE -Wl,-soname,libnccl.so.2
    -Wl,--version-script=${CMAKE_CURRENT_LIST_DIR}/libnccl.map)
  if(NOT CPC_SANITIZE AND NOT CPC_FUZZ)
    target_link_options(cpc_fake_nccl PRIVATE -Wl,--no-undefined)
  endif()
  target_include_directories(cpc_fake_nccl SYSTEM PRIVATE ${CPC_CUDA_ROOT}/include)
  target_link_libraries(cpc_fake_nccl PRIVATE cpc_fake_cudart)

  # The public rank API on the CUDA backend (caller's device tensors and stream),
  # run by tests/cli/cuda_emu.sh on the fake runtime: emu-cudart/rank_cuda_emu PLAN.cplan
  add_executable(rank_cuda_emu ${CMAKE_CURRENT_LIST_DIR}/rank_cuda_emu.c)
  set_target_properties(rank_cuda_emu PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CPC_FAKE_CUDART_DIR})
  target_include_directories(rank_cuda_emu SYSTEM PRIVATE ${CPC_CUDA_ROOT}/include)
  target_include_directories(rank_cuda_emu PRIVATE ${PROJECT_SOURCE_DIR}/tests) # test_random.h
  target_link_libraries(rank_cuda_emu PRIVATE cpc_internal Threads::Threads)
  add_dependencies(rank_cuda_emu cpc_fake_cudart)

  # NCCL ranks of the public rank API without MPI in libcpc (cpc_rank_new_nccl_id,
  # cpc_rank_new_nccl), one process per rank, run by tests/cli/nccl_emu.sh under mpirun:
  # emu-cudart/rank_nccl_emu PLAN.cplan
  if(CPC_NCCL_LIB AND MPI_C_FOUND)
    add_executable(rank_nccl_emu ${CMAKE_CURRENT_LIST_DIR}/rank_nccl_emu.c)
    set_target_properties(rank_nccl_emu PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CPC_FAKE_CUDART_DIR})
    target_include_directories(rank_nccl_emu SYSTEM PRIVATE ${CPC_CUDA_ROOT}/include)
    target_include_directories(rank_nccl_emu PRIVATE ${PROJECT_SOURCE_DIR}/tests) # test_random.h
    target_link_libraries(rank_nccl_emu PRIVATE cpc_internal MPI::MPI_C ${CPC_NCCL_LIB})
    add_dependencies(rank_nccl_emu cpc_fake_cudart cpc_fake_nccl)
  endif()

  add_executable(cpc_emu_prepare ${CMAKE_CURRENT_LIST_DIR}/prepare.c)
  set_target_properties(cpc_emu_prepare PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CPC_FAKE_CUDART_DIR})
  target_link_libraries(cpc_emu_prepare PRIVATE cpc_internal cpc_emu)

  # The fake's own semantics (a Criterion test linked against the fake itself).
  if(CRITERION_FOUND)
    add_executable(test_fake_cudart ${CMAKE_CURRENT_LIST_DIR}/test_fake_cudart.c)
    target_include_directories(test_fake_cudart SYSTEM PRIVATE ${CPC_CUDA_ROOT}/include)
    target_link_libraries(test_fake_cudart PRIVATE cpc_fake_cudart cpc_emu PkgConfig::CRYPTO
      PkgConfig::CRITERION)
    # The fake NCCL's semantics: ranks as threads, each on its own emulated device.
    add_executable(test_fake_nccl ${CMAKE_CURRENT_LIST_DIR}/test_fake_nccl.c)
    target_include_directories(test_fake_nccl SYSTEM PRIVATE ${CPC_CUDA_ROOT}/include)
    target_link_libraries(test_fake_nccl PRIVATE cpc_fake_nccl cpc_fake_cudart
      PkgConfig::CRITERION Threads::Threads)
    add_test(NAME test_fake_nccl COMMAND test_fake_nccl --jobs=1)
    set_tests_properties(test_fake_nccl PROPERTIES TIMEOUT 120 ENVIRONMENT
      "CPC_EMU_DEVICES=4;CPC_FAKE_NCCL_TIMEOUT=30")
    add_test(NAME test_fake_cudart COMMAND test_fake_cudart --jobs=1)
    set_tests_properties(test_fake_cudart PROPERTIES TIMEOUT 300 ENVIRONMENT
      "CPC_FAKE_TEST_DIR=${CPC_FAKE_CUDART_DIR}/test-modules;CPC_EMU_DEVICES=1")

    # The CUDA backend through the backend conformance suite (tests/backend_conformance.h)
    # on the fake runtime: linked like any CUDA program (cpc_internal -> libcudart.so.13),
    # LD_LIBRARY_PATH makes the fake win over the RUNPATH; modules built on first use
    # under emu-cudart/conformance-modules, NVRTC output cached under kernel-cache.
    if(TARGET cpc_backend_conformance OR EXISTS ${CMAKE_SOURCE_DIR}/tests/backend_conformance.c)
      add_executable(test_backend_cuda_emu ${CMAKE_CURRENT_LIST_DIR}/test_backend_cuda_emu.c)
      target_link_libraries(test_backend_cuda_emu PRIVATE cpc_backend_conformance cpc_internal
        cpc_emu PkgConfig::CRYPTO PkgConfig::CRITERION ${CMAKE_DL_LIBS})
      add_dependencies(test_backend_cuda_emu cpc_fake_cudart)
      add_test(NAME test_backend_cuda_emu COMMAND test_backend_cuda_emu --jobs=1
        WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
      set_tests_properties(test_backend_cuda_emu PROPERTIES TIMEOUT 1200 ENVIRONMENT
        "LD_LIBRARY_PATH=${CPC_FAKE_CUDART_DIR};CPC_EMU_MODULES=${CPC_FAKE_CUDART_DIR}/conformance-modules;CPC_CACHE_DIR=${CMAKE_BINARY_DIR}/kernel-cache;CPC_EMU_DEVICES=1;OPENBLAS_NUM_THREADS=1")
    endif()
  endif()

endif()
