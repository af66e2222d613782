# shellcheck shell=bash
# scripts/build.sh: build and install a PGXS extension; sourced by
# scripts/test and scripts/matrix (after scripts/cluster.sh, for PG_CONFIG).
#
#   build_extension DIR      make, with warnings as errors
#   build_runner DIR         make -C DIR/matrix (the replay matrix runner, its
#                            own PGXS program), with the same variables
#   install_extension DIR    make install (root); non-root: see below
#   make_var DIR NAME        print a variable of DIR's Makefile (e.g. REGRESS)
#
# Settings (environment):
#   PG_CFLAGS  extra compiler flags, default "-Wall -Wextra -Werror" and,
#              when the compiler knows it, "-Wshadow=compatible-local"
#   WITH_LLVM  default "no": no LLVM bitcode is built or installed (it would
#              need clang and only serves JIT inlining of the module's
#              functions). Any stale bitcode of the module from an earlier
#              with_llvm=yes install is removed, so JIT cannot inline old code.

# shellcheck source=scripts/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
versions_resolve
# PostgreSQL 16 and later build with -Wshadow=compatible-local, 15 does not:
# asked here too (when the compiler knows it), so the host's build fails
# where the newer servers' would
if [[ -z ${PG_CFLAGS+set} ]]; then
    PG_CFLAGS="-Wall -Wextra -Werror"
    cc=$("$PG_CONFIG" --cc 2>/dev/null) && [[ -n $cc ]] &&
        $cc -Werror -Wshadow=compatible-local -fsyntax-only -x c /dev/null 2>/dev/null &&
        PG_CFLAGS+=" -Wshadow=compatible-local"
    unset cc
fi
: "${WITH_LLVM:=no}"

# the same variables for every make call, so no call rebuilds with other flags
build_make_vars() {
    BUILD_MAKE_VARS=(PG_CONFIG="$PG_CONFIG" with_llvm="$WITH_LLVM" PG_CFLAGS="$PG_CFLAGS")
}

make_var() {
    local dir=$1 name=$2
    build_make_vars
    # shellcheck disable=SC2016 # $($*) is for make, not the shell
    make -s --no-print-directory -C "$dir" "${BUILD_MAKE_VARS[@]}" \
        --eval 'print-makevar-%: ; @echo $($*)' "print-makevar-$name"
}

build_extension() {
    local dir=$1
    build_make_vars
    echo "build: make -C $dir with_llvm=$WITH_LLVM PG_CFLAGS=\"$PG_CFLAGS\""
    if ! make --no-print-directory -C "$dir" -j"$(nproc)" "${BUILD_MAKE_VARS[@]}"; then
        echo "build: error: the build failed (compiler output above)" >&2
        exit 1
    fi
}

build_runner() {
    local dir=$1
    build_make_vars
    echo "build: make -C $dir/matrix PG_CFLAGS=\"$PG_CFLAGS\""
    if ! make --no-print-directory -C "$dir/matrix" -j"$(nproc)" "${BUILD_MAKE_VARS[@]}"; then
        echo "build: error: building the replay matrix runner failed (output above)" >&2
        exit 1
    fi
}

# the files `make install` puts in place: modules, control file, DATA
_installed_pairs() {
    local dir=$1 pkglibdir sharedir f ext
    pkglibdir=$("$PG_CONFIG" --pkglibdir)
    sharedir=$("$PG_CONFIG" --sharedir)
    for f in $(make_var "$dir" MODULE_big) $(make_var "$dir" MODULES); do
        echo "$dir/$f.so $pkglibdir/$f.so"
    done
    for ext in $(make_var "$dir" EXTENSION); do
        echo "$dir/$ext.control $sharedir/extension/$ext.control"
    done
    for f in $(make_var "$dir" DATA); do
        echo "$dir/$f $sharedir/extension/$(basename "$f")"
    done
}

install_extension() {
    local dir=$1
    build_make_vars
    local pkglibdir sharedir
    pkglibdir=$("$PG_CONFIG" --pkglibdir)
    sharedir=$("$PG_CONFIG" --sharedir)

    if ((EUID != 0)) && ! { [[ -w $pkglibdir && -w $sharedir/extension ]]; }; then
        # Not root: fine if what is installed is exactly what was just built.
        local src dst stale=()
        while read -r src dst; do
            cmp -s "$src" "$dst" || stale+=("$dst")
        done < <(_installed_pairs "$dir")
        if ((${#stale[@]} == 0)); then
            echo "install: not root, but the installed files match this build; going on"
            return 0
        fi
        echo "install: error: 'make install' writes to $pkglibdir and $sharedir/extension," >&2
        echo "install: which needs root. Out of date: ${stale[*]}" >&2
        echo "install: run this, then run the command again:" >&2
        echo "    sudo make -C $dir install PG_CONFIG=$PG_CONFIG with_llvm=$WITH_LLVM" >&2
        exit 1
    fi

    echo "install: make -C $dir install with_llvm=$WITH_LLVM"
    if ! make --no-print-directory -C "$dir" "${BUILD_MAKE_VARS[@]}" install; then
        echo "install: error: make install failed (output above)" >&2
        exit 1
    fi
    if [[ $WITH_LLVM == no ]]; then
        local m
        for m in $(make_var "$dir" MODULE_big) $(make_var "$dir" MODULES); do
            if [[ -e $pkglibdir/bitcode/$m || -e $pkglibdir/bitcode/$m.index.bc ]]; then
                echo "install: removing stale LLVM bitcode of $m from $pkglibdir/bitcode"
                rm -rf "${pkglibdir:?}/bitcode/$m" "${pkglibdir:?}/bitcode/$m.index.bc"
            fi
        done
    fi
}
