package job

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestValidateRejectsBadSpecs(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		spec  Spec
		field string
		want  string
	}{
		{"empty code", Spec{Code: "  \n"}, "code", "empty"},
		{"nul in code", Spec{Code: "print(1)\x00"}, "code", "NUL"},
		{"bad utf8 code", Spec{Code: "print('\xff')"}, "code", "UTF-8"},
		{"absolute file", Spec{Code: "x", Files: []File{{Name: "/etc/passwd"}}}, "files[0].name", "absolute"},
		{"dotdot file", Spec{Code: "x", Files: []File{{Name: "a/../../b"}}}, "files[0].name", ".."},
		{"dup file", Spec{Code: "x", Files: []File{{Name: "a"}, {Name: "a"}}}, "files[1].name", "twice"},
		{"bad base64", Spec{Code: "x", Files: []File{{Name: "a", Content: "!!", Encoding: "base64"}}}, "files[0].content", "base64"},
		{"reserved env", Spec{Code: "x", Env: map[string]string{"PATH": "/evil"}}, "env", "reserved"},
		{"bad env name", Spec{Code: "x", Env: map[string]string{"A=B": "1"}}, "env", "not valid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Validate()
			var ie *InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("Validate() = %v, want *InvalidError", err)
			}
			if ie.Field != tc.field || !strings.Contains(ie.Message, tc.want) {
				t.Fatalf("got field %q msg %q; want field %q containing %q", ie.Field, ie.Message, tc.field, tc.want)
			}
		})
	}
	if err := (Spec{Code: "print(1)", Files: []File{{Name: "data/in.csv", Content: "a,b"}}}).Validate(); err != nil {
		t.Fatalf("valid spec rejected: %v", err)
	}
}

func TestPolicyResolve(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	got, err := p.Resolve(Limits{MemoryMB: 512})
	if err != nil {
		t.Fatal(err)
	}
	if got.MemoryMB != 512 || got.TimeoutMS != DefaultLimits.TimeoutMS || got.Pids != 64 {
		t.Fatalf("Resolve = %+v", got)
	}
	_, err = p.Resolve(Limits{MemoryMB: 99999})
	var ie *InvalidError
	if !errors.As(err, &ie) || ie.Field != "limits.memory_mb" || !strings.Contains(ie.Message, "maximum is 4096") {
		t.Fatalf("above max: %v", err)
	}
	_, err = p.Resolve(Limits{TimeoutMS: -1})
	if !errors.As(err, &ie) || ie.Field != "limits.timeout_ms" || !strings.Contains(ie.Message, "positive") {
		t.Fatalf("negative: %v", err)
	}
	if err := (Policy{Default: Limits{TimeoutMS: 5}, Max: MaxLimits}).Validate(); err == nil {
		t.Fatal("policy with zero defaults accepted")
	}
}

func TestKeyChangesWithEveryInput(t *testing.T) {
	t.Parallel()
	base := Spec{Runtime: "python", Code: "print(1)", Stdin: "in", Args: []string{"a"},
		Env: map[string]string{"X": "1"}, Files: []File{{Name: "f", Content: "c"}}, Limits: DefaultLimits}
	k0 := Key(base, "sha256:aaa")
	if k0 != Key(base, "sha256:aaa") {
		t.Fatal("key not deterministic")
	}
	mut := []func(*Spec){
		func(s *Spec) { s.Code = "print(2)" },
		func(s *Spec) { s.Stdin = "other" },
		func(s *Spec) { s.Args = []string{"b"} },
		func(s *Spec) { s.Args = []string{"a", ""} },
		func(s *Spec) { s.Env = map[string]string{"X": "2"} },
		func(s *Spec) { s.Files = []File{{Name: "f", Content: "d"}} },
		func(s *Spec) { s.Files = []File{{Name: "g", Content: "c"}} },
		func(s *Spec) { s.Limits.MemoryMB = 128 },
		func(s *Spec) { s.Runtime = "other" },
	}
	for i, m := range mut {
		s := base
		m(&s)
		if Key(s, "sha256:aaa") == k0 {
			t.Errorf("mutation %d did not change the key", i)
		}
	}
	if Key(base, "sha256:bbb") == k0 {
		t.Error("image digest did not change the key")
	}
	// Boundaries are length-prefixed: moving bytes between fields changes the key.
	a, b := base, base
	a.Code, a.Stdin = "ab", "c"
	b.Code, b.Stdin = "a", "bc"
	if Key(a, "d") == Key(b, "d") {
		t.Error("field boundaries are ambiguous")
	}
}

func TestResultOutputStaysValidJSON(t *testing.T) {
	t.Parallel()
	var r Result
	r.SetOutput([]byte("ok\xff\xfe"), []byte("fine"))
	raw, err := json.Marshal(r)
	if err != nil || !utf8.Valid(raw) {
		t.Fatalf("marshal: %v", err)
	}
	if r.Stdout != "ok\uFFFD" || r.StdoutBase64 != "b2v//g==" || r.StderrBase64 != "" {
		t.Fatalf("got stdout %q b64 %q", r.Stdout, r.StdoutBase64)
	}
}

