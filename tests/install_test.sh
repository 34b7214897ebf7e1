#!/usr/bin/env bash
# tests/install_test.sh BUILDDIR — the installed package works for a consumer.
#
# Installs BUILDDIR into a temporary DESTDIR (meson install --destdir, no rebuild), then checks:
#   - the installed tree: headers (mha.h, mha.hpp, types.hpp), libmha.so + libmha.a, mha.pc;
#   - mha.pc: Libs/Cflags, and that static linking gets Highway, BLIS and pthread
#     (pkg-config --static);
#   - libmha.so exports only the API: mha_* C functions and mha:: C++ symbols (no Highway,
#     BLIS, nlohmann or libstdc++ template instantiations);
#   - a C99 program (mha.h, built with -Werror -Wpedantic) and a C++17 program (mha.hpp and mha.h
#     in one translation unit) compiled against the *installed* tree through pkg-config, with
#     the prefix redirected into the DESTDIR (--define-variable=prefix=...), run with
#     LD_LIBRARY_PATH: both print the same forward result;
#   - both programs linked statically against libmha.a with pkg-config --static, run without
#     libmha.so;
#   - the CMake package (lib/.../cmake/mha/mhaConfig.cmake, mhaConfigVersion.cmake): the same two
#     programs built by a CMake project with find_package(mha 0.6 CONFIG REQUIRED) against the
#     DESTDIR tree (CMAKE_PREFIX_PATH), linked to mha::mha (shared, loaded through the build
#     RPATH CMake records) and mha::mha_static (no libmha.so), agreeing with the pkg-config
#     builds; find_package(mha 0.7) refuses the 0.6 package.
# Prints one "ok: ..." line per check; exits 1 on the first failure, 77 (skip) when pkg-config,
# cmake, ninja or a compiler is missing.
set -euo pipefail

builddir=${1:?usage: install_test.sh BUILDDIR}
builddir=$(cd "$builddir" && pwd)
CC=${CC:-cc}
CXX=${CXX:-c++}
for tool in pkg-config cmake ninja nm c++filt "$CC" "$CXX"; do
  if ! command -v "$tool" > /dev/null; then
    echo "SKIP: $tool not found"
    exit 77
  fi
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mha_install_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# --- Install -----------------------------------------------------------------------------------
meson install -C "$builddir" --destdir "$tmp/dest" --no-rebuild > "$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "meson install --destdir failed"; }
pc=$(find "$tmp/dest" -name mha.pc -print -quit)
[ -n "$pc" ] || fail "mha.pc was not installed"
pcdir=$(dirname "$pc")
prefix=$(sed -n 's/^prefix=//p' "$pc")
root="$tmp/dest$prefix"
export PKG_CONFIG_PATH="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pkg() { pkg-config --define-variable=prefix="$root" "$@" mha; }
incdir=$(pkg --variable=includedir)
libdir=$(pkg --variable=libdir)
for f in "$incdir/mha/mha.h" "$incdir/mha/mha.hpp" "$incdir/mha/types.hpp" "$libdir/libmha.a" \
  "$libdir/cmake/mha/mhaConfig.cmake" "$libdir/cmake/mha/mhaConfigVersion.cmake"; do
  [ -f "$f" ] || fail "not installed: ${f#"$tmp/dest"}"
done
[ -e "$libdir/libmha.so" ] || fail "not installed: ${libdir#"$tmp/dest"}/libmha.so"
echo "ok: installed headers, libmha.so, libmha.a, mha.pc and the CMake package under $prefix"

# --- pkg-config metadata -----------------------------------------------------------------------
libs=$(pkg --libs)
case " $libs " in *" -lmha "*) ;; *) fail "pkg-config --libs mha: expected -lmha, got '$libs'" ;; esac
cflags=$(pkg --cflags)
case "$cflags" in *"$incdir"*) ;; *) fail "pkg-config --cflags mha: expected -I$incdir, got '$cflags'" ;; esac
static_libs=$(pkg --static --libs)
for want in -lhwy -lblis; do
  case " $static_libs " in
    *" $want "*) ;;
    *) fail "pkg-config --static --libs mha: missing $want (Libs.private / Requires.private), got '$static_libs'" ;;
  esac
done
case " $static_libs " in
  *" -pthread "* | *" -lpthread "*) ;;
  *) fail "pkg-config --static --libs mha: missing -pthread, got '$static_libs'" ;;
esac
echo "ok: mha.pc: $libs; static: $static_libs"

