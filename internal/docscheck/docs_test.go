package docscheck

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// root is the module's root directory, relative to this package.
const root = "../.."

const modulePath = "github.com/kilnrun/kiln"

// packages lists the module's packages, relative to its root ("." for the
// root itself), as `go list ./...` sees them.
func packages(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v\n%s", err, stderr.String())
	}
	var pkgs []string
	for _, line := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(strings.TrimPrefix(line, modulePath), "/")
		if rel == "" {
			rel = "."
		}
		pkgs = append(pkgs, rel)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list ./... found only %v", pkgs)
	}
	return pkgs
}

// packageMap reads the packages named in the first column of the table
// under "## Package map" in docs/architecture.md.
func packageMap(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `([^`]+)` \\|")
	var in bool
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Package map"
			continue
		}
		if m := row.FindStringSubmatch(line); in && m != nil {
			names = append(names, strings.TrimSuffix(m[1], "/"))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal(`docs/architecture.md has no "## Package map" table`)
	}
	return names
}

// TestPackageMapMatchesGoList fails when a package of the module is missing
// from the package map, or the map names a package that does not exist.
func TestPackageMapMatchesGoList(t *testing.T) {
	have := map[string]bool{}
	for _, p := range packages(t) {
		have[p] = true
	}
	mapped := map[string]bool{}
	for _, p := range packageMap(t) {
		if mapped[p] {
			t.Errorf("the package map names %s twice", p)
		}
		mapped[p] = true
	}
	var missing, extra []string
	for p := range have {
		if !mapped[p] {
			missing = append(missing, p)
		}
	}
	for p := range mapped {
		if !have[p] {
			extra = append(extra, p)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("docs/architecture.md's package map misses packages of go list ./...: %s", strings.Join(missing, ", "))
	}
	if len(extra) > 0 {
		t.Errorf("docs/architecture.md's package map names packages go list ./... does not know: %s", strings.Join(extra, ", "))
	}
}

// TestEveryPackageHasDocGo fails when a package has no doc.go, or its doc.go
// does not hold the package comment.
func TestEveryPackageHasDocGo(t *testing.T) {
	for _, p := range packages(t) {
		b, err := os.ReadFile(filepath.Join(root, p, "doc.go"))
		if err != nil {
			t.Errorf("%s: no doc.go: %v", p, err)
			continue
		}
		s := string(b)
		if !strings.HasPrefix(s, "// Package ") && !strings.HasPrefix(s, "// Command ") {
			t.Errorf("%s/doc.go does not start with its package comment (// Package or // Command)", p)
		}
	}
}

// maxReadmeLines is the README's bound: what Kiln is, the quick start, the
// flow, and links; the rest lives under docs/.
const maxReadmeLines = 300

func TestReadmeIsShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n > maxReadmeLines {
		t.Errorf("README.md has %d lines, more than %d: move detail to a page under docs/", n, maxReadmeLines)
	}
}

// mdLink matches an inline Markdown link's target.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// docPages lists the Markdown pages under docs/, relative to the root.
func docPages(t *testing.T) []string {
	t.Helper()
	var pages []string
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			pages = append(pages, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no pages under docs/")
	}
	return pages
}

// TestReadmeLinksEveryPage fails when a page under docs/ is not linked from
// the README.
func TestReadmeLinksEveryPage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
		target, _, _ := strings.Cut(m[1], "#")
		linked[filepath.ToSlash(filepath.Clean(target))] = true
	}
	for _, p := range docPages(t) {
		if !linked[p] {
			t.Errorf("README.md does not link %s", p)
		}
	}
}

// otherPages are the repository's other Markdown files whose links are
// checked with the docs'.
var otherPages = []string{"README.md", "deploy/README.md", "sdk/python/README.md", "sdk/typescript/README.md"}

// TestRelativeLinksResolve fails when a relative link in a README or a
// page under docs/ points at a file that does not exist, or at a heading
// its page does not have.
func TestRelativeLinksResolve(t *testing.T) {
	for _, page := range append(otherPages, docPages(t)...) {
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := filepath.Join(root, filepath.Dir(page), file)
			if file == "" {
				path = filepath.Join(root, page)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links %s: %v", page, target, err)
				continue
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			if !anchors(t, path)[anchor] {
				t.Errorf("%s links %s: %s has no heading with that anchor", page, target, file)
			}
		}
	}
}

// anchors returns the GitHub-style anchors of a Markdown file's headings.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	var fence bool
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		out[slug(title)] = true
	}
	return out
}

// slug is GitHub's anchor for a heading: lower case, punctuation dropped,
// spaces as hyphens.
func slug(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
