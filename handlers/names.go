package handlers

import (
	"strings"
	"unicode/utf8"
)

// Names and titles (company, project, task title, environment, agent, project workspace, …) are
// shown in pages, terminals, logs and audit trails, so they must be plain text on one line: no C0
// or C1 control (ESC and BEL included, which a terminal would act on) and none of the bidi
// formatting characters that make text read differently from what it says (U+200E/F,
// U+202A–U+202E, U+2066–U+2069). Descriptions may also hold newlines and tabs.

// textProblem says what is wrong with a name or title, or "": the one check every name uses.
// Emptiness and length stay with each resource, whose limits differ.
func textProblem(s string) string {
	if !utf8.ValidString(s) {
		return "must be valid UTF-8 text"
	}
	if strings.ContainsFunc(s, refusedInName) {
		return "must not contain control or text-direction characters"
	}
	return ""
}

// descriptionProblem is textProblem for multi-line text: newlines and tabs are allowed.
func descriptionProblem(s string) string {
	if !utf8.ValidString(s) {
		return "must be valid UTF-8 text"
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r != '\n' && r != '\t' && r != '\r' && refusedInName(r) }) {
		return "must not contain control or text-direction characters other than newlines and tabs"
	}
	return ""
}

// refusedInName reports the characters no name may hold: C0 controls, DEL, C1 controls and the
// bidi embedding, override, isolate and mark characters.
func refusedInName(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}
