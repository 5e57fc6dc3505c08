package worker

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// A command's code calls the launcher's module with its parameters as one
// ASCII string literal; a background command's id is its call's seq.
func TestCommandCode(t *testing.T) {
	code, err := commandCode(7, &job.SessionCommand{Cmd: "echo 'é' \"$X\"\n", Background: true, Env: map[string]string{"X": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	const pre, post = `__import__("sys").modules["_kiln_commands"].call(`, `);`
	if !strings.HasPrefix(code, pre) || !strings.HasSuffix(code, post) || strings.ContainsAny(code, "\né") {
		t.Fatalf("code %s", code)
	}
	// An ASCII literal whose escapes (\" \\ \n \u00e9) read the same in Python.
	lit, err := strconv.Unquote(code[len(pre) : len(code)-len(post)])
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(lit), &p); err != nil {
		t.Fatalf("%s: %v", lit, err)
	}
	if p["id"] != "7" || p["background"] != true || p["cmd"] != "echo 'é' \"$X\"\n" {
		t.Fatalf("parameters %v", p)
	}
}

// The command's state is taken out of the call's outputs; a call that ended
// without one says what its result says.
func TestCommandState(t *testing.T) {
	res := job.Result{ExitCode: job.IntPtr(3), Outputs: []job.Output{
		{Type: "display_data", Data: map[string]json.RawMessage{"text/plain": json.RawMessage(`"kept"`)}},
		{Type: "display_data", Data: map[string]json.RawMessage{commandMIME: json.RawMessage(`{"id":"4","background":true,"running":false,"exit_code":9}`)}},
	}}
	st, _ := commandState(&job.SessionCommand{Op: job.CommandWait, ID: "4"}, &res)
	if st.ID != "4" || st.Running || st.ExitCode == nil || *st.ExitCode != 9 || len(res.Outputs) != 1 {
		t.Fatalf("state %+v, outputs %v", st, res.Outputs)
	}
	res = job.Result{Status: job.StatusTimedOut, ExitCode: job.IntPtr(130)}
	st, _ = commandState(&job.SessionCommand{Cmd: "sleep 30"}, &res)
	if st.Running || st.ExitCode == nil || *st.ExitCode != 130 {
		t.Fatalf("a foreground command without its state: %+v", st)
	}
	// A list: every command, none of them the call's own.
	res = job.Result{Outputs: []job.Output{{Type: "display_data", Data: map[string]json.RawMessage{commandMIME: json.RawMessage(
		`{"commands":[{"id":"2","background":true,"running":true,"cmd":"sleep 9","stdin":true},{"id":"5","background":true,"running":false,"exit_code":0,"cmd":"true"}]}`)}}}}
	st, all := commandState(&job.SessionCommand{Op: job.CommandList}, &res)
	if st != nil || len(all) != 2 || all[0].Cmd != "sleep 9" || !all[0].Stdin || all[1].Running || len(res.Outputs) != 0 {
		t.Fatalf("a list: state %+v, commands %+v, outputs %v", st, all, res.Outputs)
	}
	res = job.Result{Outputs: []job.Output{{Type: "display_data", Data: map[string]json.RawMessage{commandMIME: json.RawMessage(`{"commands":[]}`)}}}}
	if _, all = commandState(&job.SessionCommand{Op: job.CommandList}, &res); all == nil || len(all) != 0 {
		t.Fatalf("an empty list: %#v", all)
	}
}

// A node session's relay recognises a command's call by its start
// (relay.py COMMAND_CALL): the code commandCode makes starts so.
func TestCommandCodeStartsAsTheRelayExpects(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "deploy", "images", "python", "relay.py"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^COMMAND_CALL = '([^']+)'$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("relay.py has no COMMAND_CALL")
	}
	code, err := commandCode(3, &job.SessionCommand{Op: job.CommandRun, Cmd: "ls"})
	if err != nil || !strings.HasPrefix(code, string(m[1])) {
		t.Fatalf("commandCode %q (%v) does not start with relay.py's %q", code, err, m[1])
	}
}
