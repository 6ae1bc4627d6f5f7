package views

import (
	"context"
	"html"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/a-h/templ"
)

// ANSILog renders a run log for a <pre>: SGR colour and emphasis codes become spans with fixed
// ansi-* classes (the palette is in static/css/app.css; no inline style, so the CSP holds), and
// nothing else in the log is ever interpreted. Every other escape sequence (cursor movement, OSC
// titles and hyperlinks, DCS, …) is dropped, other control characters are shown as their visible
// symbol (BEL as ␇), and all text is HTML-escaped.
func ANSILog(log string) templ.Component {
	return templ.ComponentFunc(func(_ context.Context, w io.Writer) error {
		_, err := io.WriteString(w, ansiHTML(log))
		return err
	})
}

// sgr is the rendering state SGR codes change; the zero value is plain text.
type sgr struct {
	fg, bg                       int // 0 for the default, else 1 + palette index (0–15)
	bold, dim, italic, underline bool
}

// classes is the state as a class attribute value ("" for plain text).
func (s sgr) classes() string {
	var c []string
	if s.fg > 0 {
		c = append(c, "ansi-fg-"+strconv.Itoa(s.fg-1))
	}
	if s.bg > 0 {
		c = append(c, "ansi-bg-"+strconv.Itoa(s.bg-1))
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{s.bold, "ansi-bold"}, {s.dim, "ansi-dim"}, {s.italic, "ansi-italic"}, {s.underline, "ansi-underline"}} {
		if f.on {
			c = append(c, f.name)
		}
	}
	return strings.Join(c, " ")
}

// apply changes the state by one SGR parameter list (ESC [ params m).
func (s *sgr) apply(params string) {
	if params == "" {
		*s = sgr{}
		return
	}
	ps := strings.Split(strings.ReplaceAll(params, ":", ";"), ";")
	for i := 0; i < len(ps); i++ {
		n, err := strconv.Atoi(ps[i])
		if ps[i] == "" {
			n, err = 0, nil
		}
		if err != nil {
			continue
		}
		switch {
		case n == 0:
			*s = sgr{}
		case n == 1:
			s.bold = true
		case n == 2:
			s.dim = true
		case n == 3:
			s.italic = true
		case n == 4:
			s.underline = true
		case n == 22:
			s.bold, s.dim = false, false
		case n == 23:
			s.italic = false
		case n == 24:
			s.underline = false
		case n >= 30 && n <= 37:
			s.fg = n - 30 + 1
		case n == 39:
			s.fg = 0
		case n >= 40 && n <= 47:
			s.bg = n - 40 + 1
		case n == 49:
			s.bg = 0
		case n >= 90 && n <= 97:
			s.fg = n - 90 + 8 + 1
		case n >= 100 && n <= 107:
			s.bg = n - 100 + 8 + 1
		case n == 38 || n == 48:
			// Extended colours: 5;n picks from 256 (the first 16 map to the palette, the rest are
			// left uncoloured), 2;r;g;b is true colour (not rendered: the palette is fixed).
			c := 0
			if i+2 < len(ps) && ps[i+1] == "5" {
				if idx, err := strconv.Atoi(ps[i+2]); err == nil && idx >= 0 && idx < 16 {
					c = idx + 1
				}
				i += 2
			} else if i+1 < len(ps) && ps[i+1] == "2" {
				i += min(4, len(ps)-1-i)
			}
			if n == 38 {
				s.fg = c
			} else {
				s.bg = c
			}
		}
	}
}

// ansiHTML is the HTML ANSILog writes.
func ansiHTML(log string) string {
	var b strings.Builder
	b.Grow(len(log) + len(log)/8)
	var cur, open sgr // the state the text is in, and the one the open span (if any) shows
	spanOpen := false
	text := func(s string) {
		if s == "" {
			return
		}
		if !spanOpen || cur != open {
			if spanOpen {
				b.WriteString("</span>")
				spanOpen = false
			}
			if c := cur.classes(); c != "" {
				b.WriteString(`<span class="`)
				b.WriteString(c)
				b.WriteString(`">`)
				spanOpen, open = true, cur
			}
		}
		b.WriteString(html.EscapeString(s))
	}
	start := 0 // start of the pending plain text
	for i := 0; i < len(log); {
		c := log[i]
		switch {
		case c == 0x1b:
			text(log[start:i])
			i = skipEscape(log, i, &cur)
			start = i
		case c < 0x20 && c != '\n' && c != '\t' && c != '\r', c == 0x7f:
			text(log[start:i])
			sym := rune(0x2400 + rune(c))
			if c == 0x7f {
				sym = 0x2421
			}
			text(string(sym))
			i++
			start = i
		case c >= 0x80:
			r, size := utf8.DecodeRuneInString(log[i:])
			if r >= 0x80 && r <= 0x9f { // C1 controls (8-bit CSI and friends): dropped
				text(log[start:i])
				start = i + size
			}
			i += size
		default:
			i++
		}
	}
	text(log[start:])
	if spanOpen {
		b.WriteString("</span>")
	}
	return b.String()
}

// skipEscape consumes the escape sequence at log[i] (an ESC), applying it to st when it is SGR,
// and returns the index after it. Unfinished sequences consume the rest of the log.
func skipEscape(log string, i int, st *sgr) int {
	if i+1 >= len(log) {
		return len(log)
	}
	switch log[i+1] {
	case '[': // CSI: parameters and intermediates, then one final byte 0x40–0x7E
		j := i + 2
		for j < len(log) && (log[j] < 0x40 || log[j] > 0x7e) {
			if log[j] < 0x20 { // a control inside: not a sequence after all
				return j
			}
			j++
		}
		if j >= len(log) {
			return len(log)
		}
		if log[j] == 'm' {
			st.apply(log[i+2 : j])
		}
		return j + 1
	case ']', 'P', 'X', '^', '_': // OSC, DCS, SOS, PM, APC: until BEL or ST (ESC \)
		for j := i + 2; j < len(log); j++ {
			if log[j] == 0x07 {
				return j + 1
			}
			if log[j] == 0x1b && j+1 < len(log) && log[j+1] == '\\' {
				return j + 2
			}
		}
		return len(log)
	default: // a two-byte escape (or with one intermediate byte, such as ESC ( B)
		j := i + 1
		for j < len(log) && log[j] >= 0x20 && log[j] <= 0x2f {
			j++
		}
		return min(j+1, len(log))
	}
}
