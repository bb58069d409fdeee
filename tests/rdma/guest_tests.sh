# Runs in the Soft-RoCE guest (see run_guest.sh), from /opt/test: the ib unit tests, then the
# multi-process tests of every collective over ib. Exits non-zero if any failed.
#   guest_tests.sh [GTEST_FILTER]
filter=${1:-*}
rc=0
for t in ./ib_*_test; do
  echo "=== $t"
  "$t" --gtest_filter="$filter" || rc=1
done
echo "=== rdma_guest_test"
./rdma_guest_test --gtest_filter="$filter" || rc=1
exit $rc
