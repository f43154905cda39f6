#!/usr/bin/env bash
# Memory instructions of every kfa kernel in a CUDA binary or object, from its
# disassembly (cuobjdump -sass):
#
#   perf_tests/sass_report.sh <binary-or-object> [--check]
#   e.g. perf_tests/sass_report.sh build-cuda/unit_tests/kfa_unit_tests --check
#
# One line per kernel (functor and head dim; the instantiations of one
# functor are summed): shared-memory loads and stores (LDS, STS, LDSM),
# asynchronous copies (LDGSTS), generic loads and stores (LD, ST: 64-bit
# addresses, the long-scoreboard path; in a fused kernel they mean scratch
# reached through a pointer whose address space the compiler lost, RESULTS
# v22) and local memory (LDL, STL: spills, stack arrays). --check exits 1
# when a kfa kernel has generic accesses (local ones are listed, not failed:
# a few shapes that are not the library's defaults spill). cuobjdump comes from
# $CUOBJDUMP, else the PATH, else $CUDA_HOME/bin.
set -uo pipefail
file="${1:?usage: $0 <binary-or-object> [--check]}"
check="${2:-}"
tool="${CUOBJDUMP:-$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")}"
[ -x "$tool" ] || { echo "$0: no cuobjdump (set CUOBJDUMP)" >&2; exit 2; }
"$tool" -sass "$file" | python3 -c '
import collections, re, sys
check = sys.argv[1] == "--check"
stats = collections.defaultdict(collections.Counter)
kernel = None
for line in sys.stdin:
    m = re.search(r"Function : (\S+)", line)
    if m:
        k = re.search(r"(Flash\w+Kernel)IN6Kokkos4CudaELi(\d+)E", m.group(1)) or \
            re.search(r"(Flash\w+Kernel|BackwardPrep\w*Kernel|ConvertDq\w*Kernel)", m.group(1))
        kernel = (k.group(1) + (" d" + k.group(2) if k.lastindex == 2 else "")) if k else None
        continue
    if kernel is None:
        continue
    m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)(\.[A-Z0-9_.]+)?\s", line)
    if m and not (m.group(1) or "").startswith("@!PT"):
        op = m.group(2)
        if op in ("LDS", "STS", "LDSM", "LDGSTS", "LD", "ST", "LDL", "STL", "LDG", "STG"):
            stats[kernel][op] += 1
cols = ("LDS", "STS", "LDSM", "LDGSTS", "LDG", "STG", "LD", "ST", "LDL", "STL")
print("kernel".ljust(34) + "".join(c.rjust(8) for c in cols))
bad, local = [], []
for kernel in sorted(stats):
    s = stats[kernel]
    print(kernel.ljust(34) + "".join(str(s[c]).rjust(8) for c in cols))
    if s["LD"] + s["ST"] > 0:
        bad.append(kernel)
    if s["LDL"] + s["STL"] > 0:
        local.append(kernel)
if local:
    print("local memory (spills) in: " + ", ".join(local))
if bad:
    print("generic loads or stores in: " + ", ".join(bad))
sys.exit(1 if check and bad else 0)
' "${check:-none}"
