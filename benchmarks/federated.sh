#!/usr/bin/env bash
# Federated TPC-H over PostgreSQL, side by side: Basin's postgres connector (scheduler + 2
# executors), DuckDB's postgres_scanner and PostgreSQL alone, in the same run.
# Usage: benchmarks/federated.sh --sf 1 [--runs 3] [--executors 2] [--queries 1,3,6]
# [--pg-url postgres://...] [--stop-services]. Without --pg-url or $BASIN_TEST_PG_URL it uses
# (or starts) the .ci/services.sh postgres. Results: benchmarks/results/federated-sfN.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/basin/target}"
python3 -m pip install --quiet --disable-pip-version-check \
  "duckdb==1.5.5" "duckdb-extension-tpch==1.5.5" "duckdb-extension-postgres-scanner==1.5.5" \
  "tpchgen-cli==4.0.0" "adbc-driver-flightsql==1.13.0" "adbc-driver-manager==1.13.0" \
  "pyarrow==26.0.1" 2>&1 | grep -v "Running pip as the 'root' user" || true
# Timings need an optimized build; BASIN_BENCH_PROFILE=debug runs the debug build (smoke).
profile="${BASIN_BENCH_PROFILE:-release}"
if [[ "$profile" == release ]]; then
  cargo build --locked --release -p basin-cli
else
  cargo build --locked -p basin-cli
fi
exec python3 benchmarks/federated.py --basin "$CARGO_TARGET_DIR/$profile/basin" "$@"
