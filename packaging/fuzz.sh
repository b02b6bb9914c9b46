#!/usr/bin/env bash
# Coverage-guided fuzzing of the decoders tinylet runs on outside input
# (the fuzz crate in tests/fuzz, one libFuzzer target per decoder): builds
# every target with the nightly toolchain and cargo-fuzz, runs each for the
# given seconds (default 60) on one core, as many at once as there are
# cores, and prints a table of what ran.
# Exits non-zero when a target found a crash, timeout or OOM; the input is
# in $FUZZ_ARTIFACTS/<target>/ and belongs under tests/fuzz/regressions/.
#
#   packaging/fuzz.sh [seconds-per-target]
#
# Environment: FUZZ_TARGET_DIR (default /var/cache/tinylet/target-fuzzing;
# not CARGO_TARGET_DIR, which the stable builds that call this script set),
# FUZZ_CORPUS (the grown corpus, default /var/cache/tinylet/fuzz-corpus),
# FUZZ_ARTIFACTS (crash files, default /var/cache/tinylet/fuzz-artifacts),
# FUZZ_TARGETS (a space-separated subset of the targets), FUZZ_JOBS (targets
# run at once, default the number of cores), FUZZ_LOGS (keep libFuzzer's
# output there, one file per target).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-60}
if ! [[ $seconds =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
    echo "usage: $0 [seconds-per-target]" >&2
    exit 2
fi
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing the nightly toolchain" >&2
    # A machine that can fetch no other toolchain than its own cannot fuzz
    # (libFuzzer's instrumentation needs nightly): say so and stop here,
    # as real-apiserver.sh does without a control plane. The seeds and
    # crash files are still replayed on stable by tests/fuzz_regressions.rs.
    if ! rustup toolchain install nightly --profile minimal; then
        echo "fuzz.sh: SKIPPED: no nightly toolchain here and none can be installed" >&2
        exit 0
    fi
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    # Unoptimized: it only drives cargo and libFuzzer, and builds in a
    # third of the time (minutes on a fresh machine). --force: one that is
    # there but does not run (built against another glibc) is replaced.
    cargo install --locked --debug --force cargo-fuzz
fi

# The sanitizer build of the library (without its `cri` feature, so no
# gRPC) takes minutes cold: keep the target dir across runs, apart from the
# stable builds' one.
target_dir=${FUZZ_TARGET_DIR:-/var/cache/tinylet/target-fuzzing}
corpus_root=${FUZZ_CORPUS:-/var/cache/tinylet/fuzz-corpus}
artifacts_root=${FUZZ_ARTIFACTS:-/var/cache/tinylet/fuzz-artifacts}
fuzz_dir=tests/fuzz
if [ -n "${FUZZ_LOGS:-}" ]; then
    logs=$FUZZ_LOGS
    mkdir -p "$logs"
else
    logs=$(mktemp -d)
    trap 'rm -rf "$logs"' EXIT
fi

if [ -n "${FUZZ_TARGETS:-}" ]; then
    read -r -a targets <<<"$FUZZ_TARGETS"
else
    mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir "$fuzz_dir")
fi

echo "fuzz.sh: building ${targets[*]} (target dir $target_dir)" >&2
cargo +nightly fuzz build -O --fuzz-dir "$fuzz_dir" --target-dir "$target_dir"

# fuzz_one TARGET: runs TARGET for $seconds and leaves in $logs its table
# row (TARGET.row) and, when it found something, TARGET.failed.
fuzz_one() {
    local target=$1
    local corpus="$corpus_root/$target"
    local artifacts="$artifacts_root/$target"
    mkdir -p "$corpus" "$artifacts"
    local found_before
    found_before=$(find "$artifacts" -type f | wc -l)
    local log="$logs/$target.log"
    echo "fuzz.sh: running $target for ${seconds}s (corpus $corpus)" >&2
    local start
    start=$(date +%s)
    # The grown corpus comes first (new inputs are written there); the
    # committed seeds are read only. stdin is closed: a kubeconfig naming
    # /dev/stdin must not wait for a terminal.
    local status=0
    cargo +nightly fuzz run -O --fuzz-dir "$fuzz_dir" --target-dir "$target_dir" \
        "$target" \
        "$corpus" "$fuzz_dir/corpus/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" \
        </dev/null >"$log" 2>&1 || status=$?
    local ran executions per_second last cov ft units found
    ran=$(($(date +%s) - start))
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    per_second=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -n1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    units=$(find "$corpus" -type f | wc -l)
    found=$(($(find "$artifacts" -type f | wc -l) - found_before))
    if [ "$status" -ne 0 ] || [ "$found" -gt 0 ]; then
        echo "$status" >"$logs/$target.failed"
    fi
    printf '%-14s %8s %12s %8s %8s %6s %6s %8s\n' "$target" "$ran" \
        "${executions:-?}" "${per_second:-?}" "$units" "${cov:-?}" "${ft:-?}" "$found" \
        >"$logs/$target.row"
}

# Each target runs on one core: as many at once as there are cores, so a
# 2-core machine takes half the time for the same seconds per target.
jobs=${FUZZ_JOBS:-$(nproc)}
if ! [[ $jobs =~ ^[0-9]+$ ]] || [ "$jobs" -eq 0 ]; then
    jobs=1
fi
for target in "${targets[@]}"; do
    rm -f "$logs/$target.row" "$logs/$target.failed"
done
running=0
for target in "${targets[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    fuzz_one "$target" &
    running=$((running + 1))
done
wait || true

rows=()
failed=0
for target in "${targets[@]}"; do
    log="$logs/$target.log"
    if [ ! -f "$logs/$target.row" ] || [ -f "$logs/$target.failed" ]; then
        failed=1
        status=$(cat "$logs/$target.failed" 2>/dev/null || echo "?")
        echo "fuzz.sh: $target stopped with status $status; the end of its log:" >&2
        tail -n 40 "$log" >&2 || true
    fi
    rows+=("$(cat "$logs/$target.row" 2>/dev/null || printf '%-14s (no result)' "$target")")
done

printf '%-14s %8s %12s %8s %8s %6s %6s %8s\n' target seconds executions exec/s \
    corpus cov ft crashes
printf '%s\n' "${rows[@]}"
if [ "$failed" -ne 0 ]; then
    echo "fuzz.sh: crash, timeout or OOM inputs are in $artifacts_root" >&2
    exit 1
fi
