#!/usr/bin/env bash
# Packs what tools/gpu-check.sh needs on a lent GPU machine into one ignored folder that the device
# tool's `carry` takes along, checks that it fits what travels (64 MiB with the working tree), and
# prints the call (docs/benchmarks.md, "What has run on a GPU").
#
#   tools/gpu-pack.sh [--build DIR] [--dest DIR] [--limit-mib N]
#
# --build DIR   a Release build holding the CUDA kernels (nvcc found: core/grad_stats_kernel.fatbin;
#               default: build), made at the top of the checkout
# --dest DIR    the folder to fill: inside the checkout, ignored by git, outside the build, and new,
#               empty or one this script filled (its marker file) (default: .gpu-carry)
# --limit-mib N what may travel in all: the working tree plus DIR (default: 64)
#
# The folder holds build/ (the programs gpu-check runs, the plugins, test_on_device, the Python
# package, CMakeCache.txt, the commit it was packed at) and data/ (fashion-mnist/ and fortunes/
# from tools/setup.sh's places). On the GPU machine the command links the build's folder name to
# DIR/build, so that the folders compiled into the tests resolve (gpu-check links the recorded
# source folder to the checkout). Exit status: 0 when the folder is ready, 1 when it does not fit,
# 2 on a bad argument or an unusable build.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=build dest=.gpu-carry limit=64
while [ $# -gt 0 ]; do
  case "$1" in
    --build|--dest|--limit-mib)
      [ $# -ge 2 ] || { echo "gpu-pack.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;&
    --build) build=$2; shift 2 ;;
    --dest) dest=$2; shift 2 ;;
    --limit-mib) limit=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gpu-pack.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "gpu-pack.sh: $1" >&2; exit "${2:-2}"; }
[[ $limit =~ ^[0-9]+$ ]] && [ "$limit" -gt 0 ] || die "--limit-mib takes a whole number of MiB, not '$limit'"
cache=$build/CMakeCache.txt
[ -f "$cache" ] || die "no build in $build (no CMakeCache.txt: run tools/test.sh first)"
setting() { sed -n "s/^$1:[A-Z]*=//p" "$cache"; }
[ "$(setting AMPKIT_INSTRUMENT)" != ON ] || die "$build is an instrumented build: its Python extension cannot load on the GPU machine"
[ "$(setting CMAKE_BUILD_TYPE)" = Release ] || die "$build is a $(setting CMAKE_BUILD_TYPE) build: GPU figures come from a Release build"
[ -f "$build/core/grad_stats_kernel.fatbin" ] ||
  die "$build holds no CUDA kernels (no core/grad_stats_kernel.fatbin: nvcc or LibTorch's CUDA was not found): the GPU checks need the statistics and rules kernels"
# The build's folder as the tests have it compiled in, relative to its source folder: the name the
# command links to the packed build on the GPU machine.
name=$(realpath -m --relative-to="$(setting CMAKE_HOME_DIRECTORY)" "$(setting CMAKE_CACHEFILE_DIR)")
case "$name" in
  ""|.|..|../*|/*|*/*) die "$build was not made at the top of its source folder ($(setting CMAKE_HOME_DIRECTORY)), where the GPU machine's command links it" ;;
esac
[ -n "$dest" ] || die "--dest must name a folder inside the checkout"
dest=$(realpath -m --relative-to=. -- "$dest")  # ./build/x, a/../b and trailing slashes as they are meant
case "$dest" in
  ..|../*|/*|.) die "--dest must be a folder inside the checkout, not '$dest'" ;;
esac
case "$dest/" in
  "$name"/*) die "--dest $dest is inside the build folder $name, which the command replaces with a link" ;;
esac
git rev-parse --git-dir > /dev/null 2>&1 || die "$PWD is not a git checkout: the device tool sends a checkout's files"
git check-ignore -q "$dest/build" || die "--dest $dest is not ignored by git (the device tool carries ignored folders only)"
marker=.ampkit-gpu-pack
if [ -n "$(ls -A "$dest" 2> /dev/null)" ] && [ ! -f "$dest/$marker" ]; then
  die "--dest $dest holds files gpu-pack.sh did not put there: name a new or empty folder"
fi

# What gpu-check.sh runs: ampkit-train (training, host-sync, throughput), ampkit-launch (test_nccl
# with two GPUs), the device benchmark, ampkit-bench-dist (scaling), test_on_device (parity),
# test_kernel_check (first use), the plugins and the Python package (the graph test, gpu_models.py).
files=(bin/ampkit-train bin/ampkit-launch bin/ampkit-bench-post-backward-device bin/ampkit-bench-dist
  tests/test_on_device tests/test_kernel_check CMakeCache.txt)
folders=(lib/ampkit/plugins python/ampkit)
for f in "${files[@]}" "${folders[@]}"; do
  [ -e "$build/$f" ] || die "$build/$f is missing (build every target: tools/test.sh)"
done
datasets=(/usr/share/datasets/fashion-mnist /usr/share/games/fortunes)
for d in "${datasets[@]}"; do
  [ -d "$d" ] || die "$d is missing (tools/setup.sh installs the datasets)"
done

rm -rf "$dest"
mkdir -p "$dest" && touch "$dest/$marker" || die "cannot write $dest"
mkdir -p "$dest/build/bin" "$dest/build/tests" "$dest/build/lib/ampkit" "$dest/build/python" "$dest/data" ||
  die "cannot write $dest"
for f in "${files[@]}"; do cp -p "$build/$f" "$dest/build/$f" || die "cannot copy $build/$f"; done
cp -rp "$build/lib/ampkit/plugins" "$dest/build/lib/ampkit/" || die "cannot copy the plugins"
cp -rp "$build/python/ampkit" "$dest/build/python/" || die "cannot copy the Python package"
rm -rf "$dest/build/python/ampkit/__pycache__"
for d in "${datasets[@]}"; do cp -rpL "$d" "$dest/data/" || die "cannot copy $d"; done
# The device's copy of the checkout has no .git: the report names the commit from here.
git describe --always --dirty --abbrev=7 > "$dest/build/ampkit-commit.txt" || die "cannot name the commit"

# What travels: the tracked files, the untracked files git does not ignore, and the carried folder.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null |
  awk '{ s += $1 } END { print s + 0 }')
packed=$(du -sb "$dest" | cut -f1)
total=$((tree + packed))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo "gpu-pack.sh: $dest holds $(mib "$packed") MiB; with the working tree ($(mib "$tree") MiB) $(mib "$total") of $limit MiB travel"
[ "$total" -le $((limit * 1048576)) ] || die "that is over the $limit MiB the device tool carries" 1
cat <<EOF
gpu-pack.sh: the call (device tool, run), sections most wanted first; no section starts after 300 s, and
every program gets its TERM by 530 s and its KILL by 545 s, so the report comes back whole and the
device time left allows a rerun:
  carry: ["$dest"]
  timeout_s: 560
  command: rm -rf $(printf %q "$name") && ln -s $(printf %q "$dest/build") $(printf %q "$name") && PYTHONUNBUFFERED=1 bash tools/gpu-check.sh --build $(printf %q "$name") --data $(printf %q "$dest/data") --report \$OUT/gpu-report.md --sections parity,first-use,models,fp8,post-backward,host-sync,training,nccl,throughput,scaling --budget 300 --deadline 530
EOF
