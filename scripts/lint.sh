#!/usr/bin/env bash
# The repository's static checks, run by `make test` (and so by .ci/run) before the tests:
#   ruff check          lint rules of pyproject.toml over the whole tree
#   ruff format --check formatting over the whole tree (set CTXKERNEL_LINT_FORMAT=0 to skip it
#                       until the tree has been formatted once)
#   mypy --strict       src and every plugin and example package
#   lint-imports        the architecture contracts of pyproject.toml ([tool.importlinter])
# Usage: scripts/lint.sh [PYTHON]   (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
BIN="$(dirname "$PY")"
status=0
run() { echo "+ $*"; "$@" || status=1; }

run "$BIN/ruff" check .
if [ "${CTXKERNEL_LINT_FORMAT:-1}" != "0" ]; then
    run "$BIN/ruff" format --check .
fi
packages=(-p ctxkernel)
for pkg in plugins/*/src/ctxkernel_* examples/*/src/ctxkernel_*; do
    packages+=(-p "$(basename "$pkg")")
done
run "$PY" -m mypy --strict "${packages[@]}"
run "$BIN/lint-imports"
exit $status
