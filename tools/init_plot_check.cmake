# CTest check of coccl-init-bench --plot: a run of 2 and 3 ranks (with the Open MPI baseline when
# it was built) must print a row per rank count and write an SVG with the time axis and a series
# for each library; without gnuplot it still prints its rows, with one line of note and no plot.
#   cmake -DBENCH=coccl-init-bench -DOUT=dir -DWITH_MPI=ON|OFF -P init_plot_check.cmake

set(args --ranks 2,3 --repeat 1)
set(titles coccl)
if(WITH_MPI)
  list(APPEND args --baseline mpi)
  list(APPEND titles mpi)
endif()

# A row per rank count: the count, then a positive time per library (a failed run prints -1).
function(expect_rows out)
  foreach(n 2 3)
    if(NOT out MATCHES "\n +${n} +[0-9]+\\.[0-9]")
      message(FATAL_ERROR "no timed row for ${n} ranks:\n${out}")
    endif()
  endforeach()
  if(out MATCHES " -1\\.0")
    message(FATAL_ERROR "a run failed:\n${out}")
  endif()
endfunction()

# (coccl alone: mpirun needs PATH to start its daemons.)
execute_process(COMMAND ${CMAKE_COMMAND} -E env PATH=${OUT}/no-such-dir
                ${BENCH} --ranks 2,3 --repeat 1 --plot ${OUT}/init_never.svg
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(STRIP "${err}" err)
if(NOT rc EQUAL 0 OR NOT err MATCHES "^coccl-init-bench: gnuplot is not installed[^\n]*$"
   OR EXISTS ${OUT}/init_never.svg)
  message(FATAL_ERROR "without gnuplot: exit ${rc}, stderr '${err}'\n${out}")
endif()
expect_rows("${out}")

find_program(GNUPLOT gnuplot)
if(NOT GNUPLOT)
  message("gnuplot not found; skipped")
  return()
endif()
set(svg ${OUT}/init_plot_check.svg)
file(REMOVE ${svg})
execute_process(COMMAND ${BENCH} ${args} --plot ${svg} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0 OR NOT EXISTS ${svg})
  message(FATAL_ERROR "coccl-init-bench exited with ${rc}; ${svg} written: no")
endif()
expect_rows("${out}")
file(READ ${svg} text)
foreach(t IN LISTS titles ITEMS "init + first allreduce (ms)")
  string(FIND "${text}" "${t}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${svg} has no '${t}'")
  endif()
endforeach()
foreach(t IN LISTS titles)
  string(FIND "${text}" "<title>${t}</title>" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${svg} has no series titled '${t}'")
  endif()
endforeach()
message("${svg} holds the series ${titles}")
