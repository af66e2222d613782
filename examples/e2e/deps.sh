# shellcheck shell=bash
# examples/e2e/deps.sh: sourced by scripts/test.d/8*.sh, the hooks that run
# the queue examples' end-to-end tests. Each hook installs what it needs.
#
#   e2e_debs [--no-install-recommends] PKG...
#                     install the Debian packages that are missing (as root;
#                     otherwise print the exact sudo apt-get line and fail)
#   e2e_node DIR [MAJOR]
#                     make `node` on PATH (for this hook only) a Node.js
#                     MAJOR, one DIR/node-versions pins (without MAJOR:
#                     PATH's if it is the oldest pinned major or later, else
#                     the newest pin), and set E2E_NPM to the npm command to
#                     run (see below)
#   e2e_node_bin DIR MAJOR
#                     the same without touching PATH: E2E_NODE_BIN is then a
#                     directory whose `node` is Node.js MAJOR (a hook that
#                     runs on two majors puts it on PATH per command)
#   e2e_npm DIR       npm ci in DIR unless its node_modules already match
#                     (npm ls) and its local file: dependencies (e.g.
#                     examples/sqs's pg-idempotency, file:../../helpers/node)
#                     have not changed since (a hash of their files, kept in
#                     DIR/node_modules/.e2e-local-deps): npm ls does not see
#                     an edit of a local package of the same version
#
# DIR/node-versions pins one exact Node.js version per supported major, one a
# line (examples/sqs: 22.x and 24.x, the LTS lines). A `node` on PATH, with an
# `npm`, is used as it is if its major is MAJOR (without MAJOR: the oldest
# pinned major or later; e.g. NodeSource's nodejs 22). Otherwise (Debian 12
# packages Node.js 18, Debian 13 Node.js 20): npm is taken from PATH, or
# Debian's `npm` package is installed (it brings Debian's nodejs), and that
# npm fetches the pinned version from the npm registry as the package
# node-linux-ARCH (the official Node.js binary inside a registry package,
# checked against the registry's sha512; the registry's `node` package
# installs the same package from its install script, which this skips) into
# a cache that survives between runs:
# /var/cache/idempotency/node-VERSION-linux-ARCH as root, else
# ${XDG_CACHE_HOME:-~/.cache}/idempotency/ (a non-root user with
# npm needs no sudo). npm itself keeps running under the node it came with
# (Debian's npm takes its modules from /usr/share/nodejs, where Debian's node
# looks).
# IDEMPOTENCY_NODE_CACHE overrides the cache's parent directory.

E2E_NPM=(npm)
_e2e_apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)

