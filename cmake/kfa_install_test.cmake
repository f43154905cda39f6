# ctest driver: installs this build into a scratch prefix, then configures,
# builds and runs examples/ as an out-of-tree project that only does
# find_package(kfa). Proves the installed package is complete.
foreach(var BUILD_DIR SOURCE_DIR CXX_COMPILER Kokkos_DIR KokkosKernels_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "kfa_install_test.cmake needs -D${var}=...")
  endif()
endforeach()
set(prefix "${BUILD_DIR}/install-test")
set(consumer "${BUILD_DIR}/consumer-test")
file(REMOVE_RECURSE "${prefix}" "${consumer}")

function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}")
  endif()
endfunction()

run_step(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
# The Fortran example comes along where kfa was built with a Fortran compiler.
set(fortran_args)
if(Fortran_COMPILER)
  set(fortran_args -DCMAKE_Fortran_COMPILER=${Fortran_COMPILER})
endif()
run_step(${CMAKE_COMMAND} -S "${SOURCE_DIR}/examples" -B "${consumer}"
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER} ${fortran_args}
  -Dkfa_ROOT=${prefix} -DKokkos_DIR=${Kokkos_DIR} -DKokkosKernels_DIR=${KokkosKernels_DIR})
run_step(${CMAKE_COMMAND} --build "${consumer}" -j 2)
run_step("${consumer}/basic_attention" --seqlen 300 --heads 2 --head-dim 32 --repeat 1)
run_step("${consumer}/score_mod" --seqlen 300 --heads 2 --head-dim 32 --doc-length 50)
run_step("${consumer}/transformer_block" --seqlen 37 --repeat 40)
if(Fortran_COMPILER)
  run_step("${consumer}/fortran_block" 30 16)
endif()
if(EXISTS "${consumer}/surrogate")
  run_step("${consumer}/surrogate")
endif()