# --- Exported symbols --------------------------------------------------------------------------
nm -D --defined-only "$libdir/libmha.so" | c++filt > "$tmp/symbols.txt"
# Column 3 onwards is the (demangled) name.
leaks=$(cut -d' ' -f3- "$tmp/symbols.txt" | grep -v -E '^(mha_[a-z0-9_]+|mha::.*)$' || true)
if [ -n "$leaks" ]; then
  echo "$leaks" | sed -n 1,20p >&2  # sed reads to the end: no SIGPIPE under pipefail
  fail "libmha.so exports $(echo "$leaks" | wc -l) non-API symbol(s) (first 20 above)"
fi
capi=$(grep -c -E ' mha_[a-z0-9_]+$' "$tmp/symbols.txt" || true)
[ "$capi" -ge 17 ] || fail "libmha.so exports $capi mha_* functions, expected at least 17"
echo "ok: libmha.so exports only API symbols ($(wc -l < "$tmp/symbols.txt") in all, $capi C functions)"

# --- Consumer programs -------------------------------------------------------------------------
# Both run the same layer: E 4, H 2, packed weights with a fixed pattern, query [L 3, N 1, E 4].
cat > "$tmp/consumer.c" <<'EOF'
#include <stdio.h>
#include <string.h>

#include <mha/mha.h>

