package workspace

import (
	"strings"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

const (
	maxPathBytes = 4096 // longest accepted relative path
	maxNameBytes = 255  // longest accepted path component (NAME_MAX)
)

// capsuleNameOK reports whether p is acceptable as a capsule entry path: relative, slash-separated,
// valid UTF-8, no empty, "." or ".." component, no NUL, backslash or control character, and within
// the length limits. It is also the portability rule for copies and packs.
func capsuleNameOK(p string) bool {
	if p == "" || len(p) > maxPathBytes || !utf8.ValidString(p) || p[0] == '/' {
		return false
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f || r == '\\' || (r >= 0x80 && r <= 0x9f) {
			return false
		}
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." || len(c) > maxNameBytes {
			return false
		}
	}
	return true
}

// componentNameOK is capsuleNameOK for one path component.
func componentNameOK(c string) bool { return !strings.Contains(c, "/") && capsuleNameOK(c) }

// foldKey maps names that a case-insensitive or normalizing file system would treat as the same file
// to the same key: Unicode NFC, then full case folding.
func foldKey(p string) string { return cases.Fold().String(norm.NFC.String(p)) }
