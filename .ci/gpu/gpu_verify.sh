#!/usr/bin/env bash
# gpu_verify.sh: one-shot verification of libzero's CUDA backend on a GPU machine (H100 / sm_90),
# inside a fixed wall-clock budget (default 570 s, under the 10 minutes of one device call).
#
# Run from the libzero project root (the directory with CMakeLists.txt and libzero/):
#     bash .ci/gpu/gpu_verify.sh --no-bench       # the tests and the sanitizer (the first call)
#     bash .ci/gpu/gpu_verify.sh                  # ... and bench_collectives
#     bash .ci/gpu/gpu_verify.sh --gpt-bench      # ... and zero-gpt against PyTorch at the end
#     bash .ci/gpu/gpu_verify.sh --no-gpu-ok      # dry run on a machine without a GPU
#
# Steps, each timed and capped so the whole run ends inside BUDGET_S:
#   1. probe      GPU (nvidia-smi + a 20-line CUDA program), toolkit, compilers, tools
#   2. deps       missing Debian packages (yaml-cpp, CLI11, Catch2 v2, OpenMPI 4.1, liburing,
#                 OpenBLAS, pkg-config, nlohmann-json, fmt, xxHash) are unpacked from carried .debs
#                 into DEPS_PREFIX (no root, no network: dpkg -x, or Python tarfile where dpkg is
#                 absent); NCCL and cuBLASLt are found in the toolkit, the system, or PyTorch's pip
#                 wheels (nvidia/nccl, nvidia/cublas, nvidia/cu13)
#   3. configure  -DZERO_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90, ZERO_WERROR off (a newer GCC
#                 than the one CI uses must not fail the run on a new warning)
#   4. build      the executables behind `ctest -L gpu` (read from ctest's JSON test list; a fixed
#                 list if that fails), bench_collectives, zero-gpt with --gpt-bench (ninja -k 0)
#   5. ctest      ctest -L gpu (sanitizer entries excluded), junit + log saved; the longest
#                 entries start first (their COST, test/gpu/CMakeLists.txt). It gets what is left
#                 but SAN_RESERVE_S and the later steps' reserves, and never less than 150 s
#   6. sanitizer  the set SAN_SET chooses among ctest's compute-sanitizer entries (memcheck,
#                 racecheck), initcheck/synccheck of the kernel tests, initcheck of the GPT
#                 kernels and memcheck of the MPI-staged communicator test (sanitizer_runs.sh)
#   7. bench      bench_collectives (one rank per GPU), 1..256 MiB; with --engine-bench also
#                 bench_offload_timeline and bench_engine_overhead (about a minute each)
#   8. gpt_bench  (--gpt-bench) bench/attention_vs_pytorch.py first (the attention kernels against
#                 PyTorch's flash attention, at most 90 s), then bench/gpt2_vs_pytorch.py: GPT-2
#                 124M, zero-gpt against PyTorch, in the time left (GPT_BENCH_S of it kept free
#                 by the steps before)
#   9. summary    a table of steps, rc and seconds; ctest's own summary lines (passed / failed
#                 counts, the tests that failed or did not run); each test's outcome as the kit
#                 reads it (ctest_outcome.py: passed, failed, skipped, or cut by the time budget,
#                 with the command that reruns the cut ones); the GPT-2 comparison row
#
# Environment (all optional):
#   ZERO_DEBS_DIR   .debs to unpack when deps are missing (default: ./.gpuverify/debs, then
#                   <script dir>/debs); make them with fetch_debs.sh on a Debian 12 machine
#   DEPS_PREFIX     where they are unpacked (default /tmp/zero-deps); only the packages behind
#                   what is missing are unpacked (ZERO_UNPACK_ALL=1: every carried package)
#   BUILD_DIR       (default build/gpu-verify)      LOG_DIR (default build/gpu-verify-logs/<time>)
#   BUDGET_S        total wall seconds (default 570)  JOBS (default nproc)
#   CUDA_ARCH       (default 90)                    CUDA_HOME (default: from nvcc)
#   CTEST_J         parallel ctest jobs (default: the cores, at most 16; a test's PROCESSORS is
#                   its rank count, so the engine's 4-rank runs take 4 of them)
#   SAN_SET         the sanitizer runs: short (default: the kernel, quantize and attention tests,
#                   ours, under memcheck, racecheck, initcheck and synccheck), full (short, then
#                   the engine, communicator, matmul and model runs), or a regular expression
#                   (Python's) on the run names (<test>_<tool>, e.g. test_gpt_kernels_racecheck)
#   SAN_RESERVE_S   seconds the tests leave for the sanitizer step (default 120; it also gets
#                   whatever the tests do not use)
#   CTEST_REGEX     only the gpu tests whose names match (ctest -R), and only their programs are
#                   built: the rerun of what a first call cut or failed (its summary prints it)
#   CONFIGURE_CAP_S / BUILD_CAP_S   per-step caps (default 120 / 300 s; a slow machine needs more)
#   GPT_BENCH_S     seconds kept for the GPT-2 comparison with --gpt-bench (default 240)
#   GPT_BENCH_ARGS  extra arguments for gpt2_vs_pytorch.py (e.g. "--steps 20"); with them the
#                   step also runs without a GPU (e.g. "--backend host --skip-pytorch ...")
#   OUT             if set, the main logs (at most 8 files, the rest as logs.tar.gz) and the
#                   GPT-2 result (gpt2_result.json) are also copied into this folder
# Flags: --no-gpu-ok (continue without a GPU: every gpu test must then report skipped),
#        --no-sanitizer, --no-bench, --gpt-bench, --engine-bench,
#        --system-deps (never unpack the carried .debs),
#        --carried-deps (treat every dependency as missing: unpack all carried .debs, OpenMPI
#                        included, and point CMake at them; checks the carried set on a machine
#                        that has everything installed),
#        --configure-only (stop after configure: checks the dependency setup in a minute).
#   ZERO_VERIFY_CLOCK  (its dry-run test only) a file holding the time in epoch seconds, read
#                   instead of the clock: test/e2e/gpu_verify_budget.py runs this script with
#                   stand-in programs that advance it by simulated build and test durations
# Exit status: 0 when configure, build and ctest -L gpu pass (and the sanitizer step and the
# GPT-2 comparison, if run); 1 when anything failed; 2 on a usage or environment error; 3 when
# nothing failed but tests or sanitizer runs were cut by the time budget (listed as "cut", with
# the command that reruns them: untested, not failed).

set -uo pipefail

# ------------------------------------------------------------------------------ arguments
NO_GPU_OK=0 RUN_SAN=1 RUN_BENCH=1 RUN_GPT=0 RUN_ENGINE=0 SYSTEM_DEPS=0 CARRIED_DEPS=0 CONFIGURE_ONLY=0
for a in "$@"; do
  case "$a" in
    --no-gpu-ok) NO_GPU_OK=1 ;;
    --no-sanitizer) RUN_SAN=0 ;;
    --no-bench) RUN_BENCH=0 ;;
    --gpt-bench) RUN_GPT=1 ;;
    --engine-bench) RUN_ENGINE=1 ;;
    --system-deps) SYSTEM_DEPS=1 ;;
    --carried-deps) CARRIED_DEPS=1 ;;
    --configure-only) CONFIGURE_ONLY=1 ;;
    -h|--help) sed -n '2,/^$/p' "$0" | sed -E 's/^# ?//'; exit 0 ;;
    *) echo "gpu_verify: unknown argument '$a' (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$SYSTEM_DEPS" = 1 ] && [ "$CARRIED_DEPS" = 1 ]; then
  echo "gpu_verify: --system-deps and --carried-deps exclude each other" >&2; exit 2
