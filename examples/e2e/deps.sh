# shellcheck shell=bash
# examples/e2e/deps.sh: sourced by scripts/test.d/8*.sh, the hooks that run
# the queue examples' end-to-end tests.
#
#   e2e_debs PKG...   install the Debian packages that are missing (as root;
#                     otherwise print the sudo apt-get line and fail)
#   e2e_npm DIR       npm ci in DIR unless its node_modules already match

e2e_debs() {
    local pkg status missing=()
    for pkg in "$@"; do
        status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
        [[ $status == ii* ]] || missing+=("$pkg")
    done
    ((${#missing[@]})) || return 0
    if ((EUID != 0)); then
        echo "e2e: missing Debian packages; install them with:" >&2
        echo "    sudo apt-get install -y ${missing[*]}" >&2
        return 1
    fi
    echo "e2e: apt-get install -y ${missing[*]}"
    local opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
    DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y -q "${missing[@]}" >/dev/null ||
        { DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" update -qq &&
          DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y -q "${missing[@]}" >/dev/null; }
}

e2e_npm() {
    local dir=$1
    local need="the SQS example needs Node.js 20 or later with npm (fauxqs 1.9 and sqs-consumer 14"
    need+=" require it; Debian 12's own nodejs package is 18): install Node.js 20 and its npm"
    need+=" (e.g. a nodejs 20 .deb) and run again, or leave this example out:"
    need+=" TEST_SKIP_HOOKS=80-sqs scripts/test"
    command -v node >/dev/null 2>&1 || { echo "e2e: node not found: $need" >&2; return 1; }
    local major
    major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
    ((major >= 20)) || { echo "e2e: node $(node --version 2>/dev/null) is too old: $need" >&2; return 1; }
    command -v npm >/dev/null 2>&1 || { echo "e2e: npm not found: $need" >&2; return 1; }
    if (cd "$dir" && npm ls --depth=0 >/dev/null 2>&1); then
        return 0
    fi
    echo "e2e: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
}
