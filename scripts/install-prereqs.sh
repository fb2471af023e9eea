#!/usr/bin/env bash
# Installs everything pg_uvm_share needs to build and test on Debian 12, idempotently:
# PostgreSQL 15 with its server headers, libclang (bindgen), sudo (cargo pgrx test --runas),
# cargo-pgrx 0.18.0, and `cargo pgrx init` against the system pg_config.
# Runs as root or as a normal user (then through sudo for apt).
set -euo pipefail
PGRX_VERSION=0.18.0
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

need_apt=()
for p in postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo make pkg-config libssl-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-prereqs: apt-get install ${need_apt[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null; then
  [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null || { echo "install-prereqs: cargo not found (install rustup first)" >&2; exit 1; }

# make lint needs rustfmt and clippy (rustup's default profile has them; a minimal one may not).
if command -v rustup >/dev/null; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
  done
fi

if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
  echo "install-prereqs: cargo install cargo-pgrx $PGRX_VERSION (several minutes, once)"
  cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

PGRX_HOME=${PGRX_HOME:-$HOME/.pgrx}
if ! grep -qs "pg15" "$PGRX_HOME/config.toml"; then
  cargo pgrx init --pg15 "$PG_CONFIG"
fi
echo "install-prereqs: ok"