func TestIDs(t *testing.T) {
	t.Parallel()
	a, b := NewID(), NewID()
	if !ValidID(a) || a == b || a > b && a[:8] != b[:8] {
		t.Fatalf("ids %s %s", a, b)
	}
	for _, bad := range []string{"", "../etc", "abc", a + "/x", strings.ToUpper(a)} {
		if ValidID(bad) {
			t.Errorf("ValidID(%q) = true", bad)
		}
	}
}

func TestCollidingFileNames(t *testing.T) {
	for _, files := range [][]File{
		{{Name: "a", Content: "1"}, {Name: "a/b", Content: "2"}},
		{{Name: "a/b", Content: "2"}, {Name: "a", Content: "1"}},
		{{Name: "x/y/z", Content: "2"}, {Name: "x/y", Content: "1"}},
	} {
		err := Spec{Runtime: "python", Code: "print(1)", Files: files}.Validate()
		var ie *InvalidError
		if !errors.As(err, &ie) || !strings.HasPrefix(ie.Field, "files[") {
			t.Errorf("%v: got %v; want an invalid files[i].name", files, err)
		}
	}
	under := Spec{Runtime: "python", Code: "print(1)", Files: []File{{Name: "main.py/x", Content: "1"}}}
	var ie *InvalidError
	if err := under.ValidateFor(RuntimeContract{MainFile: "main.py"}); !errors.As(err, &ie) || ie.Field != "files[0].name" {
		t.Errorf("a file under the program's own file name: got %v; want an invalid files[0].name", err)
	}
	ok := Spec{Runtime: "python", Code: "print(1)", Files: []File{{Name: "a/b", Content: "1"}, {Name: "a/c", Content: "2"}, {Name: "ab", Content: "3"}}}
	if err := ok.Validate(); err != nil {
		t.Errorf("siblings refused: %v", err)
	}
}

func TestMinimumMemory(t *testing.T) {
	_, err := DefaultPolicy().Resolve(Limits{MemoryMB: 1})
	var ie *InvalidError
	if !errors.As(err, &ie) || ie.Field != "limits.memory_mb" {
		t.Fatalf("memory_mb 1: got %v; want invalid limits.memory_mb", err)
	}
	if _, err := DefaultPolicy().Resolve(Limits{MemoryMB: MinMemoryMB}); err != nil {
		t.Errorf("memory_mb at the minimum: %v", err)
	}
}

func TestFilesFitDisk(t *testing.T) {
	s := Spec{Runtime: "python", Code: "print(1)", Files: []File{{Name: "big", Content: strings.Repeat("x", 2<<20)}}}
	lim, _ := DefaultPolicy().Resolve(Limits{DiskMB: 1})
	var ie *InvalidError
	if err := s.FitsLimits(lim); !errors.As(err, &ie) || ie.Field != "limits.disk_mb" {
		t.Errorf("2 MB of files in a 1 MB work dir: got %v", err)
	}
	lim, _ = DefaultPolicy().Resolve(Limits{})
	if err := s.FitsLimits(lim); err != nil {
		t.Errorf("default disk: %v", err)
	}
}

func TestVerbatimInJSON(t *testing.T) {
	for s, want := range map[string]bool{
		"":                                     true,
		"01a21eb4-2649-7642-8f5a-826c9352979d": true,
		"4bf92f3577b34da6a3ce929d0e0e4736":     true,
		`a"b`:                                  false,
		`a\b`:                                  false,
		"a b":                                  false,
		"é":                                    false,
		"a\x00":                                false,
		"<tag>":                                false,
	} {
		if got := VerbatimInJSON(s); got != want {
			t.Errorf("VerbatimInJSON(%q) = %v, want %v", s, got, want)
		}
		if want {
			b, _ := json.Marshal(s)
			if string(b) != `"`+s+`"` {
				t.Errorf("%q is written %s in JSON, not as it is", s, b)
			}
		}
	}
}

// IsTenantJobSubject takes a tenant's subject of the runtime and nothing
// else: a wake-up naming any other subject has the worker ask the stream.
func TestWakeUpSubjectsAreChecked(t *testing.T) {
	t.Parallel()
	if !IsTenantJobSubject("python", TenantJobSubject("python", "alice")) {
		t.Fatal("a tenant's subject refused")
	}
	for _, s := range []string{"", JobSubject("python"), TenantJobSubject("node", "alice"),
		JobSubject("python") + ".0123456789ABCDEF", JobSubject("python") + ".0123456789abcde",
		JobSubject("python") + ".0123456789abcdef.x", JobSubject("python") + ".*"} {
		if IsTenantJobSubject("python", s) {
			t.Errorf("%q taken as a tenant subject of python", s)
		}
	}
}
