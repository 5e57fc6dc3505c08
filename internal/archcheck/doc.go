// Package archcheck holds the tests that keep the module's shape within
// bounds: how many imports inside sandbox/ run back up (a package importing
// one of its ancestors), how many methods one type may have, how long a
// function in sandbox/ may be, and which packages may not import which
// (producer never imports worker/...).
//
// Seam: Packages asks `go list -json` for the module's packages (their
// imports and non-test Go files); the counting functions (BackImports,
// Methods, LongFuncs, Forbidden) take what they count as arguments, so
// their unit tests run them on fixtures. The bounds are a table in
// archcheck_test.go.
//
// Invariants: the package holds no code but what its tests call; every
// check names what breaks it (the import, the type and its count, the
// function and its lines), and a check over a bound fails.
package archcheck
