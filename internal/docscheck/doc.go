// Package docscheck holds the tests that keep Kiln's documentation true to
// the code: the package map in docs/architecture.md names exactly the
// module's packages, every package has a doc.go with its package comment,
// the README stays short and links every page under docs/, and every
// relative link in the README and docs/ resolves.
//
// Seam: the tests read README.md and docs/ as files and ask `go list ./...`
// for the module's packages; they start nothing and need no service.
//
// Invariants: the package holds no code but its tests, and each test can
// fail: it names the package, page or link that disagrees.
package docscheck
