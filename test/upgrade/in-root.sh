#!/usr/bin/env bash
# test/upgrade/in-root.sh: inside a throwaway Debian root made by scripts/root
# (trixie for 17, forky for 18), emulate a Debian 12 system upgraded to that
# release: bookworm's postgresql-15 stays installed beside the release's own
# PostgreSQL, with the extension installed for 15 as it was built on Debian 12.
# Then run test/upgrade/scenario.sh.
#
#   test/upgrade/in-root.sh NEW_MAJOR STAGE15 [SUITE]
#
# SUITE: where postgresql-15 comes from: bookworm-security (default: what an
# up-to-date Debian 12 runs) or bookworm (the point release's, older minor).
#
# STAGE15: a `make install DESTDIR=...` tree of the extension built for 15 on
# Debian 12 (test/upgrade/run.sh makes it on the host). cwd: the source tree.
# Packages: postgresql-15 from bookworm (pinned at priority 100, so nothing
# else is taken from bookworm), and gcc, make, libc6-dev, libpq-dev,
# postgresql-server-dev-NEW_MAJOR from the release, to build the extension
# for NEW_MAJOR from this tree.
set -euo pipefail

NEW=${1:?usage: in-root.sh NEW_MAJOR STAGE15}
STAGE=${2:?usage: in-root.sh NEW_MAJOR STAGE15}
SUITE=${3:-bookworm-security}
OLD=15
src=$(pwd)
t0=$SECONDS
step() { echo "== [$((SECONDS - t0)) s] $*"; }
apt_get() { apt-get -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=300 -q "$@"; }

. /etc/os-release
step "$PRETTY_NAME: adding bookworm and bookworm-security (pin 100) for postgresql-$OLD"
cat >/etc/apt/sources.list.d/bookworm.list <<'LIST'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian-security bookworm-security main
LIST
cat >/etc/apt/preferences.d/bookworm <<'PIN'
Package: *
Pin: release n=bookworm
Pin-Priority: 100

Package: *
Pin: release n=bookworm-security
Pin-Priority: 100
PIN
# testing's Release file may be expired against the clock (scripts/root sets
# this for forky's own suite); bookworm's are valid
apt_get update >/tmp/apt-update.log 2>&1 || { cat /tmp/apt-update.log; exit 1; }

step "apt-get install postgresql-$OLD ($SUITE) gcc make libc6-dev libpq-dev postgresql-server-dev-$NEW"
if ! apt_get install -y --no-install-recommends "postgresql-$OLD/$SUITE" "postgresql-client-$OLD/$SUITE" \
        gcc make libc6-dev libpq-dev \
        "postgresql-server-dev-$NEW" >/tmp/apt-install.log 2>&1; then
    tail -n 40 /tmp/apt-install.log
    echo "in-root.sh: could not install the packages (log above)" >&2
    exit 1
fi
for v in "$OLD" "$NEW"; do
    echo "   $("/usr/lib/postgresql/$v/bin/postgres" --version), from $(dpkg-query -W -f '${Package} ${Version}' "postgresql-$v")"
done

step "installing the extension built for $OLD on Debian 12 ($STAGE)"
[[ -f $STAGE/usr/lib/postgresql/$OLD/lib/idempotency.so ]] ||
    { echo "in-root.sh: $STAGE holds no idempotency.so for $OLD" >&2; exit 1; }
cp -a "$STAGE/." /

step "building the extension for $NEW (installed later, by the scenario)"
build=/var/tmp/build-$NEW
mkdir -p "$build"
tar -C "$src" --exclude=./.git -cf - . | tar -C "$build" -xf -
make -C "$build" --no-print-directory clean >/dev/null 2>&1 || true
if ! make -C "$build" --no-print-directory -j2 with_llvm=no \
        PG_CONFIG="/usr/lib/postgresql/$NEW/bin/pg_config" >/tmp/build.log 2>&1; then
    tail -n 40 /tmp/build.log
    echo "in-root.sh: building for $NEW failed (log above)" >&2
    exit 1
fi

step "scenario"
exec "$src/test/upgrade/scenario.sh" "$NEW" "$build"
