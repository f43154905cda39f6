#!/usr/bin/env bash
# Builds bench_host for another x86-64 machine with AVX-512 (no Kokkos,
# compiler or matching C library needed there) and puts it in one folder
# with what it loads (Kokkos, libgomp, libstdc++, the C library and its
# loader, which runs the binary), bench_host.py and run_host.sh
# (perf_tests/run_host_bench.sh):
#
#   perf_tests/host_bundle.sh <folder> [-march]     # default x86-64-v4
#   OUT=<results> bash <folder>/run_host.sh          # on the other machine
#
# The build goes to build-bundle/ (KFA_ARCH_NATIVE=OFF, MPI, tests and
# examples off); the run-time ISA check of the kernels must pass there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:?usage: host_bundle.sh <folder> [-march value]}"
march="${2:-x86-64-v4}"
build="$root/build-bundle"
jobs="${KFA_BUILD_JOBS:-$(nproc)}"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release $("$root/scripts/setup_deps.sh") \
  -DKFA_ENABLE_MPI=OFF -DKFA_ENABLE_TESTS=OFF -DKFA_ENABLE_EXAMPLES=OFF -DKFA_ARCH_NATIVE=OFF \
  "-DCMAKE_CXX_FLAGS=-march=$march -mprefer-vector-width=512" >/dev/null
cmake --build "$build" -j "$jobs" --target bench_host >/dev/null

mkdir -p "$dest/lib"
cp "$build/perf_tests/bench_host" "$dest/"
# Every library bench_host loads, and the loader of the same C library.
ldd "$build/perf_tests/bench_host" | awk '$3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' |
  while read -r lib; do cp -L "$lib" "$dest/lib/"; done
cp "$root/perf_tests/bench_host.py" "$dest/"
cp "$root/perf_tests/run_host_bench.sh" "$dest/run_host.sh"
cat > "$dest/bench_host.sh" <<'WRAP'
#!/usr/bin/env bash
# bench_host through the bundled loader and libraries.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$here/lib/ld-linux-x86-64.so.2" --library-path "$here/lib" "$here/bench_host" "$@"
WRAP
chmod +x "$dest/bench_host.sh" "$dest/run_host.sh"
echo "$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- src include perf_tests || echo '+changes') -march=$march $(date -u +%F)" \
  > "$dest/BUILD"
du -sh "$dest"
