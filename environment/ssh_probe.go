package environment

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
)

// sshMinFreeKiB is the free space below which the base directory fails the probe.
const sshMinFreeKiB = 100 << 10

// probeScript reports, one per line, whether each tool is installed ("tool NAME ok|missing"),
// the system ("os …") and the free KiB where workspaces go ("df N", or "df -" when the base
// cannot be made).
const probeScript = `for t in sh tar git setsid; do
	if command -v "$t" >/dev/null 2>&1; then echo "tool $t ok"; else echo "tool $t missing"; fi
done
echo "os $(uname -srm 2>/dev/null)"
if mkdir -p "$base" 2>/dev/null; then
	df -Pk "$base" 2>/dev/null | { read -r _ || :; read -r _ _ _ avail _ || :; echo "df ${avail:--}"; }
else
	echo "df -"
fi
`

// Probe connects with the pinned host key and the private key, then checks that sh, tar, git and
// setsid are installed and how much space the base directory has. A host key other than the
// pinned one is the failed check host_key (host_key_mismatch), and nothing else is tried.
func (d *sshDriver) Probe(ctx context.Context) (ProbeResult, error) {
	if err := ctx.Err(); err != nil {
		return ProbeResult{}, fmt.Errorf("probe: %w", err)
	}
	fp := ssh.FingerprintSHA256(d.hostKey)
	var checks []Check
	cl, err := d.dial(ctx)
	switch {
	case ctx.Err() != nil:
		return ProbeResult{}, fmt.Errorf("probe: %w", ctx.Err())
	case errors.Is(err, ErrHostKeyMismatch):
		checks = append(checks, Check{Name: "host_key", Status: CheckFail,
			Detail: "host_key_mismatch: the server did not show the pinned key " + fp})
	case err != nil:
		checks = append(checks, Check{Name: "connect", Status: CheckFail, Detail: err.Error()})
	default:
		defer cl.Close()
		checks = append(checks, Check{Name: "host_key", Status: CheckPass, Detail: "the server shows the pinned key " + fp},
			Check{Name: "connect", Status: CheckPass, Detail: "signed in as " + d.cfg.User})
		checks = append(checks, d.probeHost(ctx, cl)...)
	}
	if err := ctx.Err(); err != nil {
		return ProbeResult{}, fmt.Errorf("probe: %w", err)
	}
	r := ProbeResult{OK: true, Checks: checks}
	var failed []string
	var system, space string
	for _, c := range checks {
		switch {
		case c.Status == CheckFail:
			r.OK = false
			failed = append(failed, c.Name+": "+c.Detail)
		case c.Name == "os":
			system = c.Detail
		case c.Name == "disk":
			space = c.Detail
		}
	}
	if r.OK {
		r.Summary = fmt.Sprintf("Commands run on %s as %s (%s); %s.", d.addr, d.cfg.User, system, space)
	} else {
		r.Summary = "SSH probe failed: " + strings.Join(failed, "; ") + "."
	}
	return r, nil
}

// probeHost runs the probe script and turns its lines into checks.
func (d *sshDriver) probeHost(ctx context.Context, cl *ssh.Client) []Check {
	sctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	s, err := cl.NewSession()
	if err != nil {
		return []Check{{Name: "shell", Status: CheckFail, Detail: "cannot open a session: " + err.Error()}}
	}
	out, err := runScriptTo(sctx, s, d.script(probeScript), nil, nil)
	if err != nil {
		return []Check{{Name: "shell", Status: CheckFail, Detail: "running /bin/sh failed: " + err.Error()}}
	}
	checks := []Check{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "tool":
			c := Check{Name: f[1], Status: CheckPass, Detail: f[1] + " is installed"}
			if f[2] != "ok" {
				c.Status, c.Detail = CheckFail, f[1]+" is not installed on the remote host"
			}
			checks = append(checks, c)
		case len(f) >= 1 && f[0] == "os":
			checks = append(checks, Check{Name: "os", Status: CheckInfo, Detail: strings.TrimSpace(strings.TrimPrefix(line, "os"))})
		case len(f) == 2 && f[0] == "df":
			checks = append(checks, diskCheck(f[1]))
		}
	}
	if len(checks) == 0 {
		return []Check{{Name: "shell", Status: CheckFail, Detail: "/bin/sh gave no answer"}}
	}
	return checks
}

// diskCheck grades the free KiB df reported for the base directory.
func diskCheck(avail string) Check {
	c := Check{Name: "disk", Status: CheckFail}
	kib, err := strconv.ParseInt(avail, 10, 64)
	switch {
	case err != nil:
		c.Detail = "cannot make or measure the workspace base directory"
	case kib < sshMinFreeKiB:
		c.Detail = fmt.Sprintf("only %s free for workspaces (at least %s needed)", humanKiB(kib), humanKiB(sshMinFreeKiB))
	default:
		c.Status, c.Detail = CheckPass, humanKiB(kib)+" free for workspaces"
	}
	return c
}

// humanKiB writes a size given in KiB with a binary unit.
func humanKiB(kib int64) string {
	switch {
	case kib >= 1<<20:
		return fmt.Sprintf("%.1f GiB", float64(kib)/(1<<20))
	case kib >= 1<<10:
		return fmt.Sprintf("%.1f MiB", float64(kib)/(1<<10))
	default:
		return fmt.Sprintf("%d KiB", kib)
	}
}
