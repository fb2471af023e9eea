#!/usr/bin/env bash
# Tests the Debian package of pg_uvm_share for PostgreSQL N against the machine's Debian
# PostgreSQL N (`make package-test`, CI for 15): builds it (scripts/package-deb.sh), removes what
# `make install` put in PostgreSQL's directories so that only the package provides the
# extension, installs it with dpkg -i, checks what dpkg says it installed, runs the pg_regress
# suites (scripts/regress.sh, the C API's consumer built against the packaged header) against
# it, and removes it again (dpkg -r). Run as root, or with sudo for dpkg.
#
#   scripts/package-test.sh N PG_CONFIG
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { sed -n '9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
N=$1 PG_CONFIG=$2
SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
[ "$("$PG_CONFIG" --pkglibdir)" = "/usr/lib/postgresql/$N/lib" ] ||
  { echo "package-test.sh: $PG_CONFIG is not Debian's PostgreSQL $N: the package installs there" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
name="postgresql-$N-pg-uvm-share"

deb=$(scripts/package-deb.sh "$N" "$PG_CONFIG" target/deb)
echo "package-test: built $deb ($(du -h "$deb" | cut -f1))"
# Only the package may provide the extension from here on.
$SUDO rm -f "/usr/lib/postgresql/$N/lib/pg_uvm_share.so" /usr/share/postgresql/"$N"/extension/pg_uvm_share[.-]*
$SUDO rm -rf "/usr/include/postgresql/$N/server/extension/pg_uvm_share"
trap '$SUDO dpkg -r "$name" >/dev/null || true' EXIT
$SUDO dpkg -i "$deb"
[ "$(dpkg-query -W -f '${Version}' "$name")" = "$version" ] || { echo "package-test: dpkg does not list $name $version" >&2; exit 1; }
for f in "/usr/lib/postgresql/$N/lib/pg_uvm_share.so" "/usr/share/postgresql/$N/extension/pg_uvm_share.control" \
  "/usr/share/postgresql/$N/extension/pg_uvm_share--$version.sql" \
  "/usr/include/postgresql/$N/server/extension/pg_uvm_share/pg_uvm_share.h"; do
  dpkg -S "$f" | grep -q "^$name:" || { echo "package-test: $f is not the package's" >&2; exit 1; }
done
echo "package-test: $name $version installed; running the regress suites against it"
make regress PG="$N"
echo "package-test: passed; removing $name (make install puts the extension back)"
