package job

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateForRuntimeContract(t *testing.T) {
	t.Parallel()
	py := RuntimeContract{MainFile: "main.py", ReservedEnv: []string{"PYTHONHASHSEED"}}
	node := RuntimeContract{MainFile: "main.js", ReservedFiles: []string{"main.mjs"}, ReservedEnv: []string{"NODE_OPTIONS"}}
	cases := []struct {
		name  string
		spec  Spec
		c     RuntimeContract
		field string
		want  string
	}{
		{"python main file", Spec{Runtime: "python", Code: "x", Files: []File{{Name: "main.py"}}}, py, "files[0].name", "reserved for the program itself in runtime python"},
		{"node main file", Spec{Runtime: "node", Code: "x", Files: []File{{Name: "a"}, {Name: "main.js"}}}, node, "files[1].name", "reserved"},
		{"node esm main file", Spec{Runtime: "node", Code: "x", Files: []File{{Name: "main.mjs"}}}, node, "files[0].name", "reserved"},
		{"python env", Spec{Runtime: "python", Code: "x", Env: map[string]string{"PYTHONHASHSEED": "1"}}, py, "env", "PYTHONHASHSEED is set by the python runtime's sandbox"},
		{"node env", Spec{Runtime: "node", Code: "x", Env: map[string]string{"NODE_OPTIONS": "--x"}}, node, "env", "NODE_OPTIONS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.ValidateFor(tc.c)
			var ie *InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("ValidateFor() = %v, want *InvalidError", err)
			}
			if ie.Field != tc.field || !strings.Contains(ie.Message, tc.want) {
				t.Fatalf("got field %q msg %q; want field %q containing %q", ie.Field, ie.Message, tc.field, tc.want)
			}
		})
	}
	// What one runtime reserves, another allows.
	ok := Spec{Runtime: "node", Code: "x", Files: []File{{Name: "main.py"}}, Env: map[string]string{"PYTHONHASHSEED": "1"}}
	if err := ok.ValidateFor(node); err != nil {
		t.Fatalf("node spec with python's names rejected: %v", err)
	}
}

func TestRuntimeContractProvides(t *testing.T) {
	t.Parallel()
	c := RuntimeContract{Packages: []Package{{Name: "scikit-learn", Version: "1.2.1", Modules: []string{"sklearn"}}}}
	if !c.Provides("sklearn") || c.Provides("scikit-learn") || c.Provides("numpy") {
		t.Fatalf("Provides is wrong for %+v", c)
	}
}
