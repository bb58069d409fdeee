# Runs coccl-sim on one proxy thread and on two, and checks that every count agrees exactly:
# virtual time advances only when every thread is idle, each round serves its streams in an order
# set by the dialling parties (not by which thread wrote first), and a phase ends once the network
# is quiet (its last credits read), so spreading the ranks over threads changes the wall time,
# not what the ranks send, when, or how many rounds it takes. Compared for every phase but
# destroy (driven by blocking calls from outside the threads, its rounds count when they came):
# init, the world's all_reduce, the splits into contiguous groups of 8 and into strided groups of
# 256 and their all_reduce; the busiest rank's and root's counts, the rounds on the critical path
# and the totals.
# cmake -DSIM=<coccl-sim> -DRANKS=<n> -DOUT=<dir> -P sim_threads_check.cmake
set(fields max_messages.value max_bytes.value max_links.value max_streams.value
    root_messages root_bytes rounds total_messages total_bytes)
set(phases 6)
math(EXPR last "${phases} - 1")
math(EXPR with_destroy "${phases} + 1")
foreach(threads 1 2)
  set(json "${OUT}/coccl_sim_threads_${RANKS}_${threads}.json")
  file(REMOVE "${json}")
  execute_process(COMMAND "${SIM}" --ranks ${RANKS} --roots 4 --groups 8,256 --threads ${threads}
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
  string(JSON got LENGTH "${doc}" phases)
  if(NOT got EQUAL with_destroy)
    message(FATAL_ERROR "--threads ${threads}: ${got} phases, want ${phases} and destroy")
  endif()
  foreach(i RANGE ${last})
    string(JSON name GET "${doc}" phases ${i} name)
    set(values_${threads}_${i} "${name}")
    foreach(f ${fields})
      string(REPLACE "." ";" path "${f}")
      string(JSON v GET "${doc}" phases ${i} ${path})
      list(APPEND values_${threads}_${i} "${f}=${v}")
    endforeach()
  endforeach()
endforeach()
foreach(i RANGE ${last})
  if(NOT values_1_${i} STREQUAL values_2_${i})
    message(FATAL_ERROR "counts differ between one thread and two:\n  1: ${values_1_${i}}\n"
                        "  2: ${values_2_${i}}")
  endif()
  message("same on one thread and two: ${values_1_${i}}")
endforeach()
