# Runs coccl-sim on one proxy thread and on two, and checks that the counts agree: virtual time
# advances only when every thread is idle and a round's messages reach each thread together, so
# spreading the ranks over threads changes the wall time, not what the ranks send or how many
# rounds it takes. Compared: init, the world's all_reduce, the split into contiguous groups of 8
# and their all_reduce: the busiest rank's and root's counts exactly, the rounds on the critical
# path within one, the totals within 2%. The order of one round's messages follows the order in
# which the threads wrote them, and that moves the rest: the rounds are a Lamport clock (a rank
# that answers before it takes another message of the same round stamps its answer one lower),
# and a credit returned while a link writes nothing else goes alone (the all_reduce of the groups
# of 8 sent 384 more 16-byte credits of 42,240 messages on two threads). The strided split's
# largest counts move by a few messages for the same reason, and destroy is driven from outside
# the threads: neither is compared.)
# cmake -DSIM=<coccl-sim> -DRANKS=<n> -DOUT=<dir> -P sim_threads_check.cmake
set(fields max_messages.value max_bytes.value max_links.value max_streams.value
    root_messages root_bytes)
foreach(threads 1 2)
  set(json "${OUT}/coccl_sim_threads_${RANKS}_${threads}.json")
  file(REMOVE "${json}")
  execute_process(COMMAND "${SIM}" --ranks ${RANKS} --roots 4 --groups 8 --threads ${threads}
                          --costs 12.6,0.515,93 --json "${json}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("--threads ${threads}:\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "coccl-sim --threads ${threads} exited with ${rc}")
  endif()
  string(FIND "${out}" "${threads} proxy thread(s)" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "coccl-sim did not run on ${threads} proxy thread(s)")
  endif()
  file(READ "${json}" doc)
  string(JSON verified GET "${doc}" verified)
  if(NOT verified STREQUAL "ON")
    message(FATAL_ERROR "--threads ${threads}: not every all_reduce and split was verified")
  endif()
  foreach(i RANGE 3)
    string(JSON name GET "${doc}" phases ${i} name)
    foreach(f rounds total_messages total_bytes)
      string(JSON ${f}_${threads}_${i} GET "${doc}" phases ${i} ${f})
    endforeach()
    set(values_${threads}_${i} "${name}")
    foreach(f ${fields})
      string(REPLACE "." ";" path "${f}")
      string(JSON v GET "${doc}" phases ${i} ${path})
      list(APPEND values_${threads}_${i} "${f}=${v}")
    endforeach()
  endforeach()
endforeach()
foreach(i RANGE 3)
  if(NOT values_1_${i} STREQUAL values_2_${i})
    message(FATAL_ERROR "counts differ between one thread and two:\n  1: ${values_1_${i}}\n"
                        "  2: ${values_2_${i}}")
  endif()
  math(EXPR apart "${rounds_1_${i}} - ${rounds_2_${i}}")
  if(apart GREATER 1 OR apart LESS -1)
    message(FATAL_ERROR "${values_1_${i}}: ${rounds_1_${i}} rounds on one thread, "
                        "${rounds_2_${i}} on two")
  endif()
  foreach(f total_messages total_bytes)
    math(EXPR apart "(${${f}_1_${i}} - ${${f}_2_${i}}) * 100")
    math(EXPR most "${${f}_1_${i}} * 2")
    if(apart GREATER most OR apart LESS -${most})
      message(FATAL_ERROR "${values_1_${i}}: ${f} ${${f}_1_${i}} on one thread, "
                          "${${f}_2_${i}} on two")
    endif()
  endforeach()
  message("same on one thread and two: ${values_1_${i}}; rounds ${rounds_1_${i}} and "
          "${rounds_2_${i}}; messages ${total_messages_1_${i}} and ${total_messages_2_${i}}")
endforeach()
