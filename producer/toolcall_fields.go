package producer

import "encoding/json"

// The field names of a tool call, for checkFieldNames: a tool call is read
// by the same scanner as a job spec, so a case variant ("Input", "CODE") or
// a repeated member is refused with the same 400 as on /v1/jobs, whichever
// shape it comes in and wherever the input sits (Anthropic's input object,
// or OpenAI's arguments string). encoding/json would match
// both case-insensitively and keep the last repeat: what runs would not be
// what a policy layer reading the documented names saw.
var (
	// toolInputSchema is tooluse.Input: a run tool's input object.
	toolInputSchema = &fieldSchema{fields: map[string]*fieldSchema{
		"code": nil, "stdin": nil, "timeout_s": nil, "files": {elem: fileSchema},
	}}
	// toolCallSchema is every envelope at once: Anthropic's tool_use block,
	// OpenAI's Chat Completions tool call and its Responses function_call.
	toolCallSchema = &fieldSchema{fields: map[string]*fieldSchema{
		"type": nil, "id": nil, "name": nil, "input": toolInputSchema,
		"function": {fields: map[string]*fieldSchema{"name": nil, "arguments": toolInputSchema}},
		"call_id":  nil, "arguments": toolInputSchema,
	}}
)

// checkToolCallNames checks a tool call's member names, and its input's,
// as checkFieldNames checks a spec's; names neither vendor documents are
// let through (the decoder answers unknown inputs as a failed tool result
// the model can act on).
func checkToolCallNames(raw []byte) *problem {
	sc := scanner{raw: raw, open: true}
	sc.value(toolCallSchema, "", 0)
	return sc.p
}

// checkToolArgumentNames checks the input object an OpenAI tool call
// carries as a JSON string (function.arguments, or a Responses
// function_call's arguments); where prefixes the field a problem names.
func checkToolArgumentNames(input json.RawMessage, where string) *problem {
	sc := scanner{raw: input, open: true, where: where}
	sc.value(toolInputSchema, "", 0)
	return sc.p
}
