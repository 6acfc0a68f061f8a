#!/bin/sh
# Debian version of a build: packaging/deb/version.sh GIT_DESCRIBE EPOCH
#
# dpkg must order builds (an upgrade installs a newer one, never an older
# one), and a commit hash does not order. So:
#   v1.2.3              -> 1.2.3
#   v1.2.3-4-gabcdef0   -> 1.2.3+4.gabcdef0        (4 commits after the tag)
#   ...-dirty           -> ....dirty
#   abcdef0 (no tag)    -> 0.0.0+git20261201.215500.abcdef0
# where the untagged form carries the commit time (EPOCH, the commit's
# seconds since 1970 in UTC) in front of the hash, so later commits sort
# later; any tagged release sorts after every untagged build.
set -eu
v=${1#v}
case "$v" in
[0-9]*.*)
	# A tag: the distance and hash after "+", dots instead of dashes.
	printf '%s\n' "$v" | sed -e 's/-/+/' -e 's/-/./g'
	;;
*)
	date=$(date -u -d "@${2:-0}" +%Y%m%d.%H%M%S)
	printf '0.0.0+git%s.%s\n' "$date" "$(printf '%s' "$v" | sed -e 's/[^A-Za-z0-9.+~]/./g')"
	;;
esac
