#!/usr/bin/env bash
# tests/targets_env_test.sh MHA_RUN — MHA_TARGETS restricts dispatch for the whole process.
#
# On an x86 CPU with AVX2: MHA_TARGETS=AVX2 (any case) makes the kernels dispatch AVX2 and keeps
# BLIS off its AVX-512 configurations (skx, knl); a name that is no supported target is said on
# stderr, naming it, and changes nothing. Skips (77) elsewhere. Under a cross build meson names
# the emulator that runs target binaries in MESON_EXE_WRAPPER.
set -euo pipefail
program=${1:?usage: targets_env_test.sh MHA_RUN}
read -r -a wrapper <<< "${MESON_EXE_WRAPPER:-}"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
default=$(env -u MHA_TARGETS "${wrapper[@]}" "$program" --version)
case "$default" in
  *"SIMD target: AVX3"* | *"SIMD target: AVX2"*) ;;
  *) echo "SKIP: no AVX2 target here: $default"; exit 77 ;;
esac

forced=$(MHA_TARGETS=avx2 "${wrapper[@]}" "$program" --version)
case "$forced" in
  *"SIMD target: AVX2"*) ;;
  *) fail "MHA_TARGETS=avx2: expected SIMD target AVX2, got: $forced" ;;
esac
case "$forced" in
  *"BLAS arch: skx"* | *"BLAS arch: knl"*) fail "MHA_TARGETS=avx2 left BLIS on AVX-512: $forced" ;;
  *"BLAS arch: "*) ;;
  *) fail "MHA_TARGETS=avx2: expected a line 'BLAS arch: ...', got: $forced" ;;
esac
echo "ok: MHA_TARGETS=avx2 -> $(echo "$forced" | tr '\n' ' ')"

stderr_file=$(mktemp)
trap 'rm -f "$stderr_file"' EXIT
bogus=$(MHA_TARGETS=NOT_A_TARGET "${wrapper[@]}" "$program" --version 2> "$stderr_file")
message=$(cat "$stderr_file")
case "$message" in
  *"MHA_TARGETS"*"NOT_A_TARGET"*"ignored"*) ;;
  *) fail "MHA_TARGETS=NOT_A_TARGET: expected a message naming it on stderr, got '$message'" ;;
esac
[ "$bogus" = "$default" ] || fail "an unknown MHA_TARGETS changed the dispatch: $bogus"
echo "ok: an unknown MHA_TARGETS is reported and ignored"
echo "targets env test passed"
