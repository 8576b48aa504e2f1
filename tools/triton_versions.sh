#!/usr/bin/env bash
# Compile every Triton kernel of this codebase for sm_90 with each Triton that the supported torch versions
# bring (and the newest), without a GPU, and write the summary to docs/triton_versions.md.
#   bash tools/triton_versions.sh [CACHE_DIR]     (default /tmp/triton-versions; about 3 minutes per version)
# Each Triton is installed once with `pip install --no-deps --target CACHE_DIR/VERSION triton==VERSION` and
# used through PYTHONPATH; tools/kernel_resources.py --brief compiles the separable kernel's and the GRAPE-AP
# kernels' default tiles at D = 64 and 128 in bf16 and fp16 and reads registers and stack from the binaries.
# A kernel that a Triton cannot build (an error, or a failed assertion that aborts its compiler process) is
# named in the note column.
set -uo pipefail
cd "$(dirname "$0")/.."
cache=${1:-/tmp/triton-versions}
mkdir -p "$cache"
# torch version(s) -> the Triton their Linux x86-64 wheels require (from the wheels' metadata), then the newest
# (TRITON_VERSIONS="2.10,2.11:3.6.0 newest:3.9.0" bash tools/triton_versions.sh: only those)
pairs=${TRITON_VERSIONS:-"2.4:3.0.0 2.5:3.1.0 2.6:3.2.0 2.7:3.3.1 2.8:3.4.0 2.9:3.5.1 2.10,2.11:3.6.0 2.12:3.7.0 2.13:3.7.1 2.14:3.8.0 newest:3.9.0"}
out=docs/triton_versions.md
{
    echo "# Triton versions: do the kernels build?"
    echo
    echo "\`bash tools/triton_versions.sh\`: every Triton kernel compiled for sm_90 (H100/H200) without a GPU by"
    echo "\`tools/kernel_resources.py --brief\` under each Triton that torch 2.4 to 2.14 bring, default tiles,"
    echo "D = 64 and 128, bf16 and fp16, each without and with a sliding window (24 kernels per family). 'spill' ="
    echo "a kernel with stack > 0 B."
    echo
    echo "| torch | triton | separable (3 kernels x 8) | GRAPE-AP (3 kernels x 8) | note |"
    echo "|---|---|---|---|---|"
} >"$out.tmp"
for pair in $pairs; do
    torch_versions=${pair%%:*}
    version=${pair##*:}
    if [ ! -d "$cache/$version/triton" ]; then
        python3 -m pip install -q --no-deps --target "$cache/$version" "triton==$version" || {
            echo "| $torch_versions | $version | - | - | not installable here |" >>"$out.tmp"; continue; }
    fi
    log="$cache/$version.log"
    PYTHONPATH="$cache/$version" timeout 1800 python3 tools/kernel_resources.py --brief --dtype bf16,fp16 \
        --families separable,grape_ap >"$log" 2>&1
    rc=$?
    summary() {  # summary FAMILY: "N of M build, S spill"
        local lines built spill
        lines=$(grep -c "| $1 _" "$log")
        built=$(grep "| $1 _" "$log" | grep -vc "fails:")
        spill=$(grep "| $1 _" "$log" | grep -c "(spills)")
        echo "$built of $lines build, $spill spill"
    }
    note=""
    failing=$(grep "fails:" "$log" | sed 's/^triton [^|]*| //; s/ | fails:.*//' | tr '\n' ',' | sed 's/,$//; s/,/, /g')
    [ -n "$failing" ] && note="fail: $failing ($(grep -m1 "fails:" "$log" | sed 's/.*fails: //' | cut -c1-100))"
    [ "$rc" -gt 1 ] && note="$note; the run itself ended with exit status $rc"
    echo "| $torch_versions | $version | $(summary separable) | $(summary grape_ap) | ${note//|//} |" | tee -a "$out.tmp"
done
mv "$out.tmp" "$out"
echo "wrote $out"