fi

SRC=$(pwd)
if [ ! -f "$SRC/CMakeLists.txt" ] || [ ! -d "$SRC/libzero/src/cuda" ]; then
  echo "gpu_verify: run this from the libzero project root (no libzero/src/cuda under $SRC)" >&2
  exit 2
fi
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STAMP=$(date +%Y%m%d-%H%M%S)
BUDGET_S=${BUDGET_S:-570}
now() { if [ -n "${ZERO_VERIFY_CLOCK:-}" ]; then cat "$ZERO_VERIFY_CLOCK"; else date +%s; fi; }
START_EPOCH=$(now)
DEADLINE=$((START_EPOCH + BUDGET_S))
JOBS=${JOBS:-$(nproc)}
CTEST_J=${CTEST_J:-$(( $(nproc) < 16 ? $(nproc) : 16 ))}
CUDA_ARCH=${CUDA_ARCH:-90}
BUILD_DIR=${BUILD_DIR:-$SRC/build/gpu-verify}
LOG_DIR=${LOG_DIR:-$SRC/build/gpu-verify-logs/$STAMP}
DEPS_PREFIX=${DEPS_PREFIX:-/tmp/zero-deps}
BUILD_DIR=$(realpath -m "$BUILD_DIR") LOG_DIR=$(realpath -m "$LOG_DIR") DEPS_PREFIX=$(realpath -m "$DEPS_PREFIX")
GPT_BENCH_S=${GPT_BENCH_S:-240}
GPT_RESERVE=$(( RUN_GPT ? GPT_BENCH_S : 0 ))
mkdir -p "$LOG_DIR" "$BUILD_DIR"
case "$DEPS_PREFIX" in /|/usr|/usr/*|"$HOME"|"") echo "gpu_verify: refusing DEPS_PREFIX=$DEPS_PREFIX" >&2; exit 2 ;; esac
LOG=$LOG_DIR/verify.log
SUMMARY=$LOG_DIR/summary.txt
: >"$SUMMARY"

# ------------------------------------------------------------------------------ helpers
left() { echo $((DEADLINE - $(now))); }
note() { { set +x; } 2>/dev/null; echo "gpu_verify: $*"; set -x; }
record() { printf '%-12s rc=%-4s %5ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$SUMMARY"; }

# step NAME CAP_S RESERVE_S LOGFILE -- command...
# Runs one external command under `timeout`, capped at min(CAP_S, time left - RESERVE_S) so the
# steps after it keep RESERVE_S seconds; output goes to the terminal, verify.log and LOGFILE.
step() {
  local name=$1 cap=$2 reserve=$3 logfile=$4; shift 5
  local avail=$(( $(left) - reserve )); local eff=$(( cap < avail ? cap : avail ))
  if [ "$eff" -lt 10 ]; then
    record "$name" skip 0 "no time left (cap $cap s, $(left) s left, $reserve s reserved)"
    return 124
  fi
  note "=== step $name: cap ${eff}s ($(left)s of the budget left) ==="
  local t0; t0=$(now)
  timeout -k 15 "$eff" "$@" 2>&1 | tee -a "$logfile"
  local rc=${PIPESTATUS[0]}
  local dt=$(( $(now) - t0 ))
  local what="$*"; [ "$rc" = 124 ] && what="TIMED OUT after ${eff}s: $what"
  record "$name" "$rc" "$dt" "${what:0:150}"
  return "$rc"
}

# ctest_lines LOG: ctest's own closing lines (the passed / failed counts, the total time, and the
# tests listed as failed or not run), to be pasted as they are.
ctest_lines() {
  [ -f "$1" ] || return 0
  awk '/tests passed, .* tests failed out of|Total Test time/ {print; grab=0; next}
       /^The following tests (FAILED|did not run):/ {print; grab=1; next}
       grab && /^[ \t]+[0-9]+ - / {print; next}
       {grab=0}' "$1"
}

verdict() {  # verdict STATUS: the word for the exit status
  case $1 in 0) echo PASS ;; 3) echo "INCOMPLETE (nothing failed; tests or sanitizer runs were cut by the time budget)" ;; *) echo FAIL ;; esac
}

finish() {
  { set +x; } 2>/dev/null
  local rc=$1
  {
    if [ -f "$LOG_DIR/ctest_gpu.log" ] || [ -f "$LOG_DIR/ctest_outcome.txt" ]; then
      echo "--- ctest -L gpu -E 'memcheck|racecheck' ($BUILD_DIR):"
      ctest_lines "$LOG_DIR/ctest_gpu.log"
      [ -f "$LOG_DIR/ctest_outcome.txt" ] && cat "$LOG_DIR/ctest_outcome.txt"
    fi
    if [ -f "$LOG_DIR/sanitizer.log" ] || [ -f "$LOG_DIR/sanitizer_outcome.txt" ]; then
      echo "--- sanitizer (SAN_SET=${SAN_SET:-short}): ctest's memcheck / racecheck entries, then the initcheck / synccheck / memcheck runs:"
      ctest_lines "$LOG_DIR/sanitizer.log"
      [ -f "$LOG_DIR/sanitizer_outcome.txt" ] && cat "$LOG_DIR/sanitizer_outcome.txt"
      echo "compute-sanitizer ERROR SUMMARY lines: $(grep -c 'ERROR SUMMARY' "$LOG_DIR/sanitizer.log"), with errors: $(grep -cE 'ERROR SUMMARY: [1-9]' "$LOG_DIR/sanitizer.log")"
      grep -hE 'ERROR SUMMARY: [1-9]' "$LOG_DIR/sanitizer.log" | head -5
      grep -hE "^sanitizer: initcheck's .* library kernels" "$LOG_DIR/sanitizer.log" | head -5
      if [ -s "$LOG_DIR/sanitizer_unavailable.txt" ]; then
        echo "sanitizer unavailable (not a failure) in $(wc -l <"$LOG_DIR/sanitizer_unavailable.txt") run(s):"
        head -3 "$LOG_DIR/sanitizer_unavailable.txt"
      fi
    fi
    if [ -f "$LOG_DIR/gpt_bench.log" ]; then
      echo "--- GPT-2 comparison (bench/gpt2_vs_pytorch.py; details in gpt2_result.json):"
      grep -E '^(GPT-2 .* params|libzero: .* tok/s|gpt2-[0-9]+M \|)' "$LOG_DIR/gpt_bench.log" || echo "(no result row: see gpt_bench.log)"
    fi
    echo "overall: $(verdict "$rc") ($(( $(now) - START_EPOCH )) s of $BUDGET_S s)"
  } >>"$SUMMARY"
  echo
  echo "================ gpu_verify summary ($(( $(now) - START_EPOCH )) s of $BUDGET_S s) ================"
  cat "$SUMMARY"
  if [ -f "$LOG_DIR/ctest_gpu.log" ]; then
    echo "--- ctest's result line of each test not passed (a Timeout the outcome above calls cut was the budget's):"
    grep -hE '\*\*\*Failed|\*\*\*Skipped|Not Run|\*\*\*Timeout|\*\*\*Exception' \
      "$LOG_DIR/ctest_gpu.log" "$LOG_DIR/sanitizer.log" 2>/dev/null | sed -E 's|^ *[0-9]+/[0-9]+ ||' || true
  fi
  echo "logs: $LOG_DIR"
  echo "overall: $(verdict "$rc")"
  exit "$rc"
}

main() {
PS4='+ [${SECONDS}s] '
export PATH="$PATH:/usr/sbin:/sbin"   # ldconfig
set -x

# ------------------------------------------------------------------------------ 1. probe
T0=$(now)
note "=== step probe ==="
uname -a
[ -r /etc/os-release ] && . /etc/os-release && echo "os: ${PRETTY_NAME:-?}"
ldd --version 2>&1 | head -1
echo "cores: $(nproc); jobs: $JOBS; budget: ${BUDGET_S}s; memlock: $(ulimit -l)"
[ -r /proc/sys/kernel/io_uring_disabled ] && echo "io_uring_disabled: $(cat /proc/sys/kernel/io_uring_disabled)"

# cmake / ninja may only exist inside a Python environment (pip's cmake and ninja packages).
for tool in cmake ninja; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    d=$(python3 -c "import $tool, os; print(getattr($tool, 'CMAKE_BIN_DIR', None) or getattr($tool, 'BIN_DIR', ''))" 2>/dev/null || true)
    [ -n "$d" ] && [ -x "$d/$tool" ] && export PATH="$d:$PATH"
  fi
done
for tool in cmake ninja g++ python3 nvcc; do
  if command -v "$tool" >/dev/null 2>&1; then echo "$tool: $(command -v "$tool")"; else
    [ "$tool" = nvcc ] && [ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH && continue
    echo "gpu_verify: $tool not found"; record probe 2 0 "$tool missing"; finish 2
  fi
done
cmake --version | head -1; ninja --version; g++ --version | head -1; nvcc --version | tail -2
CMAKE_VER=$(cmake --version | head -1 | awk '{print $3}')
if ! printf '3.25\n%s\n' "$CMAKE_VER" | sort -V -C; then
  record probe 2 0 "cmake $CMAKE_VER < 3.25"; finish 2
fi
CUDA_HOME=${CUDA_HOME:-$(cd "$(dirname "$(readlink -f "$(command -v nvcc)")")/.." && pwd)}
export CUDA_HOME
echo "CUDA_HOME: $CUDA_HOME"

NGPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L; then
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,memory.used --format=csv || true
  NGPU=$(nvidia-smi -L | grep -c '^GPU ' || true)
fi
# A CUDA program of our own: catches a driver older than the toolkit, a missing device node or
# a GPU the build's architecture cannot run on, before a minute of build.
mkdir -p "$BUILD_DIR/probe"
cat >"$BUILD_DIR/probe/probe.cu" <<'EOF'
#include <cstdio>
#include <cuda_runtime.h>
__global__ void fill(int* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = 3 * i; }
int main() {
  int n = 0, drv = 0, rt = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  cudaDriverGetVersion(&drv); cudaRuntimeGetVersion(&rt);
  std::printf("cuda probe: %d device(s) (%s), driver %d, runtime %d\n", n, cudaGetErrorString(e), drv, rt);
  if (e != cudaSuccess || n == 0) return 3;
  cudaDeviceProp p{}; cudaGetDeviceProperties(&p, 0);
  std::printf("cuda probe: device 0 %s, sm_%d%d, %d SMs, %.1f GiB\n", p.name, p.major, p.minor, p.multiProcessorCount,
              p.totalGlobalMem / 1073741824.0);
  int* d = nullptr; const int m = 1 << 20;
  if (cudaMalloc(&d, m * sizeof(int)) != cudaSuccess) return 4;
  fill<<<(m + 255) / 256, 256>>>(d, m);
  int last = 0;
  e = cudaMemcpy(&last, d + m - 1, sizeof last, cudaMemcpyDeviceToHost);
  std::printf("cuda probe: kernel %s, value %d (want %d)\n", cudaGetErrorString(e), last, 3 * (m - 1));
  return e == cudaSuccess && last == 3 * (m - 1) ? 0 : 5;
}
EOF
PROBE_RC=0
if nvcc -arch=sm_"$CUDA_ARCH" -o "$BUILD_DIR/probe/probe" "$BUILD_DIR/probe/probe.cu"; then
  "$BUILD_DIR/probe/probe" | tee "$BUILD_DIR/probe/probe.out"; PROBE_RC=${PIPESTATUS[0]}
  n=$(sed -n 's/^cuda probe: \([0-9]*\) device.*/\1/p' "$BUILD_DIR/probe/probe.out")
  [ -n "$n" ] && [ "$n" -gt "$NGPU" ] && NGPU=$n
