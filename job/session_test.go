package job

import "testing"

// A session's env is under a call's own and a command's own; a file
// operation, a wait and a kill get none.
func TestSessionCallUnderEnv(t *testing.T) {
	env := map[string]string{"A": "session", "B": "session"}
	c := SessionCall{Code: "1", Env: map[string]string{"B": "call"}}.UnderEnv(env)
	if c.Env["A"] != "session" || c.Env["B"] != "call" || len(c.Env) != 2 {
		t.Errorf("a call's env: %v", c.Env)
	}
	cmd := SessionCall{Command: &SessionCommand{Cmd: "env", Env: map[string]string{"A": "command"}}}
	c = cmd.UnderEnv(env)
	if c.Command.Env["A"] != "command" || c.Command.Env["B"] != "session" || len(cmd.Command.Env) != 1 {
		t.Errorf("a command's env: %v (the caller's: %v)", c.Command.Env, cmd.Command.Env)
	}
	for _, c := range []SessionCall{{File: &SessionFileOp{}}, {Command: &SessionCommand{Op: CommandWait, ID: "x"}}} {
		if got := c.UnderEnv(env); got.Env != nil || (got.Command != nil && got.Command.Env != nil) {
			t.Errorf("%+v got env", got)
		}
	}
	if c := (SessionCall{Code: "1"}).UnderEnv(nil); c.Env != nil {
		t.Errorf("no session env: %v", c.Env)
	}
	if err := (SessionSpec{IdleTimeoutS: 1, MaxLifetimeS: 1, Restore: RestoreFiles, Env: map[string]string{"PATH": "x"}}).Validate(); err == nil {
		t.Error("a session env setting PATH is valid")
	}
}
