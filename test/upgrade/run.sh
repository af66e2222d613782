#!/usr/bin/env bash
# test/upgrade/run.sh: major-version upgrade with live records, 15 -> 17 and
# 15 -> 18, each in a clean Debian root (scripts/root): trixie for 17, forky
# (testing) for 18. Root only (scripts/root mounts and chroots).
#
#   test/upgrade/run.sh [MAJOR...]        default: 17 18 (UPGRADE_MAJORS)
#
# 1. Build the extension for 15 on this machine (Debian 12, as a user built it
#    before upgrading Debian), in a copy of the tree, installed into a staging
#    directory (make install DESTDIR=...). Needs postgresql-server-dev-15 (and
#    gcc, make, libpq-dev): installed with apt-get when missing.
# 2. For each MAJOR: scripts/root run RELEASE with this tree and the staging
#    directory; inside, test/upgrade/in-root.sh installs bookworm's
#    postgresql-15 beside the release's PostgreSQL (a Debian 12 system
#    dist-upgraded), the staged extension for 15, builds the extension for
#    MAJOR, and runs test/upgrade/scenario.sh (pg_upgradecluster, checks).
# postgresql-15 comes from bookworm-security (an up-to-date Debian 12), except
# for 18: Debian's 18 (18.6, testing and unstable) cannot take what 15.20
# writes (pg_upgrade: 'unrecognized parameter "pg_attver"', for any table),
# so that run installs bookworm's point-release 15 (UPGRADE_SUITE_18, default
# bookworm; set it to bookworm-security to see the failure).
# Prints each run's time; exits 1 if any run failed. UPGRADE_TIMEOUT (seconds,
# default 900) bounds each run.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
OLD=15
# shellcheck source=scripts/versions.sh
source "$repo/scripts/versions.sh"

((EUID == 0)) || { echo "test/upgrade/run.sh: needs root (scripts/root mounts and chroots)" >&2; exit 2; }
majors=("$@")
((${#majors[@]})) || read -r -a majors <<<"${UPGRADE_MAJORS:-17 18}"

tmp=$(mktemp -d /var/tmp/idempotency-upgrade.XXXXXX)
trap 'rm -rf --one-file-system "$tmp"' EXIT
t_all=$SECONDS

# --- 1. the extension for 15, built on this machine -------------------------
pg_config15=/usr/lib/postgresql/$OLD/bin/pg_config
if [[ ! -x $pg_config15 || ! -f /usr/lib/postgresql/$OLD/lib/pgxs/src/makefiles/pgxs.mk ]] ||
   ! command -v gcc >/dev/null || ! command -v make >/dev/null || [[ ! -f /usr/include/postgresql/libpq-fe.h ]]; then
    echo "== apt-get install postgresql-server-dev-$OLD gcc make libc6-dev libpq-dev"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
        "postgresql-server-dev-$OLD" gcc make libc6-dev libpq-dev >"$tmp/apt.log" 2>&1 ||
        { tail -n 30 "$tmp/apt.log"; echo "test/upgrade/run.sh: could not install the build packages for $OLD (this step needs Debian 12)" >&2; exit 1; }
fi
echo "== building the extension for $OLD on this machine ($("$pg_config15" --version))"
mkdir "$tmp/build15" "$tmp/stage15"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
    tar --null -T - -cf -) | tar -C "$tmp/build15" -xf -
if ! { make -C "$tmp/build15" --no-print-directory -j2 with_llvm=no PG_CONFIG="$pg_config15" &&
       make -C "$tmp/build15" --no-print-directory install with_llvm=no PG_CONFIG="$pg_config15" \
           DESTDIR="$tmp/stage15"; } >"$tmp/build15.log" 2>&1; then
    tail -n 40 "$tmp/build15.log"
    echo "test/upgrade/run.sh: building for $OLD failed (log above)" >&2
    exit 1
fi

# --- 2. each major, in its root ----------------------------------------------
declare -A result=() took=()
rc_all=0
for m in "${majors[@]}"; do
    release=$(versions_debian_release "$m")
    if [[ -z $release || $m == "$OLD" ]]; then
        echo "test/upgrade/run.sh: no Debian release packages PostgreSQL $m (or it is the old major)" >&2
        result[$m]="not run"; rc_all=1; continue
    fi
    suite=bookworm-security
    [[ $m == 18 ]] && suite=${UPGRADE_SUITE_18:-bookworm}
    echo "== $OLD ($suite) -> $m in a clean $release root"
    t0=$SECONDS
    rc=0
    "$repo/scripts/root" run "$release" --tree "$repo" --in "$tmp/stage15:/var/tmp/stage15" \
        --timeout "${UPGRADE_TIMEOUT:-900}" -- "test/upgrade/in-root.sh $m /var/tmp/stage15 $suite" || rc=$?
    took[$m]=$((SECONDS - t0))
    if ((rc)); then result[$m]="FAILED (exit $rc)"; rc_all=1; else result[$m]=passed; fi
done

echo "== upgrade summary"
for m in "${majors[@]}"; do
    printf '   %s -> %s: %s%s\n' "$OLD" "$m" "${result[$m]}" "${took[$m]:+, ${took[$m]} s}"
done
echo "   total $((SECONDS - t_all)) s"
exit "$rc_all"
