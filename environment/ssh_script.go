package environment

import (
	"strconv"
	"strings"
	"time"
)

// The remote scripts of the ssh driver: how the base directory, the grace and the arguments
// become shell words.

// graceTenths is the grace in tenths of a second, for the remote stop loop.
func (d *sshDriver) graceTenths() string {
	return strconv.FormatInt(int64(d.grace/(100*time.Millisecond)), 10)
}

// baseExpr is the base directory as a shell word: "~/" becomes the remote "$HOME".
func (d *sshDriver) baseExpr() string {
	switch b := d.baseDir; {
	case b == "~":
		return `"$HOME"`
	case strings.HasPrefix(b, "~/"):
		return `"$HOME"/` + shellQuote(strings.TrimPrefix(b, "~/"))
	default:
		return shellQuote(b)
	}
}

// script is a remote script with the helpers every script shares prepended.
func (d *sshDriver) script(body string) string {
	return "base=" + d.baseExpr() + "\n" + stopFunc + body
}

// shellQuote makes s one single-quoted shell word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// remoteCommand is the exec request for script run by /bin/sh with args as $1…: the login shell
// of the remote user only sees one exec of /bin/sh with quoted words.
func remoteCommand(script string, args ...string) string {
	var b strings.Builder
	b.WriteString("exec /bin/sh -c ")
	b.WriteString(shellQuote(script))
	b.WriteString(" berth")
	for _, a := range args {
		b.WriteByte(' ')
		b.WriteString(shellQuote(a))
	}
	return b.String()
}

// session opens a session on the connection of instance ref. A connection that broke without
