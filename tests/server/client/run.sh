#!/bin/sh
# ctest's server_client: every client test with `node --test`. The tests serve ../shared/fixtures/tiny.gguf
# (QRIG_SHARED_DIR, else QRIG_SHARED_DIR_DEFAULT from CMake), except operate.test.mjs, which serves a
# `qrig synth` model: without the fixtures only that file runs, after one line saying what is missing; the run
# then fails unless missing inputs are allowed (QRIG_TESTS_ALLOW_MISSING=1 outside CI, tests/missing_input.h).
# Arguments: node, then test files to run (all of them when none are given; ctest's server_client_pipeline names
# a subset and sets QRIG_TEST_RIG).
node=${1:-node}
[ $# -gt 0 ] && shift
shared=${QRIG_SHARED_DIR:-${QRIG_SHARED_DIR_DEFAULT:-../../../../shared}}
export QRIG_SHARED_DIR="$shared"
if [ -f "$shared/fixtures/tiny.gguf" ]; then
  exec "$node" --test --test-concurrency=1 "$@"
fi
allowed=0
case "${CI:-}" in ""|0|false) [ "${QRIG_TESTS_ALLOW_MISSING:-}" = 1 ] && allowed=1 ;; esac
if [ $allowed = 1 ]; then
  echo "SKIPPED: the client tests that serve the tiny fixture ($shared/fixtures/tiny.gguf is missing; set QRIG_SHARED_DIR); operate.test.mjs runs (QRIG_TESTS_ALLOW_MISSING=1)"
else
  echo "missing test input: $shared/fixtures/tiny.gguf (set QRIG_SHARED_DIR); only operate.test.mjs runs and the test fails (set QRIG_TESTS_ALLOW_MISSING=1 to skip on purpose outside CI)"
fi
"$node" --test --test-concurrency=1 operate.test.mjs || exit 1
[ $allowed = 1 ] && exit 0
exit 1
