// Package bench holds the smoke test of the benchmark programs below it
// (nbd-compare, iscsi-compare, repl-compare, gather-load): each runs once
// in a tiny configuration so that a program broken by a change elsewhere
// (a renamed field, a changed command) fails `make test` instead of
// rotting until someone measures. The figures are not checked.
package bench