int main(void) {
  enum { E = 4, L = 3 };
  float w_in[3 * E * E], b_in[3 * E], w_out[E * E], b_out[E], query[L * E], output[L * E];
  mha_layer_config config;
  mha_layer_weights weights;
  mha_context_options options;
  mha_attention_inputs inputs;
  mha_tensor out;
  mha_layer* layer = NULL;
  mha_context* context = NULL;
  int i;
  for (i = 0; i < 3 * E * E; ++i) w_in[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
  for (i = 0; i < 3 * E; ++i) b_in[i] = (float)i / 20.0f;
  for (i = 0; i < E * E; ++i) w_out[i] = (float)((i * 5) % 9) / 9.0f - 0.4f;
  for (i = 0; i < E; ++i) b_out[i] = 0.1f * (float)i;
  for (i = 0; i < L * E; ++i) query[i] = (float)((i * 3) % 7) / 7.0f;
  if (mha_layer_config_init(&config) != MHA_STATUS_OK) return 1;
  config.embed_dim = E;
  config.num_heads = 2;
  memset(&weights, 0, sizeof(weights));
  weights.in_proj_weight = w_in;
  weights.in_proj_bias = b_in;
  weights.out_proj_weight = w_out;
  weights.out_proj_bias = b_out;
  memset(&options, 0, sizeof(options));
  options.num_threads = 1;
  memset(&inputs, 0, sizeof(inputs));
  inputs.query.data = query;
  inputs.query.dtype = MHA_DTYPE_F32;
  inputs.query.rank = 3;
  inputs.query.shape[0] = L;
  inputs.query.shape[1] = 1;
  inputs.query.shape[2] = E;
  out = inputs.query;
  out.data = output;
  if (mha_layer_create(&config, &weights, MHA_WEIGHTS_COPY, &layer) != MHA_STATUS_OK ||
      mha_context_create(&options, &context) != MHA_STATUS_OK ||
      mha_layer_forward(layer, context, &inputs, &out, NULL, MHA_FORWARD_CAUSAL) != MHA_STATUS_OK) {
    fprintf(stderr, "C consumer: %s\n", mha_last_error_message());
    return 1;
  }
  /* A NULL argument is an error with a message, not a crash. */
  if (mha_layer_forward(layer, NULL, &inputs, &out, NULL, 0) != MHA_STATUS_INVALID_ARGUMENT ||
      strstr(mha_last_error_message(), "context") == NULL) {
    fprintf(stderr, "C consumer: NULL context not reported\n");
    return 1;
  }
  printf("mha %s\n", mha_version());
  for (i = 0; i < L * E; ++i) printf("%.9g\n", output[i]);
  mha_context_destroy(context);
  mha_layer_destroy(layer);
  return 0;
}
EOF
cat > "$tmp/consumer.cc" <<'EOF'
#include <cstdio>
#include <memory>

#include <mha/mha.h>
#include <mha/mha.hpp>

int main() {
  constexpr int E = 4, L = 3;
  float w_in[3 * E * E], b_in[3 * E], w_out[E * E], b_out[E], query[L * E], output[L * E];
  for (int i = 0; i < 3 * E * E; ++i) w_in[i] = static_cast<float>((i * 7) % 11) / 11.0f - 0.5f;
  for (int i = 0; i < 3 * E; ++i) b_in[i] = static_cast<float>(i) / 20.0f;
  for (int i = 0; i < E * E; ++i) w_out[i] = static_cast<float>((i * 5) % 9) / 9.0f - 0.4f;
  for (int i = 0; i < E; ++i) b_out[i] = 0.1f * static_cast<float>(i);
  for (int i = 0; i < L * E; ++i) query[i] = static_cast<float>((i * 3) % 7) / 7.0f;
  mha::AttentionConfig config;
  config.embed_dim = E;
  config.num_heads = 2;
  mha::AttentionWeights w;
  w.in_proj_weight = w_in;
  w.in_proj_bias = b_in;
  w.out_proj_weight = w_out;
  w.out_proj_bias = b_out;
  std::unique_ptr<mha::MultiheadAttention> layer;
  std::unique_ptr<mha::Context> context;
  mha::ContextOptions options;
  options.num_threads = 1;
  const int64_t shape[3] = {L, 1, E};
  mha::AttentionInputs in;
  mha::AttentionOutputs out;
  mha::Status s = mha::MultiheadAttention::Create(config, w, mha::WeightBinding::kView, &layer);
  if (s.ok()) s = mha::Context::Create(options, &context);
  if (s.ok()) s = mha::TensorView::Dense(query, mha::DType::kF32, 3, shape, &in.query, "query");
  if (s.ok()) s = mha::TensorView::Dense(output, mha::DType::kF32, 3, shape, &out.output, "output");
  in.causal = true;
  if (s.ok()) s = layer->Forward(*context, in, out);
  if (!s.ok()) {
    std::fprintf(stderr, "C++ consumer: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("mha %s\n", mha_version());
  for (float v : output) std::printf("%.9g\n", v);
  return 0;
}
EOF

# shellcheck disable=SC2046  # pkg-config output is a list of words
"$CC" -std=c99 -Wall -Wextra -Wpedantic -Werror $(pkg --cflags) "$tmp/consumer.c" -o "$tmp/c_shared" \
  $(pkg --libs) || fail "compiling the C consumer against the installed tree"
# shellcheck disable=SC2046
"$CXX" -std=c++17 -Wall -Wextra -Werror $(pkg --cflags) "$tmp/consumer.cc" -o "$tmp/cc_shared" \
  $(pkg --libs) || fail "compiling the C++ consumer against the installed tree"
LD_LIBRARY_PATH="$libdir" "$tmp/c_shared" > "$tmp/c_shared.out" || fail "the C consumer failed"
LD_LIBRARY_PATH="$libdir" "$tmp/cc_shared" > "$tmp/cc_shared.out" || fail "the C++ consumer failed"
# ldd's output is captured before it is matched: `ldd | grep -q` under pipefail fails at random
# when grep exits at its first match while ldd still writes (SIGPIPE, status 141).
deps=$(LD_LIBRARY_PATH="$libdir" ldd "$tmp/c_shared")
case "$deps" in
  *"$libdir/libmha.so"*) ;;
  *) fail "the C consumer did not load the installed libmha.so: $deps" ;;
esac
version=$(head -1 "$tmp/c_shared.out")
[ "$(wc -l < "$tmp/c_shared.out")" -eq 13 ] || fail "the C consumer printed $(cat "$tmp/c_shared.out")"
cmp -s "$tmp/c_shared.out" "$tmp/cc_shared.out" ||
  fail "C and C++ consumers disagree: $(paste "$tmp/c_shared.out" "$tmp/cc_shared.out" | tr '\n' ' ')"
echo "ok: C99 and C++17 consumers built with pkg-config against the installed shared library agree ($version)"

# Static: the same programs against libmha.a (-l:libmha.a instead of -lmha), no libmha.so at run
# time.
static_flags=$(pkg --static --libs | sed 's/-lmha\b/-l:libmha.a/')
# shellcheck disable=SC2046,SC2086
"$CXX" -std=c++17 $(pkg --cflags) "$tmp/consumer.cc" -o "$tmp/cc_static" $static_flags ||
  fail "linking the C++ consumer statically with: $static_flags"
# shellcheck disable=SC2046,SC2086
"$CC" -std=c99 $(pkg --cflags) "$tmp/consumer.c" -o "$tmp/c_static" $static_flags ||
  fail "linking the C consumer statically with: $static_flags (a C program needs libstdc++ from Libs.private)"
for prog in c_static cc_static; do
  deps=$(ldd "$tmp/$prog")
  case "$deps" in *libmha*) fail "$prog still needs libmha.so: $deps" ;; esac
  "$tmp/$prog" > "$tmp/$prog.out" || fail "$prog failed"
  cmp -s "$tmp/$prog.out" "$tmp/c_shared.out" || fail "$prog disagrees with the shared build"
