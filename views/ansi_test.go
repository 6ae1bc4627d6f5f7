package views

import (
	"context"
	"strings"
	"testing"
)

func TestANSIHTML(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, in, want string
	}{
		{"plain text is escaped", `<script>alert("x")</script> & more`, `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; more`},
		{"red then reset", "\x1b[31mred\x1b[0m plain", `<span class="ansi-fg-1">red</span> plain`},
		{"bare reset", "\x1b[32mok\x1b[m.", `<span class="ansi-fg-2">ok</span>.`},
		{"bold green, then default colour keeps bold", "\x1b[1;32mA\x1b[39mB\x1b[22mC", `<span class="ansi-fg-2 ansi-bold">A</span><span class="ansi-bold">B</span>C`},
		{"bright and background", "\x1b[91;44mx\x1b[0m", `<span class="ansi-fg-9 ansi-bg-4">x</span>`},
		{"256 colours: the first 16 map, the rest are plain", "\x1b[38;5;3ma\x1b[38;5;200mb\x1b[0m", `<span class="ansi-fg-3">a</span>b`},
		{"true colour is consumed, not rendered", "\x1b[38;2;255;0;0mx\x1b[1my", `x<span class="ansi-bold">y</span>`},
		{"same state does not reopen", "\x1b[31ma\x1b[31mb", `<span class="ansi-fg-1">ab</span>`},
		{"escaped text inside a span", "\x1b[33m<img src=x onerror=alert(1)>", `<span class="ansi-fg-3">&lt;img src=x onerror=alert(1)&gt;</span>`},
		{"cursor movement and clear screen dropped", "a\x1b[2J\x1b[1;1Hb\x1b[Kc", `abc`},
		{"OSC title dropped (BEL)", "\x1b]0;pwned\x07after", `after`},
		{"OSC 8 hyperlink never becomes a link", "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\", `click`},
		{"DCS dropped", "\x1bPq#0;2;0;0;0\x1b\\x", `x`},
		{"charset escape dropped", "\x1b(Bx\x1b=y", `xy`},
		{"unterminated CSI eats the rest", "a\x1b[31", `a`},
		{"lone ESC at the end", "a\x1b", `a`},
		{"BEL and backspace shown, newlines and tabs kept", "ding\a\b\n\tx", "ding\u2407\u2408\n\tx"},
		{"C1 CSI dropped", "a\u009b31mb", `a31mb`},
		{"unicode kept", "✓ 日本", "✓ 日本"},
	}
	for _, tc := range cases {
		if got := ansiHTML(tc.in); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

// TestANSILogComponent renders through templ and checks the invariants for arbitrary input:
// no inline style, no tag other than span, balanced spans.
func TestANSILogComponent(t *testing.T) {
	t.Parallel()
	in := "\x1b[1;31mERROR\x1b[0m <b>x</b> \x1b[4;92mok\x1b]8;;javascript:alert(1)\x07link\x1b[38;5;999;48;5;1m" + strings.Repeat("\x1b[", 3)
	var b strings.Builder
	if err := ANSILog(in).Render(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "style=") || strings.Contains(out, "<b>") || strings.Contains(out, "javascript:") || strings.Contains(out, "<a") {
		t.Fatalf("unsafe output: %s", out)
	}
	if strings.Count(out, "<span") != strings.Count(out, "</span>") {
		t.Fatalf("unbalanced spans: %s", out)
	}
	if !strings.Contains(out, `<span class="ansi-fg-1 ansi-bold">ERROR</span>`) {
		t.Fatalf("colour lost: %s", out)
	}
}
