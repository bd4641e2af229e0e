#!/usr/bin/env bash
# Start what the tests need, then run the given test command; stop the services on exit.
# Usage: bash scripts/test-services.sh CMD [ARGS...]   (the Makefile's `make test` does this)
# Each service is one start_* function below, called before the command runs.
set -euo pipefail

CLEANUPS=()
cleanup() {
    local rc=$?
    local i
    for ((i = ${#CLEANUPS[@]} - 1; i >= 0; i--)); do
        eval "${CLEANUPS[$i]}" || true
    done
    return "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "test-services: $*" >&2; }

# -- PostgreSQL (store tests: tests/store) --------------------------------------------------------
# A throwaway cluster: initdb into a temp dir, loopback only, trust auth for 127.0.0.1 only.
# Exports CTXKERNEL_TEST_PG_DSN. Skipped when that variable is already set (use your own server).
# Installs Debian's postgresql when it is missing and we are root with apt-get (CI's machine).
pg_bindir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -n "$dir" && -x "$dir/initdb" ]]; then
        echo "$dir"
    elif command -v initdb >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
    fi
}

start_postgres() {
    if [[ -n "${CTXKERNEL_TEST_PG_DSN:-}" ]]; then
        say "PostgreSQL: using CTXKERNEL_TEST_PG_DSN from the environment"
        return 0
    fi
    local bindir
    bindir=$(pg_bindir)
    if [[ -z "$bindir" && "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "PostgreSQL: not installed; installing Debian's postgresql"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >/dev/null || say "apt-get update failed"
        apt-get install -y -q --no-install-recommends postgresql >/dev/null \
            || say "apt-get install postgresql failed"
        bindir=$(pg_bindir)
    fi
    if [[ -z "$bindir" ]]; then
        say "PostgreSQL: no server binaries (initdb) found; PostgreSQL tests will skip (and fail under CI=true)"
        return 0
    fi
    local run=() owner=""
    if [[ "$(id -u)" == 0 ]]; then
        # initdb and postgres refuse to run as root: run them as the packaged postgres user
        owner=postgres
        getent passwd "$owner" >/dev/null || owner=nobody
        if command -v runuser >/dev/null 2>&1; then
            run=(runuser -u "$owner" --)
        else
            run=(setpriv --reuid="$owner" --regid="$(id -g "$owner")" --clear-groups)
        fi
    fi
    local dir port
    # as root the server runs as another user, who must reach the folder: /tmp always allows that
    if [[ -n "$owner" ]]; then dir=$(mktemp -d /tmp/ctxkernel-pg.XXXXXX); else dir=$(mktemp -d "${TMPDIR:-/tmp}/ctxkernel-pg.XXXXXX"); fi
    [[ -n "$owner" ]] && chown "$owner" "$dir"
    CLEANUPS+=("rm -rf '$dir'")
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    if ! "${run[@]}" "$bindir/initdb" -D "$dir/data" -U ctxkernel -A trust -E UTF8 --locale=C.UTF-8 --no-sync \
        >"$dir/initdb.log" 2>&1; then
        say "PostgreSQL: initdb failed:"; cat "$dir/initdb.log" >&2; return 0
    fi
    # trust, but only over the unix socket in our temp dir and from 127.0.0.1
    printf 'local all all trust\nhost all all 127.0.0.1/32 trust\n' >"$dir/data/pg_hba.conf"
    if ! "${run[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200" start >/dev/null; then
        say "PostgreSQL: the server did not start:"; cat "$dir/server.log" >&2; return 0
    fi
    CLEANUPS+=("${run[*]} '$bindir/pg_ctl' -D '$dir/data' -m immediate -w stop >/dev/null 2>&1")
    export CTXKERNEL_TEST_PG_DSN="postgresql://ctxkernel@127.0.0.1:$port/postgres"
    say "PostgreSQL: throwaway cluster at $CTXKERNEL_TEST_PG_DSN"
}

# -- Chromium (simulate's HTML report: tests/simulate/test_simulate_report.py) ----------------------------
# Headless Chromium renders the report page in a test. Installs Debian's chromium when it is
# missing and we are root with apt-get; under CI=true a failed install is an error. Exports
# CTXKERNEL_TEST_CHROMIUM with the binary's path.
chromium_bin() {
    local name
    for name in chromium chromium-browser google-chrome; do
        command -v "$name" 2>/dev/null && return 0
    done
    return 0
}

start_chromium() {
    local bin
    bin=$(chromium_bin)
    if [[ -z "$bin" && "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "Chromium: not installed; installing Debian's chromium"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >/dev/null || say "apt-get update failed"
        apt-get install -y -q --no-install-recommends chromium >/dev/null || say "apt-get install chromium failed"
        bin=$(chromium_bin)
    fi
    if [[ -z "$bin" ]]; then
        if [[ "${CI:-}" == "true" ]]; then
            say "Chromium: not installed and could not be installed (CI=true)"; return 1
        fi
        say "Chromium: not found; the HTML report rendering test will skip"
        return 0
    fi
    export CTXKERNEL_TEST_CHROMIUM="$bin"
    say "Chromium: $bin"
}

# -- Firefox (the web inspector's pages: tests/ui/test_ui_firefox.py) ------------------------------------
# Debian's firefox-esr, driven headless over WebDriver BiDi (its own protocol, no geckodriver and
# no Playwright build of Firefox, which needs a download). Installed like Chromium; exports
# CTXKERNEL_TEST_FIREFOX with the binary's path.
firefox_bin() {
    local name
    for name in firefox-esr firefox; do
        command -v "$name" 2>/dev/null && return 0
    done
    return 0
}

start_firefox() {
    local bin
    bin=$(firefox_bin)
    if [[ -z "$bin" && "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "Firefox: not installed; installing Debian's firefox-esr"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >/dev/null || say "apt-get update failed"
        apt-get install -y -q --no-install-recommends firefox-esr >/dev/null || say "apt-get install firefox-esr failed"
        bin=$(firefox_bin)
    fi
    if [[ -z "$bin" ]]; then
        if [[ "${CI:-}" == "true" ]]; then
            say "Firefox: not installed and could not be installed (CI=true)"; return 1
        fi
        say "Firefox: not found; the inspector's Firefox test will skip"
        return 0
    fi
    export CTXKERNEL_TEST_FIREFOX="$bin"
    say "Firefox: $bin"
}

# -- Agent CLIs (Claude Code, Codex CLI: tests/serve/test_serve_agent_clis.py, slow tier) -----------
# Installed from the npm registry at pinned versions into the project-local cache .cache/agent-clis
# (never globally); a second run finds them there. Exports CTXKERNEL_TEST_CLAUDE and
# CTXKERNEL_TEST_CODEX with the binaries' paths. Without npm the tests skip; under CI=true a failed
# install is an error.
CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0

start_agent_clis() {
    local root dir
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    dir="$root/.cache/agent-clis"
    if ! command -v npm >/dev/null 2>&1; then
        if [[ "${CI:-}" == "true" ]]; then
            say "Agent CLIs: npm is not installed (CI=true)"; return 1
        fi
        say "Agent CLIs: npm not found; the Claude Code and Codex CLI tests will skip"
        return 0
    fi
    local want="@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION @openai/codex@$CODEX_VERSION"
    if [[ "$(cat "$dir/.installed" 2>/dev/null || true)" != "$want" ]]; then
        say "Agent CLIs: installing $want into $dir"
        mkdir -p "$dir"
        # shellcheck disable=SC2086
        if ! npm install --prefix "$dir" --no-audit --no-fund --loglevel=error $want >"$dir/install.log" 2>&1; then
            say "Agent CLIs: npm install failed:"; tail -n 20 "$dir/install.log" >&2
            if [[ "${CI:-}" == "true" ]]; then return 1; fi
            return 0
        fi
        echo "$want" >"$dir/.installed"
    fi
    export CTXKERNEL_TEST_CLAUDE="$dir/node_modules/.bin/claude"
    export CTXKERNEL_TEST_CODEX="$dir/node_modules/.bin/codex"
    say "Agent CLIs: Claude Code $CLAUDE_CODE_VERSION, Codex CLI $CODEX_VERSION in $dir"
}

# -- aider (tests/serve/test_serve_agent_clis.py, slow tier) ------------------------------------------
# aider-chat from PyPI at a pinned version, in a virtual environment of its own under
# .cache/agent-clis/aider (never the project's: aider pins its own versions of openai, litellm and
# more). A second run finds it there. Exports CTXKERNEL_TEST_AIDER. Without python3 (3.10-3.12,
# what aider supports) the test skips; under CI=true a failed install is an error.
AIDER_VERSION=0.86.2

start_aider() {
    local root dir want
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    dir="$root/.cache/agent-clis/aider"
    want="aider-chat==$AIDER_VERSION"
    if [[ "$(cat "$dir/.installed" 2>/dev/null || true)" != "$want" ]]; then
        say "aider: installing $want into $dir"
        rm -rf "$dir"
        mkdir -p "$(dirname "$dir")"
        if ! { python3 -m venv "$dir" && "$dir/bin/python" -m pip install -q --disable-pip-version-check "$want"; } \
            >"$dir.install.log" 2>&1; then
            say "aider: install failed:"; tail -n 20 "$dir.install.log" >&2
            rm -rf "$dir"
            if [[ "${CI:-}" == "true" ]]; then return 1; fi
            return 0
        fi
        echo "$want" >"$dir/.installed"
    fi
    export CTXKERNEL_TEST_AIDER="$dir/bin/aider"
    say "aider: $AIDER_VERSION in $dir"
}

start_postgres
start_chromium
start_firefox
start_agent_clis
start_aider

"$@"
