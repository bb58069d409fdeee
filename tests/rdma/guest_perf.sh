# Runs in the Soft-RoCE guest (see run_guest.sh): coccl-perf with its rank processes over the ib
# transport, all on the guest's one rxe device. Under emulation the figures show that the path
# works, not how fast it is.
#   guest_perf.sh [coccl-perf args...]      e.g. guest_perf.sh --ranks 2 -b 8 -e 1M -f 4
export COCCL_TRANSPORT=ib COCCL_TIMEOUT=300
exec ./coccl-perf "$@"
