#!/usr/bin/env bash
# TPC-H or TPC-DS side by side: Basin (Iceberg, scheduler + 2 executors), Basin standalone,
# DuckDB and DataFusion on the same data in the same run. Usage: benchmarks/run.sh
# [--suite tpch|tpcds] --sf 1 [--runs 3] [--executors 2] [--queries 1,3,6] [--engines ...].
# Results: benchmarks/results/<suite>-sfN.{json,md,png}. The suite defaults to tpch.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/basin/target}"
suite=tpch
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --suite) suite="${2:?--suite needs tpch or tpcds}"; shift 2 ;;
    --suite=*) suite="${1#--suite=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ "$suite" == tpch || "$suite" == tpcds ]] || { echo "--suite is tpch or tpcds, not $suite" >&2; exit 2; }
python3 -m pip install --quiet --disable-pip-version-check \
  "duckdb==1.5.5" "duckdb-extension-tpch==1.5.5" "duckdb-extension-tpcds==1.5.5" "tpchgen-cli==4.0.0" \
  "datafusion==53.0.0" "adbc-driver-flightsql==1.13.0" "adbc-driver-manager==1.13.0" "pyarrow==26.0.1" \
  "matplotlib==3.11.2" 2>&1 | grep -v "Running pip as the 'root' user" || true
# Timings need an optimized build; BASIN_BENCH_PROFILE=debug runs the debug build (smoke).
profile="${BASIN_BENCH_PROFILE:-release}"
if [[ "$profile" == release ]]; then
  cargo build --locked --release -p basin-cli
else
  cargo build --locked -p basin-cli
fi
exec python3 "benchmarks/$suite.py" --basin "$CARGO_TARGET_DIR/$profile/basin" ${args[@]+"${args[@]}"}
