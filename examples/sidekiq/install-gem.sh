#!/usr/bin/env bash
# examples/sidekiq/install-gem.sh [DIR]: build the gem pg-idempotency from
# helpers/ruby of this checkout (or release tarball) and install it into DIR
# (default: examples/sidekiq/gems), as a user's app installs a gem that is
# not on RubyGems.org:
#
#   gem build pg-idempotency.gemspec
#   gem install --local --ignore-dependencies -i DIR pg-idempotency-0.3.0.gem
#
# The example's processes run with GEM_HOME=DIR (e2e.py sets it; by hand:
# GEM_HOME=examples/sidekiq/gems sidekiq -r ./worker.rb), which keeps the
# default gem paths where Debian's ruby-pg and ruby-sidekiq are, and
# worker.rb requires "pg_idempotency/sidekiq". --ignore-dependencies: pg
# comes from Debian's ruby-pg; nothing is fetched. Run it again after a
# change in helpers/ruby (the same version is installed over the old one).
# Needs Debian's ruby (gem).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../../helpers/ruby" && pwd)
dest=${1:-$here/gems}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
version=$(ruby -e 'print Gem::Specification.load(ARGV[0]).version' "$src/pg-idempotency.gemspec")
gemfile=pg-idempotency-$version.gem
# built into a temp dir: the checkout is left as it was
(cd "$src" && gem build --silent pg-idempotency.gemspec --output "$tmp/$gemfile")
# files an older build had and this one has not must not stay behind
rm -rf "$dest/gems/pg-idempotency-$version" "$dest/specifications/pg-idempotency-$version.gemspec"
gem install --silent --local --ignore-dependencies --no-document -i "$dest" "$tmp/$gemfile"
echo "pg-idempotency $version installed in $dest (GEM_HOME)"
