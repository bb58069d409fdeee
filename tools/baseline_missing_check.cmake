# CTest check that coccl-perf fails, saying why, when a baseline it was asked for cannot run: a
# copy of coccl-perf without its peer programs beside it still prints its own table, names the
# missing program and exits 1.
#   cmake -DPERF=coccl-perf -DOUT=dir -DWITH_GLOO=ON|OFF -P baseline_missing_check.cmake
set(dir ${OUT}/baseline_missing)
file(REMOVE_RECURSE ${dir})
file(COPY ${PERF} DESTINATION ${dir})
get_filename_component(name ${PERF} NAME)
execute_process(COMMAND ${dir}/${name} --ranks 2 -b 8 -e 8 -n 2 -w 1 -R 1 --baseline gloo
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "exit ${rc}, not 1, without the gloo baseline's program: ${out}${err}")
endif()
if(NOT out MATCHES "Avg bus bandwidth")
  message(FATAL_ERROR "coccl's own table is missing: ${out}${err}")
endif()
if(WITH_GLOO)
  set(want "needs ${dir}/coccl-perf-gloo, which is not there")
else()
  set(want "the gloo baseline was not built")
endif()
string(FIND "${err}" "${want}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "stderr does not say \"${want}\": ${err}")
endif()
if(out MATCHES "coccl vs gloo")
  message(FATAL_ERROR "an empty comparison with gloo was printed: ${out}")
endif()
file(REMOVE_RECURSE ${dir})
