// Package docscheck holds the tests that keep Kiln's documentation true to
// the code: the package map in docs/architecture.md names exactly the
// module's packages, every package has a doc.go with its package comment,
// the README stays short and links every page under docs/, and every
// relative link in the README and docs/ resolves.
//
// It owns no code: the package is its tests. They read files and run
// `go list`; they start nothing and need no service.
package docscheck
