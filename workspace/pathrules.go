package workspace

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// parseRequest applies the input rules for a requested file-resource path and returns its components
// (empty and "." components dropped, ".." kept for the resolver) and whether it ended in a slash.
// Every refusal is ErrBadPath. The path is taken literally: it is never percent-decoded (the HTTP
// layer decodes exactly once) and never Unicode-normalized, so an encoded or look-alike traversal is
// either refused here or names a file that is literally called that.
func parseRequest(p string, fileRequired bool) ([]string, bool, error) {
	bad := func(why string) ([]string, bool, error) {
		return nil, false, fmt.Errorf("%s: %w", why, ErrBadPath)
	}
	switch {
	case len(p) > maxPathBytes:
		return bad("path longer than 4096 bytes")
	case p == "" && fileRequired:
		return bad("empty path")
	case p == "":
		return nil, false, nil
	case !utf8.ValidString(p):
		return bad("path is not valid UTF-8")
	case strings.ContainsFunc(p, isControl):
		return bad("control character in path")
	case strings.ContainsRune(p, '\\'):
		return bad("backslash in path")
	case p[0] == '/':
		return bad("absolute path")
	case p[0] == '~':
		return bad("home-relative path")
	case hasScheme(p):
		return bad("URL, scheme or drive letter")
	case strings.ContainsFunc(p, isSlashLookalike):
		return bad("slash look-alike in path")
	}
	var comps []string
	for _, c := range strings.Split(p, "/") {
		if len(c) > maxNameBytes {
			return bad("path component longer than 255 bytes")
		}
		if isDotLookalike(c) {
			return bad("dot look-alike component")
		}
		if c == "" || c == "." {
			continue
		}
		comps = append(comps, c)
	}
	return comps, strings.HasSuffix(p, "/"), nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) }

// hasScheme reports a leading "scheme:" (which also covers drive letters such as "C:").
func hasScheme(p string) bool {
	i := strings.IndexByte(p, ':')
	if i <= 0 {
		return false
	}
	for j := 0; j < i; j++ {
		c := p[j]
		alpha := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if j == 0 && !alpha || !(alpha || '0' <= c && c <= '9' || c == '+' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func isSlashLookalike(r rune) bool {
	switch r {
	case '\u2215', '\u2044', '\uFF0F', '\u29F8', '\u2216', '\uFF3C', '\uFE68', '\u29F5', '\u29F9':
		return true
	}
	return false
}

// isDotLookalike reports a component made only of dots and dot look-alikes that contains at least
// one look-alike (so "．．" or ".\u2024" is refused while a plain "..." stays a legal name).
func isDotLookalike(c string) bool {
	if c == "" {
		return false
	}
	odd := false
	for _, r := range c {
		switch r {
		case '.':
		case '\uFF0E', '\u2024', '\u2025', '\u2026', '\uFE52', '\u3002', '\uFF61', '\u00B7', '\u0701', '\u0702', '\uA60E':
			odd = true
		default:
			return false
		}
	}
	return odd
}

// DeniedName reports whether one path component is on the deny list: VCS metadata (.git, .hg…),
// secrets (.env*, .ssh, .aws, .gnupg, id_rsa*, *.pem, *.key, .npmrc, .netrc, .pgpass, credentials
// files…), dependency trees and build caches (node_modules, .cache, __pycache__…). Matching ignores
// case.
func DeniedName(c string) bool {
	l := strings.ToLower(c)
	switch l {
	case ".git", ".hg", ".svn", ".bzr",
		".ssh", ".aws", ".gnupg", ".azure", ".kube", ".docker",
		"node_modules", ".npmrc", ".yarnrc", ".netrc", "_netrc",
		".pgpass", ".pypirc", ".git-credentials", ".htpasswd",
		"credentials", "credentials.json", "credentials.yml", "credentials.yaml",
		".bash_history", ".zsh_history", ".psql_history", ".mysql_history",
		".cache", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
		".gradle", ".m2", ".tox", ".terraform", ".next", ".nuxt", ".parcel-cache", ".turbo":
		return true
	}
	for _, p := range [...]string{".env", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	for _, s := range [...]string{".pem", ".key", ".p12", ".pfx", ".jks", ".keystore", ".kdbx", ".tfstate", ".ovpn"} {
		if strings.HasSuffix(l, s) {
			return true
		}
	}
	return false
}