done
echo "ok: C and C++ consumers linked statically with pkg-config --static agree"

# --- CMake package -----------------------------------------------------------------------------
# The same programs, built by CMake from the installed package only: CMAKE_PREFIX_PATH points at
# the DESTDIR tree, whose lib/<multiarch>/cmake/mha CMake searches by itself.
mkdir -p "$tmp/cmake_consumer"
cp "$tmp/consumer.c" "$tmp/consumer.cc" "$tmp/cmake_consumer/"
cat > "$tmp/cmake_consumer/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(mha_consumer C CXX)
find_package(mha 0.6 CONFIG REQUIRED)
message(STATUS "mha_DIR=${mha_DIR} mha_VERSION=${mha_VERSION}")
foreach(kind shared static)
  set(target mha::mha)
  if(kind STREQUAL "static")
    set(target mha::mha_static)
  endif()
  add_executable(c_${kind} consumer.c)
  set_target_properties(c_${kind} PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
  target_compile_options(c_${kind} PRIVATE -Wall -Wextra -Wpedantic -Werror)
  target_link_libraries(c_${kind} PRIVATE ${target})
  add_executable(cc_${kind} consumer.cc)
  set_target_properties(cc_${kind} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
  target_compile_options(cc_${kind} PRIVATE -Wall -Wextra -Werror)
  target_link_libraries(cc_${kind} PRIVATE ${target})
endforeach()
EOF
cmake -S "$tmp/cmake_consumer" -B "$tmp/cmake_build" -G Ninja -DCMAKE_PREFIX_PATH="$root" \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" > "$tmp/cmake.log" 2>&1 ||
  { cat "$tmp/cmake.log" >&2; fail "configuring the CMake consumer with find_package(mha CONFIG)"; }
cmake_log=$(cat "$tmp/cmake.log")
case "$cmake_log" in
  *"mha_DIR=$libdir/cmake/mha mha_VERSION=0.6.0"*) ;;
  *) fail "find_package(mha) did not find the installed package in $libdir/cmake/mha: $cmake_log" ;;
esac
cmake --build "$tmp/cmake_build" > "$tmp/cmake_build.log" 2>&1 ||
  { cat "$tmp/cmake_build.log" >&2; fail "building the CMake consumers"; }
for prog in c_shared cc_shared c_static cc_static; do
  deps=$(ldd "$tmp/cmake_build/$prog")
  case "$prog:$deps" in
    *_shared:*"$libdir/libmha.so"*) ;;
    *_shared:*) fail "CMake's $prog did not load the installed libmha.so: $deps" ;;
    *_static:*libmha*) fail "CMake's $prog still needs libmha.so: $deps" ;;
  esac
  "$tmp/cmake_build/$prog" > "$tmp/cmake_$prog.out" || fail "CMake's $prog failed"
  cmp -s "$tmp/cmake_$prog.out" "$tmp/c_shared.out" ||
    fail "CMake's $prog disagrees with the pkg-config build"
done
echo "ok: C and C++ consumers built by CMake (find_package(mha CONFIG); mha::mha, mha::mha_static) agree"

# The version file: 0.7 (a minor version up, which may change the API before 1.0) is refused.
mkdir -p "$tmp/cmake_version"
cat > "$tmp/cmake_version/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(mha_version NONE)
find_package(mha 0.7 CONFIG)
message(STATUS "mha_FOUND=${mha_FOUND}")
EOF
cmake -S "$tmp/cmake_version" -B "$tmp/cmake_version_build" -DCMAKE_PREFIX_PATH="$root" \
  > "$tmp/cmake_version.log" 2>&1 ||
  { cat "$tmp/cmake_version.log" >&2; fail "configuring the version check"; }
version_log=$(cat "$tmp/cmake_version.log")
case "$version_log" in
  *"mha_FOUND=0"*) ;;
  *) fail "find_package(mha 0.7) accepted the 0.6.0 package: $version_log" ;;
esac
echo "ok: mhaConfigVersion.cmake refuses find_package(mha 0.7)"
echo "install test passed"
