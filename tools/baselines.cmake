# Baseline peers that coccl-perf spawns to time Gloo and Open MPI in the same run:
#   coccl-perf-gloo  (tools/baseline_gloo.cpp), built when Gloo is found;
#   coccl-perf-mpi   (tools/baseline_mpi.cpp), built when MPI with a C++ compiler wrapper is found.
# A missing peer is reported with a STATUS message and defines no target, so the rest of the build
# never depends on either library. When a peer is built, COCCL_HAVE_GLOO_BASELINE or
# COCCL_HAVE_MPI_BASELINE is set to ON in the including scope, and COCCL_MPIEXEC names the
# launcher that coccl-perf should use for coccl-perf-mpi.
include_guard(GLOBAL)

set(_coccl_baselines_dir "${CMAKE_CURRENT_LIST_DIR}")

# The sources use only our own code plus the libraries' public headers; the imported targets put
# those headers on the system include path, so -Werror applies to our code alone.
function(_coccl_baseline_target name source)
  add_executable(${name} "${_coccl_baselines_dir}/${source}")
  target_compile_features(${name} PRIVATE cxx_std_20)
  set_target_properties(${name} PROPERTIES CXX_EXTENSIONS OFF)
  target_compile_options(${name} PRIVATE -Wall -Wextra -Werror)
endfunction()

find_package(Threads QUIET)

# libgloo-dev ships a CMake package (GlooConfig.cmake) with an imported target `gloo`. Older or
# hand-built installs may lack it, so fall back to the header and the plain library.
find_package(Gloo CONFIG QUIET)
if(Gloo_FOUND AND TARGET gloo)
  set(_coccl_gloo_lib gloo)
else()
  find_path(COCCL_GLOO_INCLUDE_DIR gloo/rendezvous/file_store.h)
  find_library(COCCL_GLOO_LIBRARY gloo)
  if(COCCL_GLOO_INCLUDE_DIR AND COCCL_GLOO_LIBRARY)
    add_library(coccl_baseline_gloo_lib UNKNOWN IMPORTED)
    set_target_properties(coccl_baseline_gloo_lib PROPERTIES
      IMPORTED_LOCATION "${COCCL_GLOO_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${COCCL_GLOO_INCLUDE_DIR}")
    set(_coccl_gloo_lib coccl_baseline_gloo_lib)
  endif()
endif()

# COCCL_GLOO_BASELINE=OFF leaves coccl-perf-gloo out where no one times against Gloo: the test run
# of tools/bootstrap.sh, where its 56 s of compile ran no test.
option(COCCL_GLOO_BASELINE "Build coccl-perf-gloo when Gloo is found" ON)
if(NOT COCCL_GLOO_BASELINE)
  message(STATUS "coccl baselines: COCCL_GLOO_BASELINE=OFF, coccl-perf-gloo will not be built")
elseif(DEFINED _coccl_gloo_lib AND TARGET Threads::Threads)
  _coccl_baseline_target(coccl-perf-gloo baseline_gloo.cpp)
  target_link_libraries(coccl-perf-gloo PRIVATE ${_coccl_gloo_lib} Threads::Threads)
  set(COCCL_HAVE_GLOO_BASELINE ON)
  message(STATUS "coccl baselines: Gloo found, building coccl-perf-gloo")
else()
  message(STATUS "coccl baselines: Gloo not found, coccl-perf-gloo will not be built")
endif()

find_package(MPI QUIET COMPONENTS CXX)
if(MPI_CXX_FOUND)
  _coccl_baseline_target(coccl-perf-mpi baseline_mpi.cpp)
  # Only the C API is used; keep the deprecated C++ bindings out of the compile.
  target_compile_definitions(coccl-perf-mpi PRIVATE OMPI_SKIP_MPICXX MPICH_SKIP_MPICXX)
  target_link_libraries(coccl-perf-mpi PRIVATE MPI::MPI_CXX)
  set(COCCL_HAVE_MPI_BASELINE ON)
  set(COCCL_MPIEXEC "${MPIEXEC_EXECUTABLE}")
  message(STATUS "coccl baselines: MPI found, building coccl-perf-mpi"
                 " (launcher ${MPIEXEC_EXECUTABLE})")
else()
  message(STATUS "coccl baselines: MPI not found, coccl-perf-mpi will not be built")
endif()

unset(_coccl_gloo_lib)
