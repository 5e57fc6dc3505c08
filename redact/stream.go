package redact

import "bytes"

// Stream bounds.
const (
	// HoldBytes is the tail of live output a Stream holds back: enough for
	// any built-in key to be recognised whole once its next bytes arrive.
	HoldBytes = 512
	// MaxHeldBytes bounds what a Stream holds while a match is still
	// growing (a PEM block without its END line yet): past it, the held
	// bytes are released redacted as they stand.
	MaxHeldBytes = 64 << 10
)

// Stream redacts one output stream as it is written: Write returns the
// bytes that are safe to send now, holding back the tail that may be the
// start of a key; Idle releases held complete lines; Flush releases the
// rest at the end. Not safe for concurrent use.
type Stream struct {
	d      *Detector
	hold   int
	carry  []byte
	prev   byte
	counts Counts
}

// Stream returns a new stream redactor.
func (d *Detector) Stream() *Stream {
	hold := HoldBytes
	if d != nil {
		hold = max(hold, d.maxSecret())
	}
	return &Stream{d: d, hold: hold, counts: Counts{}}
}

// Counts is what the stream replaced so far.
func (s *Stream) Counts() Counts { return s.counts }

// Write takes the next bytes of output and returns those ready to send.
func (s *Stream) Write(p []byte) []byte {
	if s.d.Off() {
		return p
	}
	s.carry = append(s.carry, p...)
	return s.emit(len(s.carry)-s.hold, false)
}

// Idle releases the held bytes up to the last complete line, when no more
// output came for a while: a program waiting for input shows its prompt's
// lines. A key still growing at the end stays held.
func (s *Stream) Idle() []byte {
	k := bytes.LastIndexByte(s.carry, '\n')
	if k < 0 {
		return nil
	}
	return s.emit(k+1, false)
}

// Flush releases everything held: the output has ended.
func (s *Stream) Flush() []byte {
	return s.emit(len(s.carry), true)
}

// emit releases carry[:limit], moved back to the start of any match that
// crosses it or may still grow, and redacted.
func (s *Stream) emit(limit int, final bool) []byte {
	if limit <= 0 && !final && len(s.carry) <= MaxHeldBytes {
		return nil
	}
	spans := s.d.find(s.carry, s.prev)
	if !final && len(s.carry) <= MaxHeldBytes {
		for _, sp := range spans {
			if sp.end == len(s.carry) || (sp.anchor < limit && sp.end > limit) {
				limit = min(limit, sp.anchor)
				break
			}
		}
	} else {
		limit = len(s.carry)
	}
	if limit <= 0 {
		return nil
	}
	var in []span
	for _, sp := range spans {
		if sp.end <= limit {
			in = append(in, sp)
		}
	}
	var out []byte
	if len(in) == 0 {
		out = bytes.Clone(s.carry[:limit])
	} else {
		out = replace(nil, s.carry[:limit], in, s.counts)
	}
	s.prev = s.carry[limit-1]
	s.carry = append(s.carry[:0], s.carry[limit:]...)
	return out
}
