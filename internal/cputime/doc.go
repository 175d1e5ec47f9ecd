// Package cputime reads the process's CPU time, for benchmarks that
// report their cost per CPU second beside ns/op: on a shared machine
// other processes stretch wall time, not the CPU time a benchmark uses.
package cputime
