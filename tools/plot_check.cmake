# CTest check of coccl-perf --plot: a 2-rank host run on small sizes (with the Open MPI baseline
# when it was built) must write an SVG that holds every series' title, and --plot-from must draw
# the same series from the run's --json file. Files that are not such a run are refused.
#   cmake -DPERF=coccl-perf -DOUT=dir -DWITH_MPI=ON|OFF -P plot_check.cmake

# Refusals need no gnuplot: exit status 2 and a line naming the file.
set(bad_inputs "{\"ranks\":2,\"results\":[{\"coll\":\"allreduce\"" "[1,2]"
  "{\"ranks\":0,\"type\":\"float32\",\"results\":[]}"
  "{\"ranks\":2,\"type\":\"float32\",\"results\":[{\"coll\":\"nosuch\",\"bytes\":8}]}")
set(i 0)
foreach(text IN LISTS bad_inputs)
  set(bad ${OUT}/plot_check_bad${i}.json)
  file(WRITE ${bad} "${text}")
  execute_process(COMMAND ${PERF} --plot-from ${bad} --plot ${OUT}/never.svg RESULT_VARIABLE rc
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "is not a coccl-perf --json run")
    message(FATAL_ERROR "--plot-from accepted '${text}' (exit ${rc}): ${err}")
  endif()
  math(EXPR i "${i} + 1")
endforeach()
if(EXISTS ${OUT}/never.svg)
  message(FATAL_ERROR "a refused --plot-from wrote a plot")
endif()

# Without gnuplot (a PATH that has none) the run still finishes and prints its table, with one
# line of note on stderr and no plot.
execute_process(COMMAND ${CMAKE_COMMAND} -E env PATH=${OUT}/no-such-dir
                ${PERF} --ranks 2 -b 8 -e 64 -f 8 -n 2 -w 1 --plot ${OUT}/never.svg
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(STRIP "${err}" err)
string(REGEX MATCHALL "\n" breaks "${err}")
list(LENGTH breaks n_breaks)
if(NOT rc EQUAL 0 OR NOT out MATCHES "Avg bus bandwidth" OR NOT n_breaks EQUAL 0
   OR NOT err MATCHES "gnuplot is not installed" OR EXISTS ${OUT}/never.svg)
  message(FATAL_ERROR "without gnuplot: exit ${rc}, stderr '${err}'\n${out}")
endif()

find_program(GNUPLOT gnuplot)
if(NOT GNUPLOT)
  message("gnuplot not found; skipped")
  return()
endif()
set(svg ${OUT}/plot_check.svg)
file(REMOVE ${svg})
set(json ${OUT}/plot_check.json)
set(args --ranks 2 -b 8 -e 64K -f 8 -n 5 -w 1 -R 1 --plot ${svg} --json ${json})
set(titles coccl)
if(WITH_MPI)
  list(APPEND args --baseline mpi)
  list(APPEND titles mpi)
endif()
execute_process(COMMAND ${PERF} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "coccl-perf exited with ${rc}")
endif()
if(NOT EXISTS ${svg})
  message(FATAL_ERROR "${svg} was not written")
endif()
# Fails unless the SVG `file` holds a series titled each of `titles`.
function(expect_series file titles)
  file(READ ${file} text)
  foreach(t IN LISTS titles)
    string(FIND "${text}" "<title>${t}</title>" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${file} has no series titled '${t}'")
    endif()
  endforeach()
endfunction()

expect_series(${svg} "${titles}")
file(READ ${svg} text)
string(FIND "${text}" "bus bandwidth (GB/s)" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${svg} has no bandwidth panel")
endif()

set(again ${OUT}/plot_check_again.svg)
file(REMOVE ${again})
execute_process(COMMAND ${PERF} --plot-from ${json} --plot ${again} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS ${again})
  message(FATAL_ERROR "--plot-from ${json} exited with ${rc}, no plot: ${out}${err}")
endif()
expect_series(${again} "${titles}")
message("${svg} holds the series ${titles}")

# Size marks sit at powers of 16 from 1 B, also on a short range (256 MiB to 1 GiB once showed
# "95 MiB", a power of 10).
set(short ${OUT}/plot_check_short.json)
set(row "\"coll\":\"allreduce\",\"time_us_inplace\":0,\"wrong\":0")
file(WRITE ${short} "{\"ranks\":2,\"device\":\"cuda\",\"type\":\"float32\",\"op\":\"sum\",\"results\":[\
{${row},\"bytes\":268435456,\"count\":67108864,\"time_us\":1000,\"busbw\":268},\
{${row},\"bytes\":1073741824,\"count\":268435456,\"time_us\":4000,\"busbw\":268}]}")
set(marks ${OUT}/plot_check_short.svg)
file(REMOVE ${marks})
execute_process(COMMAND ${PERF} --plot-from ${short} --plot ${marks} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS ${marks})
  message(FATAL_ERROR "--plot-from ${short} exited with ${rc}, no plot: ${out}${err}")
endif()
file(READ ${marks} text)
string(REGEX MATCHALL ">[0-9.]+ [kMG]iB<" labels "${text}")
set(powers_of_16 ">4 kiB<" ">64 kiB<" ">1 MiB<" ">16 MiB<" ">256 MiB<" ">4 GiB<")
list(FIND labels ">256 MiB<" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${marks}: no mark at 256 MiB (marks: ${labels})")
endif()
foreach(l IN LISTS labels)
  list(FIND powers_of_16 "${l}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${marks}: a size mark that is no power of 16: ${l} (marks: ${labels})")
  endif()
endforeach()
message("${marks} marks sizes at ${labels}")
