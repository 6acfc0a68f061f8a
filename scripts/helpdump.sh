#!/bin/sh
# helpdump.sh VMSAN: print `VMSAN CMD... --help` for every command of the
# tree (found from each help's "Available Commands:" list), each preceded
# by a "== CMD" line. Diff two dumps to check that a restructuring of the
# command tree left every help text as it was:
#
#	scripts/helpdump.sh ./old-vmsan >old.txt
#	scripts/helpdump.sh bin/vmsan >new.txt && diff old.txt new.txt
set -eu
bin=$1
walk() {
	echo "== vmsan $*"
	# shellcheck disable=SC2068
	"$bin" $@ --help 2>&1
	# shellcheck disable=SC2068
	"$bin" $@ --help 2>&1 | awk '/^Available Commands:/{on=1;next} on&&/^$/{on=0} on{print $1}' |
		while read -r sub; do
			walk $@ "$sub"
		done
}
walk
# Hidden commands are in no list; the completion scripts name every
# command and flag.
echo "== vmsan gen-man"
"$bin" gen-man --help 2>&1
for sh in bash zsh fish; do
	echo "== vmsan completion $sh (script)"
	"$bin" completion "$sh" 2>&1
done
echo "== vmsan --version"
"$bin" --version 2>&1
