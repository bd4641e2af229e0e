#!/usr/bin/env bash
# Start what the tests need, then run the given test command.
# Services are added here as the suite needs them (PostgreSQL, Chromium).
set -euo pipefail
exec "$@"