else
  PROBE_RC=6; note "nvcc could not build a 20-line CUDA program: fix the toolkit / host compiler first"
fi
if [ "$PROBE_RC" != 0 ]; then
  if [ "$NO_GPU_OK" = 1 ]; then
    note "no usable GPU (probe rc $PROBE_RC): --no-gpu-ok, continuing; every gpu test must report skipped"
  else
    record probe "$PROBE_RC" $(( $(now) - T0 )) "no usable GPU (nvidia-smi / probe.cu); use --no-gpu-ok for a dry run"
    finish 2
  fi
fi
SAN=""
for c in "$CUDA_HOME/bin/compute-sanitizer" "$CUDA_HOME/compute-sanitizer/compute-sanitizer" "$(command -v compute-sanitizer 2>/dev/null)"; do
  [ -n "$c" ] && [ -x "$c" ] && SAN=$c && break
done
echo "compute-sanitizer: ${SAN:-not found}"
record probe "$PROBE_RC" $(( $(now) - T0 )) "ngpu=$NGPU cmake=$CMAKE_VER sanitizer=${SAN:+yes}"

# ------------------------------------------------------------------------------ 2. deps
T0=$(now)
note "=== step deps ==="
CMAKE_ARGS=()
DEBS_DIR=""
for d in "${ZERO_DEBS_DIR:-}" "$SRC/.gpuverify/debs" "$SCRIPT_DIR/debs"; do
  [ -n "$d" ] && ls "$d"/*.deb >/dev/null 2>&1 && DEBS_DIR=$d && break
done

have_header() {  # have_header REL: REL under a system include dir
  local d; for d in /usr/include /usr/local/include /usr/include/x86_64-linux-gnu; do [ -f "$d/$1" ] && return 0; done; return 1
}
# A header alone is not enough where CMake asks for the package's config file (find_package
# CONFIG) or pkg-config for its .pc file: look for those too.
have_cmake_config() {  # have_cmake_config NAME: <NAME>Config.cmake or <name>-config.cmake
  local f; for f in /usr/{lib/x86_64-linux-gnu,lib,share,local/lib,local/share}/cmake/"$1"*/{"$1"Config,"$1"-config}.cmake; do
    [ -f "$f" ] && return 0
  done; return 1
}
have_pc() {  # have_pc NAME: NAME.pc in a system pkg-config directory
  local d; for d in /usr/lib/x86_64-linux-gnu/pkgconfig /usr/lib/pkgconfig /usr/share/pkgconfig /usr/local/lib/pkgconfig; do
    [ -f "$d/$1.pc" ] && return 0
  done; return 1
}
SYS_MPI=0
if mpiexec --version 2>&1 | grep -qiE 'open ?mpi|openrte' && mpicc --showme:compile >/dev/null 2>&1; then SYS_MPI=1; fi
MISSING=()
[ "$SYS_MPI" = 1 ] || MISSING+=("OpenMPI (mpiexec/mpicc)")
have_header yaml-cpp/yaml.h || MISSING+=(yaml-cpp)
have_header CLI/CLI.hpp || MISSING+=(CLI11)
have_header catch2/catch.hpp || MISSING+=("Catch2 v2")
have_header liburing.h || MISSING+=(liburing)
{ have_header cblas.h || ls /usr/include/x86_64-linux-gnu/openblas*/cblas.h /usr/include/openblas/cblas.h >/dev/null 2>&1; } || MISSING+=(OpenBLAS)
pkg-config --version >/dev/null 2>&1 || MISSING+=(pkg-config)
{ have_header nlohmann/json.hpp && have_cmake_config nlohmann_json; } || MISSING+=(nlohmann-json)
{ have_header fmt/core.h && have_cmake_config fmt; } || MISSING+=(fmt)
{ have_header xxhash.h && have_pc libxxhash; } || MISSING+=(xxHash)
echo "missing system deps: ${MISSING[*]:-none}"
if [ "$CARRIED_DEPS" = 1 ]; then
  SYS_MPI=0
  MISSING=("OpenMPI (mpiexec/mpicc)" yaml-cpp CLI11 "Catch2 v2" liburing OpenBLAS pkg-config nlohmann-json fmt xxHash)
  echo "--carried-deps: every dependency is taken from the carried .debs"
