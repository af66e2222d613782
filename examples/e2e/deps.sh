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
    command -v npm >/dev/null 2>&1 || { echo "e2e: npm not found (Node.js 20 with npm is needed)" >&2; return 1; }
    if (cd "$dir" && npm ls --depth=0 >/dev/null 2>&1); then
        return 0
    fi
    echo "e2e: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
}
