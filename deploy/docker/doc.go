// Package docker checks the repository's docker-compose.yml; it holds tests
// only. No Docker engine runs here: the file is decoded strictly into the
// subset of the Compose specification it uses (an unknown or misspelled key
// fails).
//
// Seam: it reads ../../docker-compose.yml as a file, nothing else.
//
// Invariants it checks: healthchecks, restart policies, a stable worker id,
// authentication on, and no published port but the API's.
package docker
