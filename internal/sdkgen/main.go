package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

func main() {
	root := flag.String("root", ".", "the repository's root")
	flag.Parse()
	if err := run(*root); err != nil {
		fmt.Fprintln(os.Stderr, "sdkgen:", err)
		os.Exit(1)
	}
}

// run writes every generated file under root.
func run(root string) error {
	raw, err := os.ReadFile(filepath.Join(root, documentFile))
	if err != nil {
		return err
	}
	files, err := generate(raw)
	if err != nil {
		return err
	}
	ts, err := typeScript(root)
	if err != nil {
		return err
	}
	files[openAPITypes] = ts
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(root, n), files[n], 0o644); err != nil {
			return err
		}
		fmt.Println("sdkgen: wrote", n)
	}
	return nil
}
