# The C interface (include/kfa/c_api.h, target kfa::kfa_c) and, where a
# Fortran compiler is found, its Fortran module (fortran/kfa.f90, target
# kfa::kfa_fortran). Included from the top-level CMakeLists.txt, whose scope
# enabled languages need (the examples use them too).
enable_language(C)
add_library(kfa_c src/c_api/c_api.cpp src/c_api/attention.cpp src/c_api/block.cpp)
add_library(kfa::kfa_c ALIAS kfa_c)
# Public: C and Fortran programs link through the C++ compiler with Kokkos'
# link options (-fopenmp), which CMake before 3.30 does not pass on from a
# static library's private dependencies. kfa's compile flags that reach
# them (-march, -fopenmp-simd) suit C and Fortran too; the C++ ones are
# guarded by language.
target_link_libraries(kfa_c PUBLIC kfa::kfa)
target_include_directories(kfa_c PUBLIC
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
install(TARGETS kfa_c EXPORT kfaTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(KFA_HAS_FORTRAN OFF)
if(KFA_ENABLE_FORTRAN)
  include(CheckLanguage)
  check_language(Fortran)
  if(CMAKE_Fortran_COMPILER)
    enable_language(Fortran)
    set(KFA_HAS_FORTRAN ON)
    add_library(kfa_fortran fortran/kfa.f90)
    add_library(kfa::kfa_fortran ALIAS kfa_fortran)
    set(kfa_fortran_modules ${CMAKE_CURRENT_BINARY_DIR}/fortran)
    set_target_properties(kfa_fortran PROPERTIES Fortran_MODULE_DIRECTORY ${kfa_fortran_modules})
    target_include_directories(kfa_fortran PUBLIC
      $<BUILD_INTERFACE:${kfa_fortran_modules}>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/kfa/fortran>)
    target_link_libraries(kfa_fortran PUBLIC kfa_c)
    install(TARGETS kfa_fortran EXPORT kfaTargets
      ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
      LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
      RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
    # The .mod file only suits the compiler that wrote it: the source comes
    # along for users of another Fortran compiler.
    install(FILES ${kfa_fortran_modules}/kfa.mod fortran/kfa.f90
      DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kfa/fortran)
    message(STATUS "kfa: Fortran module with ${CMAKE_Fortran_COMPILER}")
  else()
    message(STATUS "kfa: no Fortran compiler found; the Fortran module and its example are skipped")
  endif()
endif()
