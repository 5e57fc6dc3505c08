package tooluse

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kilnrun/kiln/job"
)

// Call is one tool call a model made, decoded from any format's block.
type Call struct {
	// Format is the API whose block this was; the result uses it too.
	Format Format
	// ID is the call's id (tool_use.id, tool_call.id, function_call.call_id),
	// echoed in the result.
	ID string
	// Name is the tool the model called.
	Name string
	// Input is the raw input object (Anthropic's input, OpenAI's arguments
	// decoded from their JSON string). Nil when OpenAI's arguments were not
	// valid JSON; InputErr then says why.
	Input json.RawMessage
	// InputErr is set when the arguments could not be read: a mistake of the
	// model, answered as a failed tool result rather than an HTTP error.
	InputErr error
}

// CallError is a tool-call envelope that is neither vendor's shape; Field
// names the offending member.
type CallError struct {
	Field   string
	Message string
}

func (e *CallError) Error() string { return e.Message }

const callShapes = `send an Anthropic tool_use block {"type":"tool_use","id":...,"name":...,"input":{...}}, ` +
	`an OpenAI Chat Completions tool call {"id":...,"type":"function","function":{"name":...,"arguments":"{...}"}} ` +
	`or an OpenAI Responses function_call {"type":"function_call","call_id":...,"name":...,"arguments":"{...}"}`

// DecodeCall reads a tool-use block in any format. raw must be a JSON
// object; an error is a *CallError.
func DecodeCall(raw []byte) (Call, error) {
	var env struct {
		Type      string          `json:"type"`
		ID        string          `json:"id"`
		CallID    string          `json:"call_id"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
		Arguments json.RawMessage `json:"arguments"`
		Function  *struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return Call{}, &CallError{Field: "", Message: "the body is not a tool call: " + err.Error() + "; " + callShapes}
	}
	switch env.Type {
	case "tool_use":
		c := Call{Format: Anthropic, ID: env.ID, Name: env.Name, Input: env.Input}
		if env.ID == "" {
			return Call{}, &CallError{Field: "id", Message: "the tool_use block has no id: send the block as the model returned it"}
		}
		if env.Name == "" {
			return Call{}, &CallError{Field: "name", Message: "the tool_use block has no name: send the block as the model returned it"}
		}
		if len(bytes.TrimSpace(env.Input)) == 0 || bytes.Equal(bytes.TrimSpace(env.Input), []byte("null")) {
			c.Input = json.RawMessage("{}")
		}
		return c, nil
	case "function":
		if env.Function == nil {
			return Call{}, &CallError{Field: "function", Message: "the tool call has no function member; " + callShapes}
		}
		if env.ID == "" {
			return Call{}, &CallError{Field: "id", Message: "the tool call has no id: send the tool call as the model returned it"}
		}
		if env.Function.Name == "" {
			return Call{}, &CallError{Field: "function.name", Message: "the tool call has no function.name: send the tool call as the model returned it"}
		}
		c := Call{Format: OpenAI, ID: env.ID, Name: env.Function.Name}
		c.Input, c.InputErr = openAIArguments(env.Function.Arguments, "function.arguments")
		return c, nil
	case "function_call":
		// Its id (fc_...) names the item; call_id is what the output answers.
		if env.CallID == "" {
			return Call{}, &CallError{Field: "call_id", Message: "the function_call has no call_id: send the item as the model returned it"}
		}
		if env.Name == "" {
			return Call{}, &CallError{Field: "name", Message: "the function_call has no name: send the item as the model returned it"}
		}
		c := Call{Format: OpenAIResponses, ID: env.CallID, Name: env.Name}
		c.Input, c.InputErr = openAIArguments(env.Arguments, "arguments")
		return c, nil
	case "":
		return Call{}, &CallError{Field: "type", Message: "the tool call has no type; " + callShapes}
	}
	return Call{}, &CallError{Field: "type", Message: fmt.Sprintf("type %q is not a tool call; %s", env.Type, callShapes)}
}

// openAIArguments decodes OpenAI's arguments (member names them in
// messages): a JSON string holding the input object (as the API returns
// it), or, leniently, the object itself.
func openAIArguments(raw json.RawMessage, member string) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return json.RawMessage("{}"), nil
	}
	if raw[0] == '{' {
		return raw, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, errors.New(member + " must be a JSON string holding the input object")
	}
	if strings.TrimSpace(s) == "" {
		return json.RawMessage("{}"), nil
	}
	if !json.Valid([]byte(s)) {
		return nil, errors.New("the arguments are not valid JSON: send the input object as JSON")
	}
	return json.RawMessage(s), nil
}

// Input is what a model sends to a run tool.
type Input struct {
	Code     string     `json:"code"`
	Stdin    string     `json:"stdin,omitempty"`
	Files    []job.File `json:"files,omitempty"`
	TimeoutS float64    `json:"timeout_s,omitempty"`
}

// DecodeInput reads a run tool's input object strictly: unknown members are
// refused, so a misspelt "timeout" is not silently ignored. The error is a
// *job.InvalidError naming the member.
func DecodeInput(raw json.RawMessage) (Input, error) {
	var in Input
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ):
			return Input{}, &job.InvalidError{Field: typ.Field, Message: fmt.Sprintf("%s has the wrong JSON type (%s)", typ.Field, typ.Value)}
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return Input{}, &job.InvalidError{Field: name, Message: fmt.Sprintf("unknown input %q: the inputs are code, stdin, files (name, content, encoding) and timeout_s", name)}
		}
		return Input{}, &job.InvalidError{Field: "input", Message: "the input is not a JSON object: " + err.Error()}
	}
	if strings.TrimSpace(in.Code) == "" {
		return Input{}, &job.InvalidError{Field: "code", Message: "code is empty: send the program to run in \"code\""}
	}
	if in.TimeoutS < 0 || math.IsNaN(in.TimeoutS) || math.IsInf(in.TimeoutS, 0) {
		return Input{}, &job.InvalidError{Field: "timeout_s", Message: "timeout_s must be a positive number of seconds"}
	}
	return in, nil
}

// Spec is the job the input asks for on runtime.
func (in Input) Spec(runtime string) job.Spec {
	s := job.Spec{Runtime: runtime, Code: in.Code, Stdin: in.Stdin, Files: in.Files}
	if in.TimeoutS > 0 {
		s.Limits.TimeoutMS = int64(math.Ceil(in.TimeoutS * 1000))
	}
	return s
}
