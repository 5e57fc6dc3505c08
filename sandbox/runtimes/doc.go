// Package runtimes is the language runtimes as data: a runtime's profile
// (the recipe's runtime.json, carried in its image as the LabelProfile
// label) and its image's package list (LabelPackages).
//
// Parse reads and checks a profile; a Profile gives the launcher's command
// line for a job's memory limit (LaunchArgs, "{heap_mb}" in an interpreter
// flag), whether that line depends on the limit (HeapFlagged), and the
// job.RuntimeContract clients and the API are told (Contract, with the
// image's Packages).
//
// Seam: package sandbox reads the labels from an image's config and calls
// Parse with the Rules it fixes for every runtime (every sandbox's
// environment, the isolations it can run); nothing here touches containerd,
// the host or a job, so every rule is tested on strings, the recipes'
// runtime.json files among them.
//
// Invariants: a profile that Parse accepts names a classifier package
// outcome has, main and reserved files that are valid job file names, and
// no variable of every sandbox's environment; an unknown field refuses the
// profile rather than being ignored. A job cannot choose or change any of
// it: the profile is the image's, read from the digest the job runs.
package runtimes
