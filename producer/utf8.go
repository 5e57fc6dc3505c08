package producer

import (
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/kilnrun/kiln/job"
)

// validText reports whether the raw content of a JSON string (between its
// quotes, escapes not yet decoded) is text: valid UTF-8, and no \u escape
// naming half of a surrogate pair alone. encoding/json would otherwise
// replace either with U+FFFD, so the code that ran would not be the code
// that was sent.
func validText(raw []byte) bool {
	if !utf8.Valid(raw) {
		return false
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if i >= len(raw) || raw[i] != 'u' {
			continue
		}
		r, ok := hex4(raw, i+1)
		if !ok {
			return true // a syntax error: the decoder reports it with its offset
		}
		i += 4
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return false // a low surrogate with no high one before it
		case r >= 0xD800 && r <= 0xDBFF:
			if i+2 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' {
				return false
			}
			lo, ok := hex4(raw, i+3)
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return false
			}
			i += 6
		}
	}
	return true
}

// hex4 reads the four hex digits at raw[at:].
func hex4(raw []byte, at int) (rune, bool) {
	if at+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// invalidText is the 400 for a string that is not text; what says whether
// it was a value or a field name (then path is the object holding it).
func (s *scanner) invalidText(path, what string) *problem {
	field := s.where + path
	if field == "" {
		field = "(body)"
	}
	p := newProblem(http.StatusBadRequest, job.ProblemMalformedJSON, "Invalid UTF-8",
		fmt.Sprintf("%s%q holds a string that is not valid UTF-8 (or a lone \\u surrogate escape); JSON text must be UTF-8, and it would not be run as sent: encode binary content as base64 (files[].encoding)", what, field))
	p.Field = field
	return p
}
