# Shared by scripts/bench-gptq-vs-llmcompressor.sh, scripts/bench-vs-peers.sh and scripts/bench-kda.sh (sourced).

# The squeeze binary to time: $SQUEEZE, else target/release/squeeze (under $CARGO_TARGET_DIR when set), built first.
squeeze_binary() {
  local repo_root="$1"
  if [ -n "${SQUEEZE:-}" ]; then
    echo "$SQUEEZE"
    return
  fi
  (cd "$repo_root" && cargo build --release --quiet) >&2
  echo "${CARGO_TARGET_DIR:-$repo_root/target}/release/squeeze"
}

# The llm-compressor 0.14 venv's python: $LLMC_PYTHON, else scripts/oracle/gptq/.venv (scripts/oracle/gptq/setup.sh).
llmc_python() {
  echo "${LLMC_PYTHON:-$1/scripts/oracle/gptq/.venv/bin/python}"
}

machine_line() {
  echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(date -u +%FT%TZ)," \
    "load $(cut -d' ' -f1-3 /proc/loadavg)"
}

# timed DIR command...: runs the command under /usr/bin/time (its output in DIR/last.out) and sets WALL (s),
# USER_CPU (s), RSS_GB (peak resident set, GiB) and LOAD (1-minute load average before → after). On failure prints
# the output's tail and returns 1.
timed() {
  local dir="$1"; shift
  local before rss
  before=$(cut -d' ' -f1 /proc/loadavg)
  if ! /usr/bin/time -f '%e %U %M' -o "$dir/time.log" "$@" >"$dir/last.out" 2>&1; then
    echo "failed: $*" >&2
    tail -5 "$dir/last.out" >&2
    return 1
  fi
  read -r WALL USER_CPU rss <"$dir/time.log"
  RSS_GB=$(printf '%.2f' "$(echo "$rss / 1048576" | bc -l)")
  LOAD="$before → $(cut -d' ' -f1 /proc/loadavg)"
}
