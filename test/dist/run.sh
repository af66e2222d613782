#!/usr/bin/env bash
# test/dist/run.sh: the release tarball, used as a user uses it. Hook 55
# runs it.
#
#   test/dist/run.sh
#
# `make dist` writes idempotency-VERSION.tar.gz (git archive of HEAD); this
# test unpacks it in a temporary directory, away from the checkout, and:
#   1. the tarball is named after idempotency.control's default_version and
#      holds one directory idempotency-VERSION/ with the LICENSE, the
#      consolidated install script, the three helper packages' manifests,
#      and nothing a checkout builds or installs (node_modules, .venv, gems,
#      objects, the runner's binary);
#   2. the extension and the runner build from it (make; make -C matrix,
#      PGXS, nothing installed);
#   3. the Python package installs from its helpers/python with pip into a
#      new venv without an index (its examples/celery/venv.sh); it is
#      imported from the venv, at the manifest's version, under the
#      PostgreSQL License;
#   4. the gem is built from its helpers/ruby and installed with
#      `gem install --local` into a new GEM_HOME (its
#      examples/sidekiq/install-gem.sh); it is required from there, at the
#      gemspec's version, under the PostgreSQL License;
#   5. `npm pack` of its helpers/node, then `npm install` of that .tgz into a
#      new app directory (its dependency pg comes from the npm registry);
#      `import("pg-idempotency")` there gives idempotent and
#      idempotentBatch, at the package.json's version, under the PostgreSQL
#      License.
#   Each of the three installed packages carries the portable edition's
#   plain script, made by its build from the tarball's portable/*.sql: what
#   it prints (python3 -m pg_idempotency portable-sql, PgIdempotency.
#   portable_sql, the bin pg-idempotency portable-sql) is the tarball's
#   `sh portable/build.sh`'s idempotency-portable.sql, byte for byte.
# Each step is an "ok - ..." or "not ok - ..." line; the last line is
# "dist: N passed, N failed"; exit non-zero on a failure.
#
# Needs git, make, pg_config and a C compiler (PGXS), Debian's python3-venv,
# python3-setuptools, python3-wheel, python3-psycopg and python3-celery,
# ruby and ruby-pg, and a node (20 or later) with npm: hook 55 installs the
# missing ones (see scripts/test.d/55-dist.sh).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
version=$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" "$root/idempotency.control")
# The helpers' version: the extension's MAJOR.MINOR and a patch level of
# their own (0.5.0 with the extension 0.5; 0.5.1 for a release of the
# helpers alone), the same in the three packages: pyproject.toml's is the
# one the three installed packages must report.
semver=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$root/helpers/python/pyproject.toml")
name=idempotency-$version
if [[ ! $semver =~ ^${version//./\\.}\.[0-9]+$ ]]; then
    echo "not ok - the helpers' version ${semver:-(none in helpers/python/pyproject.toml)} is not the extension's $version with a patch level"
    exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dist-test.XXXXXX") || exit 2
passed=0
failed=0
ok() { echo "ok - $*"; passed=$((passed + 1)); }
not_ok() {   # not_ok LOG|"" TEXT
    local log=$1; shift
    echo "not ok - $*"
    [[ -n $log && -f $log ]] && sed 's/^/    /' "$log" | tail -n 40
    failed=$((failed + 1))
}
finish() {
    if ((failed == 0)); then
        rm -rf "$tmp"
    else
        echo "# kept: $tmp"
    fi
}
trap finish EXIT

# ---------------------------------------------------------------------
# 1. make dist, and what the tarball holds
# ---------------------------------------------------------------------
# written into $tmp (make dist writes into the directory make runs in)
if (cd "$tmp" && make --no-print-directory -s -f "$root/Makefile" dist) >"$tmp/dist.log" 2>&1 &&
    [[ -f $tmp/$name.tar.gz ]]; then
    tar -tzf "$tmp/$name.tar.gz" >"$tmp/list" 2>>"$tmp/dist.log"
    tops=$(cut -d/ -f1 "$tmp/list" | sort -u | tr '\n' ' ')
    missing=()
    for f in LICENSE README.md CHANGELOG.md META.json idempotency.control "idempotency--$version.sql" \
        Makefile matrix/Makefile helpers/python/pyproject.toml helpers/ruby/pg-idempotency.gemspec \
        helpers/node/package.json helpers/node/LICENSE; do
        grep -qxF "$name/$f" "$tmp/list" || missing+=("$f")
    done
    built=$(grep -E '/(node_modules|\.venv|gems|__pycache__)/|\.(o|so|bc)$|/matrix/idempotency-matrix$' "$tmp/list" | head -n 3)
    if [[ $tops != "$name " ]]; then
        not_ok "" "make dist: the tarball's top level is '$tops', not '$name'"
    elif ((${#missing[@]})); then
        not_ok "" "make dist: $name.tar.gz lacks ${missing[*]}"
    elif [[ -n $built ]]; then
        not_ok "" "make dist: $name.tar.gz holds built or installed files: $built"
    else
        ok "make dist: $name.tar.gz, $(wc -l <"$tmp/list") entries under $name/, LICENSE and idempotency--$version.sql in it, nothing built"
    fi
    tar -xzf "$tmp/$name.tar.gz" -C "$tmp"
else
    not_ok "$tmp/dist.log" "make dist failed"
    echo "dist: $passed passed, $failed failed"
    exit 1
fi
tree=$tmp/$name
# the portable edition's plain script each package must carry
sh "$tree/portable/build.sh" "$tmp/portable" >/dev/null 2>&1 || echo "portable/build.sh of the tarball failed" >&2
portable=$tmp/portable/idempotency-portable.sql

# ---------------------------------------------------------------------
# 2. the extension and the runner build from the tarball
# ---------------------------------------------------------------------
if make --no-print-directory -s -C "$tree" >"$tmp/build.log" 2>&1 &&
    [[ -f $tree/idempotency.so ]] &&
    make --no-print-directory -s -C "$tree/matrix" >>"$tmp/build.log" 2>&1 &&
    "$tree/matrix/idempotency-matrix" --help >/dev/null 2>>"$tmp/build.log"; then
    ok "the extension (idempotency.so) and the runner (matrix/idempotency-matrix) build from the tarball"
else
    not_ok "$tmp/build.log" "the extension or the runner does not build from the tarball"
fi

# ---------------------------------------------------------------------
# 3. Python: pip in a new venv, no index
# ---------------------------------------------------------------------
if py=$(bash "$tree/examples/celery/venv.sh" "$tmp/venv" 2>"$tmp/python.log"); then
    if "$py" -m pg_idempotency portable-sql 2>>"$tmp/python.log" | cmp -s - "$portable"; then
        ok "Python: python3 -m pg_idempotency portable-sql prints the tarball's portable/build.sh script"
    else
        not_ok "$tmp/python.log" "Python: python3 -m pg_idempotency portable-sql is not the tarball's portable/build.sh script"
    fi
    if out=$("$py" - "$tmp/venv" "$semver" 2>>"$tmp/python.log" <<'EOF'
import sys
from importlib import metadata
import pg_idempotency
import pg_idempotency.celery  # noqa: F401 -- the Celery base class imports too
venv, want = sys.argv[1:]
problems = []
if not pg_idempotency.__file__.startswith(venv + "/"):
    problems.append(f"imported from {pg_idempotency.__file__}, not from the venv")
if pg_idempotency.__version__ != want or metadata.version("pg-idempotency") != want:
    problems.append(f"version {pg_idempotency.__version__} / {metadata.version('pg-idempotency')}, not {want}")
lic = metadata.metadata("pg-idempotency").get("License")
if lic != "PostgreSQL":
    problems.append(f"license {lic!r}")
print("; ".join(problems) or "fine")
EOF
    ) && [[ $out == fine ]]; then
        ok "Python: pg-idempotency $semver installed from the tarball's helpers/python into a venv with pip --no-index, imported from there, PostgreSQL License"
    else
        echo "${out:-}" >>"$tmp/python.log"
        not_ok "$tmp/python.log" "Python: the package installed from the tarball: ${out:-import failed}"
    fi
else
    not_ok "$tmp/python.log" "Python: examples/celery/venv.sh of the tarball failed"
fi

# ---------------------------------------------------------------------
# 4. Ruby: gem build, gem install --local
# ---------------------------------------------------------------------
if bash "$tree/examples/sidekiq/install-gem.sh" "$tmp/gems" >"$tmp/ruby.log" 2>&1; then
    if GEM_HOME=$tmp/gems ruby -rpg_idempotency -e 'puts PgIdempotency.portable_sql' 2>>"$tmp/ruby.log" |
        cmp -s - "$portable"; then
        ok "Ruby: PgIdempotency.portable_sql of the installed gem is the tarball's portable/build.sh script"
    else
        not_ok "$tmp/ruby.log" "Ruby: PgIdempotency.portable_sql of the installed gem is not the tarball's portable/build.sh script"
    fi
    if out=$(GEM_HOME=$tmp/gems ruby -e '
        require "pg_idempotency"
        spec = Gem.loaded_specs["pg-idempotency"]
        problems = []
        problems << "loaded from #{spec.full_gem_path}" unless spec.full_gem_path.start_with?(ARGV[0] + "/")
        problems << "version #{PgIdempotency::VERSION} / #{spec.version}" unless PgIdempotency::VERSION == ARGV[1] && spec.version.to_s == ARGV[1]
        problems << "license #{spec.license.inspect}" unless spec.license == "PostgreSQL"
        puts(problems.empty? ? "fine" : problems.join("; "))' "$tmp/gems" "$semver" 2>>"$tmp/ruby.log") &&
        [[ $out == fine ]]; then
        ok "Ruby: the gem pg-idempotency $semver built from the tarball's helpers/ruby, installed with gem install --local, required from there, PostgreSQL License"
    else
        echo "${out:-}" >>"$tmp/ruby.log"
        not_ok "$tmp/ruby.log" "Ruby: the gem installed from the tarball: ${out:-require failed}"
    fi
else
    not_ok "$tmp/ruby.log" "Ruby: examples/sidekiq/install-gem.sh of the tarball failed"
fi

# ---------------------------------------------------------------------
# 5. Node.js: npm pack, npm install of the .tgz
# ---------------------------------------------------------------------
# the npm command (hook 55 passes the one examples/e2e/deps.sh chose)
read -ra npm <<<"${DIST_NPM:-npm}"
mkdir -p "$tmp/app"
echo '{ "name": "dist-test-app", "version": "1.0.0", "private": true, "type": "module" }' >"$tmp/app/package.json"
if tgz=$(cd "$tree/helpers/node" && "${npm[@]}" pack --silent --pack-destination "$tmp" 2>"$tmp/node.log") &&
    (cd "$tmp/app" && "${npm[@]}" install --no-audit --no-fund --loglevel=error "$tmp/$tgz") >>"$tmp/node.log" 2>&1; then
    if (cd "$tmp/app" && node node_modules/pg-idempotency/bin/pg-idempotency.mjs portable-sql) 2>>"$tmp/node.log" |
        cmp -s - "$portable" && [[ -x $tmp/app/node_modules/.bin/pg-idempotency ]]; then
        ok "Node.js: the bin pg-idempotency portable-sql of the installed package prints the tarball's portable/build.sh script"
    else
        not_ok "$tmp/node.log" "Node.js: the installed package's pg-idempotency portable-sql is not the tarball's portable/build.sh script (or no .bin/pg-idempotency)"
    fi
    if out=$(cd "$tmp/app" && node --input-type=module -e '
        import { idempotent, idempotentBatch } from "pg-idempotency";
        import { createRequire } from "node:module";
        const pkg = createRequire(import.meta.url)("pg-idempotency/package.json");
        const problems = [];
        if (typeof idempotent !== "function" || typeof idempotentBatch !== "function") problems.push("idempotent or idempotentBatch missing");
        if (pkg.version !== process.argv[1]) problems.push(`version ${pkg.version}`);
        if (pkg.license !== "PostgreSQL") problems.push(`license ${pkg.license}`);
        console.log(problems.length ? problems.join("; ") : "fine");' "$semver" 2>>"$tmp/node.log") &&
        [[ $out == fine ]] && [[ -f $tmp/app/node_modules/pg-idempotency/LICENSE ]]; then
        ok "Node.js: npm pack of the tarball's helpers/node ($tgz), npm install of it into an app, imported there, PostgreSQL License (LICENSE file packed)"
    else
        echo "${out:-}" >>"$tmp/node.log"
        not_ok "$tmp/node.log" "Node.js: the package installed from the tarball: ${out:-import failed}"
    fi
else
    not_ok "$tmp/node.log" "Node.js: npm pack or npm install of the tarball's helpers/node failed"
fi

echo "dist: $passed passed, $failed failed"
((failed == 0))