fi

unpack_deb() {  # unpack_deb FILE PREFIX: dpkg -x, else Python (a .deb is an ar archive holding data.tar.*)
  if dpkg --version >/dev/null 2>&1; then dpkg -x "$1" "$2"; return; fi
  python3 - "$1" "$2" <<'PY'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
with open(deb, "rb") as f:
    assert f.read(8) == b"!<arch>\n", deb + ": not an ar archive"
    while True:
        head = f.read(60)
        if len(head) < 60:
            sys.exit(deb + ": no data.tar member")
        name, size = head[:16].decode().strip().rstrip("/"), int(head[48:58].decode().strip())
        body = f.read(size)
        f.read(size % 2)  # members are 2-byte aligned
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as t:
                t.extractall(dest, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
            break
PY
}

USE_CARRIED=0
if [ "$SYSTEM_DEPS" = 0 ] && [ ${#MISSING[@]} -gt 0 ]; then
  if [ -z "$DEBS_DIR" ] && [ "$CARRIED_DEPS" = 1 ]; then
    record deps 2 $(( $(now) - T0 )) "--carried-deps but no .debs (ZERO_DEBS_DIR, .gpuverify/debs)"; finish 2
  elif [ -z "$DEBS_DIR" ]; then
    note "deps missing (${MISSING[*]}) and no .debs carried: configure will say which; see fetch_debs.sh"
  else
    USE_CARRIED=1
    P=$DEPS_PREFIX
    rm -rf "$P" && mkdir -p "$P"
    # Only the packages behind what is missing, so that nothing of ours shadows a system library
    # without need (with a working system OpenMPI, two libmpi.so.40 must never meet).
    WANT=" "
    for m in "${MISSING[@]}"; do
      case "$m" in
        OpenMPI*) WANT+="libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15 libpmix2 libmunge2 libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libpsm-infinipath1 libpsm2-2 libnuma1 libatomic1 " ;;
        yaml-cpp) WANT+="libyaml-cpp-dev libyaml-cpp0.7 " ;;
        CLI11) WANT+="libcli11-dev " ;;
        Catch2*) WANT+="catch2 " ;;
        liburing) WANT+="liburing-dev liburing2 " ;;
        OpenBLAS) WANT+="libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5 libquadmath0 " ;;
        pkg-config) WANT+="pkgconf pkgconf-bin libpkgconf3 " ;;
        nlohmann-json) WANT+="nlohmann-json3-dev " ;;
        fmt) WANT+="libfmt-dev libfmt9 " ;;
        xxHash) WANT+="libxxhash-dev libxxhash0 " ;;
      esac
    done
    for f in "$DEBS_DIR"/*.deb; do
      pkg=$(basename "$f"); pkg=${pkg%%_*}
      [ "${ZERO_UNPACK_ALL:-0}" = 1 ] || [[ "$WANT" == *" $pkg "* ]] || continue
      if [ "$SYS_MPI" = 1 ]; then case "$pkg" in libopenmpi*|openmpi-*|libpmix*|libucx*|libfabric*|libpsm*) continue ;; esac; fi
      echo "unpacking $pkg"
      unpack_deb "$(readlink -f "$f")" "$P" || { record deps 1 $(( $(now) - T0 )) "could not unpack $f"; finish 1; }
    done
    A=x86_64-linux-gnu
    # What Debian's maintainer scripts (update-alternatives) would have made.
    if [ "$SYS_MPI" = 0 ]; then
      for n in mpiexec mpirun; do ln -sf orterun "$P/usr/bin/$n"; done
      for n in mpicc mpicxx mpic++; do ln -sf opal_wrapper "$P/usr/bin/$n"; done
      [ -e "$P/usr/lib/libpsm1/libpsm_infinipath.so.1.16" ] &&
        ln -sf ../libpsm1/libpsm_infinipath.so.1.16 "$P/usr/lib/$A/libpsm_infinipath.so.1"
    fi
    ob=$P/usr/lib/$A/openblas-pthread
    if [ -d "$ob" ]; then
      ln -sf "openblas-pthread/libopenblas.so.0" "$P/usr/lib/$A/libopenblas.so.0"
      ln -sf "openblas-pthread/libopenblas.so" "$P/usr/lib/$A/libopenblas.so"
    fi
    # pkg-config files carry prefix=/usr: point them at the unpacked tree.
    for pc in "$P"/usr/lib/$A/pkgconfig/*.pc "$P"/usr/share/pkgconfig/*.pc "$ob"/pkgconfig/*.pc; do
      [ -f "$pc" ] && sed -i "s|^prefix=/usr\$|prefix=$P/usr|; s|=/usr/|=$P/usr/|g" "$pc"
    done
    # Prefer the system's copy of generic shared libraries (often newer): keep ours off the path.
    for f in "$P"/usr/lib/$A/lib{numa,atomic,gfortran,quadmath,nl-3,nl-route-3,ibverbs,rdmacm,pkgconf}.so.* \
             "$P"/lib/$A/lib{nl-3,nl-route-3}.so.*; do
      [ -e "$f" ] || continue
      so=$(basename "$f" | sed -E 's/^(.*\.so\.[0-9]+).*$/\1/')
      sys=$(ldconfig -p 2>/dev/null | awk -v so="$so" '$1 == so && /x86-64/ {print $NF; exit}')
      # Only a real, non-empty file counts (a stale ld.so.cache entry does not).
      if [ -n "$sys" ] && [ -f "$(readlink -f "$sys")" ] && [ -s "$(readlink -f "$sys")" ]; then
        echo "using the system's $so ($sys)"; rm -f "$f"
      fi
    done
    export PATH="$P/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$P/usr/lib/$A:$P/lib/$A:$ob:$P/usr/lib/$A/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PKG_CONFIG_PATH="$P/usr/lib/$A/pkgconfig:$P/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export CMAKE_PREFIX_PATH="$P/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    # The relocated OpenMPI finds itself through OPAL_PREFIX; its PMIx looks for its plugins
    # where Debian installed them, and without its compression plugin every mpiexec printed a
    # help-file error (seen with the system's copies hidden in a mount namespace).
    if [ "$SYS_MPI" = 0 ]; then
      export OPAL_PREFIX=$P/usr PMIX_MCA_mca_base_component_path=$P/usr/lib/$A/pmix2/lib/pmix
    fi
    [ -x "$P/usr/bin/pkgconf" ] && ! pkg-config --version >/dev/null 2>&1 && ln -sf pkgconf "$P/usr/bin/pkg-config"
    [ -f "$P/usr/include/$A/openblas-pthread/cblas.h" ] && CMAKE_ARGS+=("-DZERO_CBLAS_INCLUDE=$P/usr/include/$A/openblas-pthread")
    # Key libraries whose dependencies still resolve to nothing are printed.
    for so in "$P"/usr/lib/$A/lib{mpi,open-pal,open-rte,pmix,yaml-cpp,uring,hwloc,event_core,fmt,xxhash}.so.* "$ob"/libopenblas*.so* \
              "$P"/usr/lib/$A/openmpi/lib/openmpi3/mca_{pmix_ext3x,btl_vader,pml_ob1,ess_singleton,plm_rsh}.so "$P"/usr/bin/pkgconf; do
      [ -f "$so" ] && ldd "$so" 2>/dev/null | grep 'not found' | sed "s|^|  missing for $(basename "$so"): |"
    done | sort -u | head -20
  fi
fi
if [ "$SYS_MPI" = 1 ] || [ "$USE_CARRIED" = 1 ]; then
  CMAKE_ARGS+=("-DMPI_C_COMPILER=$(command -v mpicc)" "-DMPIEXEC_EXECUTABLE=$(command -v mpiexec)")
fi
PKGC=""
for c in "$(command -v pkg-config 2>/dev/null)" /usr/bin/pkg-config "${DEPS_PREFIX}/usr/bin/pkgconf"; do
  [ -n "$c" ] && "$c" --version >/dev/null 2>&1 && PKGC=$c && break
done
if [ -n "$PKGC" ]; then CMAKE_ARGS+=("-DPKG_CONFIG_EXECUTABLE=$PKGC"); else note "no working pkg-config: configure will stop"; fi
[ -n "$PKGC" ] && "$PKGC" --modversion liburing yaml-cpp libxxhash fmt 2>&1 | sed 's/^/pkg-config: /'

# zero-plot (examples) wants a Python with matplotlib; configure stops without one. Name the
# first that has it, else plain python3: nothing here runs zero-plot.
PLOT_PY=""
for py in "$(command -v python3)" /usr/bin/python3; do
  [ -x "$py" ] && "$py" -c 'import matplotlib' >/dev/null 2>&1 && PLOT_PY=$py && break
done
echo "python with matplotlib: ${PLOT_PY:-none (zero-plot will not run)}"
CMAKE_ARGS+=("-DZERO_PLOT_PYTHON:FILEPATH=${PLOT_PY:-$(command -v python3)}")

# OpenMPI in a container/VM as root, shared memory only.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
# Two ranks that initialise MPI and sum over it (mpiexec alone starts no MPI client): a broken
# MPI runtime shows here, not as every multi-rank test failing later.
if command -v mpiexec >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1; then
  mpiexec --version 2>&1 | head -2
  printf '%s\n' '#include <mpi.h>' '#include <stdio.h>' \
    'int main(int c, char** v) { int r, n, s = 0; MPI_Init(&c, &v); MPI_Comm_rank(MPI_COMM_WORLD, &r);' \
    '  MPI_Comm_size(MPI_COMM_WORLD, &n); int x = r + 1; MPI_Allreduce(&x, &s, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);' \
    '  if (r == 0) printf("mpi probe: %d ranks, sum %d\n", n, s); MPI_Finalize(); return s == n * (n + 1) / 2 ? 0 : 1; }' \
    >"$LOG_DIR/mpi_probe.c"
  if ! { mpicc "$LOG_DIR/mpi_probe.c" -o "$LOG_DIR/mpi_probe" && timeout 60 mpiexec -n 2 "$LOG_DIR/mpi_probe"; }; then
    note "warning: the 2-rank MPI probe failed: the multi-rank tests will fail"
  fi
fi

# NCCL: the toolkit, the system, NCCL_HOME, or PyTorch's wheels. The wheels keep NCCL in
# nvidia/nccl/{include,lib} (CUDA 12 and 13 alike) with no unversioned libnccl.so for
# find_library: a symlink prefix supplies it. CUDA 13's other wheels share nvidia/cu13/lib.
NV_WHEELS=$(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null || true)
echo "pip nvidia wheels: ${NV_WHEELS:-none}"
nccl_inc=""; nccl_lib=""
for d in "${NCCL_HOME:-/nonexistent}" "$CUDA_HOME" /usr /usr/local; do
  if [ -f "$d/include/nccl.h" ]; then
    for l in "$d/lib" "$d/lib64" "$d/lib/x86_64-linux-gnu" /usr/lib/x86_64-linux-gnu; do
      ls "$l"/libnccl.so* >/dev/null 2>&1 && nccl_inc=$d/include && nccl_lib=$l && break
    done
  fi
  [ -n "$nccl_inc" ] && break
done
if [ -z "$nccl_inc" ] && [ -n "$NV_WHEELS" ]; then
  # shellcheck disable=SC2086
  h=$(find $NV_WHEELS -maxdepth 4 -name nccl.h -path '*/include/*' 2>/dev/null | head -1)
  w=${h%/include/*}
  if [ -n "$h" ] && ls "$w"/lib/libnccl.so* >/dev/null 2>&1; then
    mkdir -p "$DEPS_PREFIX/nccl/lib"
    ln -sfn "$w/include" "$DEPS_PREFIX/nccl/include"
    real=$(ls "$w"/lib/libnccl.so* | head -1)
    ln -sf "$real" "$DEPS_PREFIX/nccl/lib/libnccl.so"
    ln -sf "$real" "$DEPS_PREFIX/nccl/lib/$(basename "$real")"
    nccl_inc=$DEPS_PREFIX/nccl/include; nccl_lib=$DEPS_PREFIX/nccl/lib
    export NCCL_HOME=$DEPS_PREFIX/nccl
    export LD_LIBRARY_PATH="$w/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
if [ -n "$nccl_inc" ]; then
  grep -E '^#define NCCL_(MAJOR|MINOR|PATCH)' "$nccl_inc/nccl.h" | awk '{printf "%s ", $3} END {print ""}' | sed 's/^/NCCL headers: /'
  CMAKE_ARGS+=("-DNCCL_INCLUDE_DIR=$nccl_inc" "-DNCCL_LIBRARY=$(ls "$nccl_lib"/libnccl.so* | head -1)")
else
  note "NCCL not found (toolkit, /usr, NCCL_HOME, pip nvidia-nccl): configure with ZERO_CUDA=ON will stop"
fi
# cuBLASLt: required by configure and by the GPT example's matrix products; pip's copy will do.
if ! ls "$CUDA_HOME"/lib64/libcublasLt.so "$CUDA_HOME"/lib/libcublasLt.so "$CUDA_HOME"/targets/x86_64-linux/lib/libcublasLt.so >/dev/null 2>&1; then
  # shellcheck disable=SC2086
  lt=$([ -n "$NV_WHEELS" ] && find $NV_WHEELS -maxdepth 3 -name 'libcublasLt.so*' 2>/dev/null | sort | head -1)
  if [ -n "$lt" ]; then
    CMAKE_ARGS+=("-DCUDA_cublasLt_LIBRARY=$lt")
    LD_LIBRARY_PATH="$(dirname "$lt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; export LD_LIBRARY_PATH
  else
    note "libcublasLt not found (toolkit, pip nvidia-cublas): configure with ZERO_CUDA=ON will stop"
  fi
fi
[ -n "$SAN" ] && CMAKE_ARGS+=("-DZERO_COMPUTE_SANITIZER=$SAN")
# CMake 4 refuses package files that ask for policies older than 3.5.
case "$CMAKE_VER" in [4-9].*) CMAKE_ARGS+=("-DCMAKE_POLICY_VERSION_MINIMUM=3.5") ;; esac
env | grep -E '^(PATH|LD_LIBRARY_PATH|PKG_CONFIG_PATH|CMAKE_PREFIX_PATH|OPAL_PREFIX|NCCL_HOME|CUDA_HOME)=' | sort
record deps 0 $(( $(now) - T0 )) "carried=$USE_CARRIED sys_mpi=$SYS_MPI debs=${DEBS_DIR:-none} missing=[${MISSING[*]:-}]"

# ------------------------------------------------------------------------------ 3. configure
step configure "${CONFIGURE_CAP_S:-120}" 360 "$LOG_DIR/configure.log" -- \
  cmake -S "$SRC" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZERO_CUDA=ON -DZERO_WERROR=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" \
    -DCUDAToolkit_ROOT="$CUDA_HOME" "${CMAKE_ARGS[@]}"
[ $? = 0 ] || finish 1
grep -E 'CUDA backend|ZERO_WITH_CUDA' "$LOG_DIR/configure.log" | tail -2
grep -E '^(MPI_C_HEADER_DIR|MPI_mpi_LIBRARY|MPIEXEC_EXECUTABLE|yaml-cpp_DIR|CLI11_DIR|Catch2_DIR|BLAS_openblas_LIBRARY|ZERO_CBLAS_INCLUDE|NCCL_INCLUDE_DIR|NCCL_LIBRARY|pkgcfg_lib_URING_uring|pkgcfg_lib_XXHASH_xxhash|nlohmann_json_DIR|fmt_DIR|ZERO_PLOT_PYTHON|ZERO_COMPUTE_SANITIZER|CUDA_cublasLt_LIBRARY):' \
  "$BUILD_DIR/CMakeCache.txt" | sed 's/^/cache: /'
[ "$CONFIGURE_ONLY" = 1 ] && finish 0

# ------------------------------------------------------------------------------ 4. build
# The targets are the programs that the chosen tests and sanitizer runs execute, read from
# ctest's list (gpu_plan.py), so a GPU test added to test/gpu is built without editing this
# script; CTEST_REGEX narrows the tests (a rerun of the cut or failed ones builds only theirs).
# Names that are no ninja target are dropped.
has_target() { ninja -C "$BUILD_DIR" -t query "$1" >/dev/null 2>&1; }
SAN_SET=${SAN_SET:-short}
PLAN=$LOG_DIR/plan
TARGETS=()
ctest --test-dir "$BUILD_DIR" -L gpu --show-only=json-v1 >"$LOG_DIR/ctest_gpu_tests.json" 2>"$LOG_DIR/ctest_gpu_tests.err"
plan_args=(--san-set "$SAN_SET" --ctest-regex "${CTEST_REGEX:-}")
[ "$RUN_SAN" = 1 ] && [ -n "$SAN" ] && [ "$PROBE_RC" = 0 ] || plan_args+=(--no-sanitizer)
if python3 "$SCRIPT_DIR/gpu_plan.py" "$LOG_DIR/ctest_gpu_tests.json" "$BUILD_DIR" "$PLAN" "${plan_args[@]}"; then
  while read -r t; do
    [ -n "$t" ] && has_target "$t" && TARGETS+=("$t")
  done <"$PLAN/targets.txt"
fi
if [ ${#TARGETS[@]} -gt 0 ]; then
  echo "gpu test targets (from ctest -L gpu): ${TARGETS[*]}"
else
  note "could not read the gpu tests from ctest: building the fixed list"
  for t in test_cuda_kernels test_cuda_watchdog test_cuda_quantize test_cuda_comm test_cuda_engine \
           test_gpt_attention test_gpt_matmul test_gpt_kernels; do
    has_target "$t" && TARGETS+=("$t")
  done
fi
TARGETS=(zero "${TARGETS[@]}")
[ "$RUN_BENCH" = 1 ] && has_target bench_collectives && TARGETS+=(bench_collectives)
[ "$RUN_GPT" = 1 ] && TARGETS+=(zero-gpt)
[ "$RUN_GPT" = 1 ] && has_target bench_gpt_attention && TARGETS+=(bench_gpt_attention)
if [ "$RUN_ENGINE" = 1 ]; then
  for t in bench_offload_timeline bench_engine_overhead; do has_target "$t" && TARGETS+=("$t"); done
fi
step build "${BUILD_CAP_S:-300}" 230 "$LOG_DIR/build.log" -- \
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}" -- -k 0
BUILD_RC=$?
ldd "$BUILD_DIR/test/gpu/test_cuda_engine" 2>/dev/null | grep -E 'nccl|cudart|mpi|yaml|uring|not found' || true

# ------------------------------------------------------------------------------ 5. ctest -L gpu
export ZERO_NCCL_TIMEOUT_S=${ZERO_NCCL_TIMEOUT_S:-120}   # a hung collective aborts in 2 min, not 10
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
stop_time_args() {  # --stop-time caps every test's TIMEOUT (1500 s for the engine) to the budget
  local end=$(( $(now) + $1 ))
  [ "$(date -d "@$end" +%j)" = "$(date -d "@$(now)" +%j)" ] && echo "--stop-time $(date -d "@$end" +%H:%M:%S)"
}
# The tests take what is left but the sanitizer's reserve and the later steps' (the sanitizer
# also gets whatever the tests leave unused). The tests matter most: they keep 150 s (or all
# that is left) even where the later steps' reserves then shrink.
SAN_RESERVE_S=${SAN_RESERVE_S:-120}
CT_CAP=$(( $(left) - (RUN_SAN ? SAN_RESERVE_S : 0) - (RUN_BENCH ? 45 : 0) - GPT_RESERVE - 10 ))
CT_FLOOR=$(( $(left) - 10 < 150 ? $(left) - 10 : 150 ))
[ "$CT_CAP" -lt "$CT_FLOOR" ] && CT_CAP=$CT_FLOOR
CT_SELECT=(-L gpu -E 'memcheck|racecheck')
[ -n "${CTEST_REGEX:-}" ] && CT_SELECT+=(-R "$CTEST_REGEX")
ctest --test-dir "$BUILD_DIR" "${CT_SELECT[@]}" --show-only=json-v1 >"$LOG_DIR/ctest_gpu_selection.json" 2>/dev/null
# shellcheck disable=SC2046
step ctest_gpu "$CT_CAP" 0 "$LOG_DIR/ctest_gpu.log" -- \
  ctest --test-dir "$BUILD_DIR" "${CT_SELECT[@]}" -j "$CTEST_J" --output-on-failure \
    --output-junit "$LOG_DIR/ctest_gpu.xml" $(stop_time_args "$((CT_CAP - 15))")
CTEST_RC=$?
# Each test's outcome: a test the budget cut (killed at --stop-time, or never started) is "cut",
# not failed; ctest itself counts the first as failed and leaves the second out.
python3 "$SCRIPT_DIR/ctest_outcome.py" "$LOG_DIR/ctest_gpu_selection.json" "$LOG_DIR/ctest_gpu.log" \
  --step-rc "$CTEST_RC" --what "ctest -L gpu" \
  --rerun "CTEST_REGEX='{regex}' ZERO_DEBS_DIR=.gpuverify/debs bash .ci/gpu/gpu_verify.sh --no-bench --no-sanitizer" \
  >"$LOG_DIR/ctest_outcome.txt"
case $? in 0) CTEST_STATE=pass ;; 3) CTEST_STATE=cut ;; *) CTEST_STATE=fail ;; esac
cat "$LOG_DIR/ctest_outcome.txt"
# On a GPU machine only the NCCL runs that need more GPUs than the node has may be skipped.
if [ "$PROBE_RC" = 0 ]; then
  unexpected=$(grep -E '\*\*\*Skipped' "$LOG_DIR/ctest_gpu.log" 2>/dev/null | grep -vE "_nccl_np([2-9]|[1-9][0-9])" || true)
  if [ "$NGPU" -ge 2 ]; then unexpected=$(grep -E '\*\*\*Skipped' "$LOG_DIR/ctest_gpu.log" 2>/dev/null || true); fi
  if [ -n "$unexpected" ]; then
    note "UNEXPECTED SKIPS on a GPU machine:"; echo "$unexpected" | tee -a "$LOG_DIR/ctest_outcome.txt"; CTEST_STATE=fail
  fi
else
  ran=$(grep -E 'Test +#[0-9]+: .* Passed' "$LOG_DIR/ctest_gpu.log" 2>/dev/null || true)
  if [ -n "$ran" ]; then
    note "without a GPU every gpu test must skip, but some passed:"; echo "$ran" | tee -a "$LOG_DIR/ctest_outcome.txt"
    CTEST_STATE=fail
  fi
fi

# ------------------------------------------------------------------------------ 6. sanitizer
# The runs gpu_plan.py chose (SAN_SET), through sanitizer_runs.sh and run_sanitizer.sh, which
# tells a finding (a failure) from a sanitizer that could not attach to the device (status 77,
# "sanitizer unavailable", listed in SAN_UNAVAILABLE): on such a machine nothing was checked, and
# that is reported, not failed. A run the step's time does not reach is "cut".
SAN_STATE=pass
if [ "$RUN_SAN" = 1 ] && [ -n "$SAN" ] && [ "$PROBE_RC" = 0 ]; then
  SAN_CAP=$(( $(left) - (RUN_BENCH ? 40 : 0) - GPT_RESERVE - 5 ))
  SAN_UNAVAILABLE=$LOG_DIR/sanitizer_unavailable.txt
  : >"$SAN_UNAVAILABLE"
  : >"$LOG_DIR/sanitizer_runs.txt"
  touch "$PLAN/san_ctest.txt" "$PLAN/san_extra.txt"
  if [ -s "$PLAN/san_ctest.txt" ]; then
    ctest --test-dir "$BUILD_DIR" -R "^($(paste -sd '|' "$PLAN/san_ctest.txt"))\$" --show-only=json-v1 \
      >"$LOG_DIR/sanitizer_selection.json" 2>/dev/null
  else
    echo '{"tests": []}' >"$LOG_DIR/sanitizer_selection.json"
  fi
  ZERO_SANITIZER_REPORT=$SAN_UNAVAILABLE BUILD_DIR=$BUILD_DIR SAN=$SAN RUN_SANITIZER=$SRC/test/gpu/run_sanitizer.sh \
  SAN_END=$(( $(now) + SAN_CAP )) SAN_CTEST=$PLAN/san_ctest.txt SAN_EXTRA=$PLAN/san_extra.txt \
  SAN_STATUS=$LOG_DIR/sanitizer_runs.txt \
    step sanitizer "$SAN_CAP" 0 "$LOG_DIR/sanitizer.log" -- bash "$SCRIPT_DIR/sanitizer_runs.sh"
  SAN_STEP_RC=$?
  python3 "$SCRIPT_DIR/ctest_outcome.py" "$LOG_DIR/sanitizer_selection.json" "$LOG_DIR/sanitizer.log" \
    --step-rc "$SAN_STEP_RC" --what "sanitizer, ctest's entries (SAN_SET=$SAN_SET)" \
    --rerun "SAN_SET='{regex}' ZERO_DEBS_DIR=.gpuverify/debs bash .ci/gpu/gpu_verify.sh --no-bench" \
    >"$LOG_DIR/sanitizer_outcome.txt"
  case $? in 0) ;; 3) SAN_STATE=cut ;; *) SAN_STATE=fail ;; esac
  # The runs outside ctest: the last state each reached; one that never ended (killed with the
  # step) or never started because the step was over is cut.
  san_cut=() san_failed=() san_ok=0 san_skipped=0
  while IFS= read -r run; do
    [ -n "$run" ] || continue
    name=${run%%=*}
    st=$(awk -v n="$name" '$2 == n {s = $1} END {print s}' "$LOG_DIR/sanitizer_runs.txt")
    case "$st" in
      passed) san_ok=$((san_ok + 1)) ;;
      skipped) san_skipped=$((san_skipped + 1)) ;;
      cut|start) san_cut+=("$name") ;;
      "") if [ "$SAN_STEP_RC" = 124 ] || [ "$SAN_STEP_RC" = 137 ]; then san_cut+=("$name"); else san_failed+=("$name"); fi ;;
      *) san_failed+=("$name") ;;
    esac
  done <"$PLAN/san_extra.txt"
  {
    echo "sanitizer, runs outside ctest: $san_ok passed, ${#san_failed[@]} failed, $san_skipped skipped (no device, or sanitizer unavailable), ${#san_cut[@]} cut by the time budget (not failures), of $(grep -c . "$PLAN/san_extra.txt")"
    for n in "${san_failed[@]}"; do echo "  failed: $n"; done
    for n in "${san_cut[@]}"; do echo "  cut: $n"; done
    [ ${#san_cut[@]} -gt 0 ] && echo "  rerun the cut ones: SAN_SET='^($(IFS='|'; echo "${san_cut[*]}"))\$' ZERO_DEBS_DIR=.gpuverify/debs bash .ci/gpu/gpu_verify.sh --no-bench"
  } >>"$LOG_DIR/sanitizer_outcome.txt"
  [ ${#san_failed[@]} -gt 0 ] && SAN_STATE=fail
  [ ${#san_cut[@]} -gt 0 ] && [ "$SAN_STATE" = pass ] && SAN_STATE=cut
  cat "$LOG_DIR/sanitizer_outcome.txt"
  if [ -s "$SAN_UNAVAILABLE" ]; then
    record sanitizer unavail 0 "sanitizer unavailable in $(wc -l <"$SAN_UNAVAILABLE") run(s): compute-sanitizer could not attach to the device (not a failure; nothing was checked there)"
  fi
else
  record sanitizer skip 0 "run=$RUN_SAN sanitizer=${SAN:-none} gpu_probe=$PROBE_RC"
fi

# ------------------------------------------------------------------------------ 7. bench
if [ "$RUN_BENCH" = 1 ] && [ "$PROBE_RC" = 0 ] && [ -x "$BUILD_DIR/bench/bench_collectives" ]; then
  NP=$(( NGPU > 0 ? NGPU : 1 ))
  step bench 60 "$GPT_RESERVE" "$LOG_DIR/bench.log" -- \
    mpiexec --oversubscribe --bind-to none -n "$NP" "$BUILD_DIR/bench/bench_collectives" \
      --dtype bf16 --min-mib 1 --max-mib 256 --iters 10 --warmup 3
else
  record bench skip 0 "run=$RUN_BENCH gpu_probe=$PROBE_RC"
fi
if [ "$RUN_ENGINE" = 1 ] && [ "$PROBE_RC" = 0 ]; then
  for b in bench_offload_timeline bench_engine_overhead; do
    if [ -x "$BUILD_DIR/bench/$b" ]; then
      step "$b" 150 "$GPT_RESERVE" "$LOG_DIR/$b.log" -- "$BUILD_DIR/bench/$b"
    else
      record "$b" skip 0 "not built"
    fi
  done
fi

# ------------------------------------------------------------------------------ 8. gpt_bench
# The attention kernels against PyTorch's flash attention (half a minute), out of the time the
# earlier steps leave; it does not count in the verdict.
if [ "$RUN_GPT" = 1 ] && [ "$PROBE_RC" = 0 ] && [ -x "$BUILD_DIR/bench/bench_gpt_attention" ]; then
  step attention_bench 90 "$GPT_RESERVE" "$LOG_DIR/attention_bench.log" -- \
    env PYTHONUNBUFFERED=1 python3 "$SRC/bench/attention_vs_pytorch.py" \
      --bench "$BUILD_DIR/bench/bench_gpt_attention" --out "$LOG_DIR/attention/result.json"
else
  record attention_bench skip 0 "run=$RUN_GPT gpu_probe=$PROBE_RC"
fi

# GPT-2 124M, zero-gpt (CUDA backend) against a compiled PyTorch GPT-2 on the same GPU and data;
# what is left of the budget, less a few seconds for the summary. Without a GPU it runs only
# when GPT_BENCH_ARGS asks for a dry run (e.g. --backend host --skip-pytorch, a tiny model).
GPT_RC=0
ZGPT=$BUILD_DIR/examples/gpt/zero-gpt
if [ "$RUN_GPT" = 1 ] && [ -x "$ZGPT" ] && { [ "$PROBE_RC" = 0 ] || [ -n "${GPT_BENCH_ARGS:-}" ]; }; then
  GPT_ARGS=()
  # shellcheck disable=SC2206
  [ -n "${GPT_BENCH_ARGS:-}" ] && GPT_ARGS=(${GPT_BENCH_ARGS})
  if ! python3 -c 'import torch' >/dev/null 2>&1 && [[ " ${GPT_ARGS[*]} " != *" --skip-pytorch "* ]]; then
    note "python3 has no torch: zero-gpt side only"; GPT_ARGS+=(--skip-pytorch)
  fi
  # zero-gpt may take what is left but the PyTorch side's ~2 minutes (compile and steps): a
  # zero-gpt that hangs is stopped and the PyTorch figure still comes back.
  if [[ " ${GPT_ARGS[*]} " != *" --zero-timeout "* ]]; then
    zt=$(( $(left) - 130 )); [ "$zt" -lt 60 ] && zt=60
    GPT_ARGS+=(--zero-timeout "$zt")
  fi
  step gpt_bench 100000 8 "$LOG_DIR/gpt_bench.log" -- \
    env PYTHONUNBUFFERED=1 python3 "$SRC/bench/gpt2_vs_pytorch.py" --zero-gpt "$ZGPT" \
      --out "$LOG_DIR/gpt2" "${GPT_ARGS[@]}"
  GPT_RC=$?
else
  why="run=$RUN_GPT gpu_probe=$PROBE_RC"
  [ "$RUN_GPT" = 1 ] && [ ! -x "$ZGPT" ] && why="zero-gpt was not built (see build.log)" && GPT_RC=1
  record gpt_bench skip 0 "$why"
fi

# ------------------------------------------------------------------------------ 9. summary
# A test or sanitizer run cut by the budget is neither passed nor failed: with nothing failed,
# the verdict is INCOMPLETE (status 3), and the outcome lines say what to rerun.
OVERALL=0
[ "$BUILD_RC" = 0 ] || OVERALL=1
[ "$CTEST_STATE" = fail ] && OVERALL=1
[ "$SAN_STATE" = fail ] && OVERALL=1
[ "$GPT_RC" = 0 ] || OVERALL=1
[ "$OVERALL" = 0 ] && { [ "$CTEST_STATE" = cut ] || [ "$SAN_STATE" = cut ]; } && OVERALL=3
finish "$OVERALL"
}

# Everything (trace included) to the terminal and to verify.log.
main 2>&1 | tee -a "$LOG"
RC=${PIPESTATUS[0]}
# OUT takes at most 8 files: the 7 that matter most, then the whole log folder as one archive
# (verify.log has everything, the trace included; the GPT-2 run's token shard is left out).
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  n=0
  [ -f "$LOG_DIR/gpt2/result.json" ] && cp "$LOG_DIR/gpt2/result.json" "$LOG_DIR/gpt2_result.json"
  for f in summary.txt ctest_gpu.log gpt2_result.json gpt_bench.log sanitizer.log build.log bench.log configure.log; do
    [ -f "$LOG_DIR/$f" ] && [ $n -lt 7 ] && cp "$LOG_DIR/$f" "$OUT/" && n=$((n + 1))
  done
  tar -C "$(dirname "$LOG_DIR")" --exclude='*.bin' -czf "$OUT/logs.tar.gz" "$(basename "$LOG_DIR")" ||
    cp "$LOG_DIR/verify.log" "$OUT/"
  ls -l "$OUT"
fi
exit "$RC"
