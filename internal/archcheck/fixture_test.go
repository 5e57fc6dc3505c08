package archcheck

import (
	"fmt"
	"strings"
	"testing"
)

// The checks catch what they bound: run on fixtures, each finds the
// violation planted in it and nothing else.

func TestBackImportsFindsAnImportOfAnAncestor(t *testing.T) {
	pkgs := []Package{
		{ImportPath: "m/sandbox", Imports: []string{"m/sandbox/box", "m/job"}},
		{ImportPath: "m/sandbox/box", Imports: []string{"m/sandbox/containerd", "m/job"}},
		{ImportPath: "m/sandbox/box/inner", Imports: []string{"m/sandbox"}},
		{ImportPath: "m/sandboxer", Imports: []string{"m/sandbox"}},
		{ImportPath: "m/worker", Imports: []string{"m/sandbox"}},
	}
	got := BackImports(pkgs, "m/sandbox")
	if len(got) != 1 || got[0] != (Arrow{"m/sandbox/box/inner", "m/sandbox"}) {
		t.Fatalf("BackImports = %v, want only m/sandbox/box/inner -> m/sandbox", got)
	}
}

func TestForbiddenFindsAnImportAcrossTrees(t *testing.T) {
	pkgs := []Package{
		{ImportPath: "m/producer", Imports: []string{"m/job", "m/worker/egress"}},
		{ImportPath: "m/producer/client", Imports: []string{"m/job"}},
		{ImportPath: "m/workers", Imports: []string{"m/worker"}},
		{ImportPath: "m/cmd/kiln", Imports: []string{"m/worker", "m/producer"}},
	}
	got := Forbidden(pkgs, "m/producer", "m/worker")
	if len(got) != 1 || got[0] != (Arrow{"m/producer", "m/worker/egress"}) {
		t.Fatalf("Forbidden = %v, want only m/producer -> m/worker/egress", got)
	}
}

func TestMethodsCountsEveryReceiverShape(t *testing.T) {
	var b strings.Builder
	b.WriteString("package p\ntype Hub struct{}\ntype G[T any] struct{}\n")
	for i := range 31 {
		fmt.Fprintf(&b, "func (h *Hub) m%d() {}\n", i)
	}
	b.WriteString("func (Hub) v() {}\nfunc (g *G[T]) a() {}\nfunc free() {}\n")
	counts, err := Methods(map[string][]Source{"m/p": {{Name: "p.go", Text: []byte(b.String())}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []Count{{"m/p.Hub", 32}, {"m/p.G", 1}}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Fatalf("Methods = %v, want %v", counts, want)
	}
	if msg := overBound(counts, 30); !strings.Contains(msg, "m/p.Hub has 32 methods") || strings.Contains(msg, "m/p.G") {
		t.Fatalf("overBound = %q, want only m/p.Hub over 30", msg)
	}
	if msg := overBound(counts, 32); msg != "" {
		t.Fatalf("overBound at 32 = %q, want nothing", msg)
	}
}

func TestLongFuncsFindsAFunctionOverTheBound(t *testing.T) {
	var b strings.Builder
	b.WriteString("package p\ntype T struct{}\nfunc (t *T) long() {\n")
	for range 80 {
		b.WriteString("\t_ = 1\n")
	}
	b.WriteString("}\nfunc short() {\n\t_ = 1\n}\n")
	got, err := LongFuncs(map[string][]Source{"m/p": {{Name: "p.go", Text: []byte(b.String())}}}, 80)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != (Count{"p.go:T.long", 82}) {
		t.Fatalf("LongFuncs = %v, want p.go:T.long at 82 lines", got)
	}
}
