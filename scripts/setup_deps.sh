#!/usr/bin/env bash
# Installs everything kfa needs on a fresh Debian 12 machine and prints, on its
# last line, the CMake arguments that point a build at the dependencies.
#
#  - apt packages: compiler, cmake, OpenMPI, GoogleTest, Google Benchmark, BLAS,
#    nlohmann-json (the safetensors headers);
#  - Kokkos 3.4.01 and Kokkos Kernels 3.4.01 (OpenMP + Serial, C++17, BLAS TPL,
#    no default ETI) built from Debian's `trilinos` source package into a cache
#    prefix that later runs reuse.
#
# Skipped parts: set Kokkos_ROOT (and KokkosKernels_ROOT) to use your own Kokkos.
# Cache: KFA_DEPS_PREFIX (default ~/.cache/kfa-deps).
set -euo pipefail

prefix="${KFA_DEPS_PREFIX:-$HOME/.cache/kfa-deps}"
jobs="${KFA_BUILD_JOBS:-$(nproc)}"
log() { echo "[kfa setup] $*" >&2; }

sudo_cmd=""
if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi

apt_packages=(g++ cmake make libopenmpi-dev openmpi-bin libgtest-dev libgmock-dev
              googletest libbenchmark-dev libblas-dev dpkg-dev nlohmann-json3-dev)

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing apt packages: ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >&2
fi

# Source packages: derive deb-src entries from the binary sources already
# configured (deb822 files and one-line lists), so no host name is written here.
enable_deb_src() {
  local out=/etc/apt/sources.list.d/kfa-deb-src.sources
  [ -f "$out" ] && return 0
  if grep -rqs "^Types:.*deb-src" /etc/apt/sources.list.d/ || grep -qs "^deb-src" /etc/apt/sources.list; then
    return 0
  fi
  log "enabling deb-src entries derived from the configured apt sources"
  local tmp; tmp=$(mktemp)
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    sed -e 's/^Types:.*/Types: deb-src/' "$f" >> "$tmp"; echo >> "$tmp"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    grep -E '^deb ' "$f" | sed -e 's/^deb /deb-src /' >> "${tmp}.list" || true
  done
  if [ -s "$tmp" ]; then $sudo_cmd cp "$tmp" "$out"; fi
  if [ -s "${tmp}.list" ]; then $sudo_cmd cp "${tmp}.list" /etc/apt/sources.list.d/kfa-deb-src.list; fi
  rm -f "$tmp" "${tmp}.list"
  $sudo_cmd apt-get update -qq
}

build_kokkos() {
  local stamp="$prefix/.kokkos-3.4.01-done"
  [ -f "$stamp" ] && return 0
  enable_deb_src
  local work="$prefix/src"
  mkdir -p "$work"
  if ! ls -d "$work"/trilinos-*/packages/kokkos >/dev/null 2>&1; then
    log "fetching Debian's trilinos source package (large, once per machine)"
    (cd "$work" && apt-get source -qq --download-only trilinos >&2)
    local dsc; dsc=$(ls "$work"/trilinos_*.dsc | head -1)
    local orig; orig=$(ls "$work"/trilinos_*.orig.tar.* | head -1)
    local dir="$work/trilinos-src"
    mkdir -p "$dir"
    log "extracting packages/kokkos and packages/kokkos-kernels from $(basename "$orig")"
    tar -xf "$orig" -C "$dir" --strip-components=1 --wildcards '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
    mv "$dir" "$work/trilinos-13"
    rm -f "$work"/trilinos_*
  fi
  local src; src=$(ls -d "$work"/trilinos-*/packages | head -1)
  log "building Kokkos 3.4.01 (OpenMP + Serial) into $prefix"
  cmake -S "$src/kokkos" -B "$work/build-kokkos" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_CXX_STANDARD=17 -DCMAKE_CXX_EXTENSIONS=OFF \
    -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_TESTS=OFF \
    -DBUILD_SHARED_LIBS=ON >&2
  cmake --build "$work/build-kokkos" -j "$jobs" >&2
  cmake --install "$work/build-kokkos" >&2
  log "building Kokkos Kernels 3.4.01 (BLAS TPL, no default ETI) into $prefix"
  cmake -S "$src/kokkos-kernels" -B "$work/build-kernels" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DKokkos_ROOT="$prefix" -DCMAKE_CXX_STANDARD=17 \
    -DKokkosKernels_ADD_DEFAULT_ETI=OFF -DKokkosKernels_ENABLE_TPL_BLAS=ON \
    -DKokkosKernels_ENABLE_TESTS=OFF -DBUILD_SHARED_LIBS=ON >&2
  cmake --build "$work/build-kernels" -j "$jobs" >&2
  cmake --install "$work/build-kernels" >&2
  rm -rf "$work/build-kokkos" "$work/build-kernels"
  touch "$stamp"
}

if [ -n "${Kokkos_ROOT:-}" ]; then
  log "using the Kokkos at Kokkos_ROOT=$Kokkos_ROOT"
  echo "-DKokkos_ROOT=$Kokkos_ROOT -DKokkosKernels_ROOT=${KokkosKernels_ROOT:-$Kokkos_ROOT}"
else
  build_kokkos
  echo "-DKokkos_ROOT=$prefix -DKokkosKernels_ROOT=$prefix"
fi
