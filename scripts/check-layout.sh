#!/usr/bin/env bash
# scripts/check-layout.sh DIR [OBJECT...]: no two files of DIR (its built
# objects: the OBJECTs named, file names in DIR, else *.o, which may hold a
# stale object of a source that is gone)
# call each other, not even through others (make check-layout for src/,
# make -C matrix check-layout for the runner).
#
# From the built objects: an edge A -> B for every symbol A uses that B
# defines (nm). tsort(1) orders the files and fails on a loop; the order it
# prints (each file before the ones it uses) is shown.
set -euo pipefail
dir=${1:?usage: check-layout.sh DIR [OBJECT...]}
shift
cd "$dir"
if (($#)); then objs=("$@"); else objs=(*.o); fi
[[ -e ${objs[0]} ]] || { echo "check-layout: no objects in $dir: build first" >&2; exit 2; }
declare -A owner
for o in "${objs[@]}"; do
    while read -r _ sym; do owner[$sym]=${o%.o}; done < <(nm --defined-only -g "$o" | awk '$2 ~ /^[TDBR]$/ {print $2, $3}')
done
edges=$(for o in "${objs[@]}"; do
    f=${o%.o}
    echo "$f $f"
    nm --undefined-only "$o" | awk '{print $2}' | while read -r sym; do
        if [[ -n ${owner[$sym]:-} && ${owner[$sym]} != "$f" ]]; then echo "$f ${owner[$sym]}"; fi
    done
done | sort -u)
if ! order=$(tsort <<<"$edges" 2>&1); then
    echo "check-layout: the files of $dir call each other in a loop:" >&2
    echo "$order" | grep -i 'loop\|^tsort' >&2
    exit 1
fi
echo "check-layout: $dir: no loop; each file uses only files after it: $(echo $order)"