e2e_debs() {
    local pkg status missing=() flags=()
    if [[ ${1:-} == --no-install-recommends ]]; then
        flags=(--no-install-recommends)
        shift
    fi
    for pkg in "$@"; do
        status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
        [[ $status == ii* ]] || missing+=("$pkg")
    done
    ((${#missing[@]})) || return 0
    if ((EUID != 0)); then
        echo "e2e: missing Debian packages; install them with:" >&2
        echo "    sudo apt-get install -y ${flags[*]}${flags[*]:+ }${missing[*]}" >&2
        return 1
    fi
    echo "e2e: apt-get install -y ${flags[*]}${flags[*]:+ }${missing[*]}"
    local start=$SECONDS
    # a stale package index (nothing else ran apt-get update lately): update once and retry
    DEBIAN_FRONTEND=noninteractive apt-get "${_e2e_apt_opts[@]}" install -y -q "${flags[@]}" "${missing[@]}" >/dev/null ||
        { echo "e2e: apt-get update and retry"
          DEBIAN_FRONTEND=noninteractive apt-get "${_e2e_apt_opts[@]}" update -qq &&
          DEBIAN_FRONTEND=noninteractive apt-get "${_e2e_apt_opts[@]}" install -y -q "${flags[@]}" "${missing[@]}" >/dev/null; } ||
        { echo "e2e: apt-get install ${missing[*]} failed" >&2; return 1; }
    echo "e2e: installed ${missing[*]} in $((SECONDS - start)) s"
}

# _e2e_node_major: the major of the node on PATH, or 0
_e2e_node_major() {
    node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0
}

# _e2e_pins DIR: the versions DIR/node-versions pins, checked, oldest major
# first, one a line
_e2e_pins() {
    local file=$1/node-versions pins
    pins=$(tr -d ' \t\r' <"$file") || { echo "e2e: cannot read $file" >&2; return 1; }
    pins=$(grep -v '^$' <<<"$pins" | sort -t. -k1,1n || true)
    [[ -n $pins ]] || { echo "e2e: $file pins no version" >&2; return 1; }
    if grep -qvE '^[0-9]+\.[0-9]+\.[0-9]+$' <<<"$pins"; then
        echo "e2e: $file: '$(grep -vE '^[0-9]+\.[0-9]+\.[0-9]+$' <<<"$pins" | head -n 1)' is not a version (like 24.22.3)" >&2
        return 1
    fi
    echo "$pins"
}

# _e2e_find_npm: set E2E_NPM to an npm that runs under the node it came
# with: PATH's, else Debian's (installed as root)
_e2e_find_npm() {
    local why=$1
    if ! command -v npm >/dev/null 2>&1; then
        if ((EUID != 0)); then
            echo "e2e: npm not found; install Debian's npm (it brings Debian's nodejs), then run again:" >&2
            echo "    sudo apt-get install -y --no-install-recommends npm" >&2
            echo "e2e: (this hook then fetches $why into ${XDG_CACHE_HOME:-$HOME/.cache}/idempotency; or leave this hook out with TEST_SKIP_HOOKS)" >&2
            return 1
        fi
        e2e_debs --no-install-recommends npm || return 1
        hash -r
        command -v npm >/dev/null 2>&1 || { echo "e2e: npm installed, but not on PATH" >&2; return 1; }
    fi
    local npm_cli
    npm_cli=$(readlink -f "$(command -v npm)")
    if head -n 1 "$npm_cli" 2>/dev/null | grep -q '^#!.*node' && command -v node >/dev/null 2>&1; then
        E2E_NPM=("$(command -v node)" "$npm_cli")
    else
        E2E_NPM=("$npm_cli")
    fi
}

e2e_node_bin() {
    local dir=$1 want=${2:-} pins pin major
    pins=$(_e2e_pins "$dir") || return 1
    if [[ -z $want ]]; then
        pin=$(tail -n 1 <<<"$pins")
    else
        pin=$(grep "^$want\." <<<"$pins") ||
            { echo "e2e: $dir/node-versions pins no Node.js $want ($(paste -sd ' ' - <<<"$pins"))" >&2; return 1; }
    fi
    major=0
    command -v node >/dev/null 2>&1 && major=$(_e2e_node_major)
    if command -v npm >/dev/null 2>&1 &&
        { [[ -n $want ]] && ((major == want)) || { [[ -z $want ]] && ((major >= ${pins%%.*})); }; }; then
        E2E_NPM=(npm)
        E2E_NODE_BIN=$(dirname "$(command -v node)")
        return 0
    fi
    local why="node not found"
    ((major > 0)) && why="node $(node --version 2>/dev/null) on PATH"
    echo "e2e: $why; $dir needs Node.js ${want:-${pins%%.*} or later}: Node.js $pin from the npm registry"
    _e2e_find_npm "Node.js $pin" || return 1

    local arch
    case $(uname -m) in
        x86_64) arch=x64 ;;
        aarch64) arch=arm64 ;;
        *) echo "e2e: no node-linux-* registry package for $(uname -m); install Node.js ${pin%%.*} yourself" >&2; return 1 ;;
    esac
    local parent cache bin
    if [[ -n ${IDEMPOTENCY_NODE_CACHE:-} ]]; then
        parent=$IDEMPOTENCY_NODE_CACHE
    elif ((EUID == 0)); then
        parent=/var/cache/idempotency
    else
        parent=${XDG_CACHE_HOME:-$HOME/.cache}/idempotency
    fi
    cache=$parent/node-$pin-linux-$arch
    bin=$cache/node_modules/node-linux-$arch/bin
    if [[ $("$bin/node" --version 2>/dev/null) != "v$pin" ]]; then
        mkdir -p "$parent" || return 1
        local tmp start=$SECONDS
        tmp=$(mktemp -d "$cache.tmp.XXXXXX") || return 1
        echo "e2e: npm install --prefix $cache node-linux-$arch@$pin"
        if ! (cd "$tmp" && "${E2E_NPM[@]}" install --prefix "$tmp" --no-audit --no-fund --no-save \
                --loglevel=error "node-linux-$arch@$pin" >/dev/null) ||
            [[ $("$tmp/node_modules/node-linux-$arch/bin/node" --version 2>/dev/null) != "v$pin" ]]; then
            rm -rf "$tmp"
            echo "e2e: could not install node-linux-$arch@$pin from the npm registry" >&2
            return 1
        fi
        # another run may have put one there meanwhile: ours replaces it whole
        if ! { rm -rf "$cache" && mv "$tmp" "$cache"; }; then
            rm -rf "$tmp"
            return 1
        fi
        echo "e2e: fetched Node.js $pin in $((SECONDS - start)) s"
    fi
    E2E_NODE_BIN=$bin
    local npm_node=""
    ((${#E2E_NPM[@]} == 2)) && npm_node=" (run by ${E2E_NPM[0]} $("${E2E_NPM[0]}" --version 2>/dev/null))"
    echo "e2e: node $("$bin/node" --version) from $bin; npm $("${E2E_NPM[@]}" --version 2>/dev/null)$npm_node"
}

e2e_node() {
    e2e_node_bin "$@" || return 1
    export PATH=$E2E_NODE_BIN:$PATH
    hash -r
}

# _e2e_local_deps DIR: a hash of the files of DIR's file: dependencies
# (directories without their node_modules, or tarballs); empty if none
_e2e_local_deps() {
    (cd "$1" && node -e '
        const fs = require("fs"), path = require("path"), crypto = require("crypto");
        const pkg = JSON.parse(fs.readFileSync("package.json", "utf8"));
        const h = crypto.createHash("sha256");
        const add = (p) => {
            const st = fs.statSync(p);
            if (st.isDirectory()) {
                for (const e of fs.readdirSync(p).sort()) if (e !== "node_modules") add(path.join(p, e));
            } else { h.update(p + "\0"); h.update(fs.readFileSync(p)); }
        };
        let any = false;
        for (const [name, spec] of Object.entries({ ...pkg.dependencies, ...pkg.devDependencies })) {
            if (typeof spec === "string" && spec.startsWith("file:")) { any = true; h.update(name + "\0"); add(spec.slice(5)); }
        }
        if (any) console.log(h.digest("hex"));
    ')
}

e2e_npm() {
    local dir=$1 local_deps
    local_deps=$(_e2e_local_deps "$dir") || return 1
    if [[ $(cat "$dir/node_modules/.e2e-local-deps" 2>/dev/null) == "$local_deps" ]] &&
        (cd "$dir" && "${E2E_NPM[@]}" ls --depth=0 >/dev/null 2>&1); then
        return 0
    fi
    echo "e2e: npm ci in $dir"
    local start=$SECONDS
    (cd "$dir" && "${E2E_NPM[@]}" ci --no-audit --no-fund --loglevel=error) || return 1
    echo "$local_deps" >"$dir/node_modules/.e2e-local-deps"
    echo "e2e: npm ci took $((SECONDS - start)) s"
}
