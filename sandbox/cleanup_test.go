package sandbox

import (
	"context"
	"slices"
	"testing"
)

// The undo stack runs what was pushed once, last pushed first, and its
// steps see what the steps before them reported.
func TestUndoStackRunsOnceLastFirst(t *testing.T) {
	t.Parallel()
	var u undoStack
	var order []string
	step := func(name string) func(context.Context, *teardown) {
		return func(_ context.Context, td *teardown) {
			order = append(order, name)
			if name == "task" {
				td.gone = false
			}
			if name == "uid" && td.gone {
				t.Error("the uid step ran before the task step reported processes left")
			}
		}
	}
	for _, name := range []string{"track", "uid", "workdir", "container", "task"} {
		u.push(step(name))
	}
	td := u.run(t.Context())
	if want := []string{"task", "container", "workdir", "uid", "track"}; !slices.Equal(order, want) {
		t.Fatalf("ran %v; want %v", order, want)
	}
	if td.gone || !td.removed {
		t.Fatalf("teardown %+v; want gone false (the task step said so), removed true", td)
	}
	if td := u.run(t.Context()); len(order) != 5 || !td.gone {
		t.Fatalf("a second run ran steps again (%v) or carried the first's state (%+v)", order, td)
	}
}
