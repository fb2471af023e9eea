#!/usr/bin/env bash
# Builds a Debian package of pg_uvm_share for one PostgreSQL major (`make package PG=N`).
#
#   scripts/package-deb.sh N PG_CONFIG OUT_DIR
#
# The package is named postgresql-N-pg-uvm-share, as Debian names its extension packages
# (postgresql-15-pgvector, ...), carries the crate's version, depends on postgresql-N, and puts
# its files where PostgreSQL's own Debian packages keep theirs:
#
#   /usr/lib/postgresql/N/lib/pg_uvm_share.so                      the library
#   /usr/share/postgresql/N/extension/pg_uvm_share.control         the control file
#   /usr/share/postgresql/N/extension/pg_uvm_share--*.sql          the current version's script,
#                                                                  the update scripts and the
#                                                                  frozen scripts of earlier
#                                                                  versions (sql/)
#   /usr/include/postgresql/N/server/extension/pg_uvm_share/pg_uvm_share.h   the C API's header
#   /usr/share/doc/postgresql-N-pg-uvm-share/                      README, C API, copyright
#
# The library is built by `cargo pgrx package` against PG_CONFIG (Debian's for 15, the
# relocatable build of scripts/pg-binaries.sh for the others: the same major's ABI); the paths
# above are Debian's whatever PG_CONFIG says. Prints the path of the .deb. Needs dpkg-deb.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 3 ] || { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
N=$1 PG_CONFIG=$2 OUT=$3
command -v dpkg-deb >/dev/null || { echo "package-deb.sh: dpkg-deb is missing (apt-get install dpkg-dev)" >&2; exit 1; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
name="postgresql-$N-pg-uvm-share"
raw=target/deb/raw-pg$N
stage=target/deb/${name}_${version}_${arch}
rm -rf "$raw" "$stage"
mkdir -p "$raw" "$OUT"

# The extension's files, laid out under the pg_config paths of the build.
cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$raw" >&2
lib=$(find "$raw" -name 'pg_uvm_share.so' -type f | head -n1)
ctl=$(find "$raw" -name 'pg_uvm_share.control' -type f | head -n1)
[ -n "$lib" ] && [ -n "$ctl" ] || { echo "package-deb.sh: cargo pgrx package made no library or control file in $raw" >&2; exit 1; }
extdir=$(dirname "$ctl")
[ -f "$extdir/pg_uvm_share--$version.sql" ] || { echo "package-deb.sh: no pg_uvm_share--$version.sql in $extdir" >&2; exit 1; }

install -D -m 755 "$lib" "$stage/usr/lib/postgresql/$N/lib/pg_uvm_share.so"
dest="$stage/usr/share/postgresql/$N/extension"
install -D -m 644 "$ctl" "$dest/pg_uvm_share.control"
for f in "$extdir"/pg_uvm_share--*.sql; do install -m 644 "$f" "$dest/"; done
# The frozen install scripts of earlier versions (CREATE EXTENSION ... VERSION '<old>').
for f in sql/pg_uvm_share--*.sql; do
  case "$(basename "$f")" in pg_uvm_share--*--*.sql | "pg_uvm_share--$version.sql") continue ;; esac
  install -m 644 "$f" "$dest/"
done
install -D -m 644 include/pg_uvm_share.h "$stage/usr/include/postgresql/$N/server/extension/pg_uvm_share/pg_uvm_share.h"
doc="$stage/usr/share/doc/$name"
install -D -m 644 README.md "$doc/README.md"
install -D -m 644 docs/C-API.md "$doc/C-API.md"
cat > "$doc/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: pg_uvm_share
License: PostgreSQL
EOF
# The installed size in KiB.
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<EOF
Package: $name
Version: $version
Architecture: $arch
Maintainer: pg_uvm_share developers <pg_uvm_share@localhost>
Depends: postgresql-$N, libc6
Section: database
Priority: optional
Installed-Size: $size
Homepage: https://pgxn.org/dist/pg_uvm_share/
Description: shared managed GPU memory segments for PostgreSQL $N
 pg_uvm_share gives PostgreSQL backends, parallel workers and background workers
 named, growable memory regions in GPU and pinned host memory, mapped at the same
 address in every process, with a GpuJoin plan node and a C API for other
 extensions. Load it with shared_preload_libraries = 'pg_uvm_share'.
EOF
deb="$OUT/${name}_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$stage" "$deb" >&2
echo "$deb"
