# Runs coccl-sim at RANKS ranks and checks what it reports: it exits 0, prints the summary line
# and the model, and its JSON says that every all_reduce and split was verified, phase by phase.
# With -DBOOTSTRAP=launcher the world forms from a launcher's table: no root anywhere.
# cmake -DSIM=<coccl-sim> -DRANKS=<n> [-DROOTS=<k> | -DBOOTSTRAP=launcher] -DOUT=<dir>
#       -P sim_check.cmake
if(NOT DEFINED ROOTS)
  set(ROOTS 1)
endif()
if(NOT DEFINED BOOTSTRAP)
  set(BOOTSTRAP root)
endif()
set(json "${OUT}/coccl_sim_${RANKS}_${ROOTS}_${BOOTSTRAP}.json")
file(REMOVE "${json}")
set(how --roots ${ROOTS})
if(BOOTSTRAP STREQUAL "launcher")
  set(how --bootstrap launcher)
endif()
execute_process(COMMAND "${SIM}" --ranks ${RANKS} ${how} --json "${json}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "coccl-sim exited with ${rc}")
endif()
foreach(want "total            ranks ${RANKS} | rounds "
        "modelled init + first all_reduce at ${RANKS} ranks: "
        "model: per phase, rounds x (latency + m)" "verified: every all_reduce and split")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "coccl-sim did not print '${want}'")
  endif()
endforeach()

file(READ "${json}" doc)
string(JSON verified GET "${doc}" verified)
string(JSON ranks GET "${doc}" ranks)
if(NOT verified STREQUAL "ON" OR NOT ranks EQUAL RANKS)
  message(FATAL_ERROR "JSON: verified ${verified}, ranks ${ranks} (want ON, ${RANKS})")
endif()
# init, the world's all_reduce, a split and an all_reduce per group size (8 and RANKS/8), destroy.
string(JSON phases LENGTH "${doc}" phases)
if(NOT phases EQUAL 7)
  message(FATAL_ERROR "JSON: ${phases} phases, want 7")
endif()
set(all_reduces 0)
math(EXPR last "${phases} - 1")
foreach(i RANGE ${last})
  string(JSON name GET "${doc}" phases ${i} name)
  string(JSON check GET "${doc}" phases ${i} verified)
  string(JSON rounds GET "${doc}" phases ${i} rounds)
  string(JSON model GET "${doc}" phases ${i} model_s)
  if(name MATCHES "^(all_reduce|split)")
    if(check STREQUAL "" OR check MATCHES "FAILED")
      message(FATAL_ERROR "JSON: phase ${name} not verified ('${check}')")
    endif()
    if(rounds LESS 1 OR NOT model GREATER 0)
      message(FATAL_ERROR "JSON: phase ${name} counted ${rounds} rounds, modelled ${model} s")
    endif()
  endif()
  if(name MATCHES "^all_reduce")
    math(EXPR all_reduces "${all_reduces} + 1")
  endif()
  # Splits form over the members' hypercube, without a root.
  string(JSON root GET "${doc}" phases ${i} root_messages)
  if(name MATCHES "^split" AND NOT root EQUAL 0)
    message(FATAL_ERROR "JSON: phase ${name}: a root handled ${root} messages; want none")
  endif()
endforeach()
if(NOT all_reduces EQUAL 3)
  message(FATAL_ERROR "JSON: ${all_reduces} all_reduce phases verified, want 3")
endif()
string(JSON root GET "${doc}" phases 0 root_messages)
if(BOOTSTRAP STREQUAL "launcher")
  # No coccl message at init: each rank read from the launcher the entries it keeps, log2 N + 5
  # at most (its hypercube partners, ring neighbours, tree parent and children).
  string(JSON msgs GET "${doc}" phases 0 max_messages value)
  string(JSON reads GET "${doc}" phases 0 launcher max_reads value)
  string(JSON fences GET "${doc}" phases 0 launcher fences)
  string(JSON puts GET "${doc}" phases 0 launcher puts)
  set(bits 0)
  set(v 1)
  while(v LESS RANKS)
    math(EXPR v "${v} * 2")
    math(EXPR bits "${bits} + 1")
  endwhile()
  math(EXPR most "${bits} + 5")
  math(EXPR want_puts "${RANKS} + 1")
  if(NOT root EQUAL 0 OR NOT msgs EQUAL 0 OR reads LESS 1 OR reads GREATER most
     OR NOT fences EQUAL 2 OR NOT puts EQUAL want_puts)
    message(FATAL_ERROR "JSON: init from the launcher: root ${root} and rank ${msgs} messages "
                        "(want 0), ${reads} reads (want 1 to ${most}), ${fences} fences (2), "
                        "${puts} values put (${want_puts})")
  endif()
  return()
endif()
# The busiest root takes one connection a host of its share, not one a rank: at least a message
# a host (coccl-sim puts 8 ranks on a host) and fewer messages than the ranks of its share (a
# rank that says hello itself costs the root three).
math(EXPR share "${RANKS} / ${ROOTS}")
math(EXPR hosts "${share} / 8")
if(root LESS hosts OR NOT root LESS share)
  message(FATAL_ERROR "JSON: the busiest root handled ${root} messages at init; want at least "
                      "${hosts} (its hosts) and fewer than ${share} (its ranks)")
endif()
