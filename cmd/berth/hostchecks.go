package main

import (
	"context"

	"berth/environment/jail"
	"berth/handlers"
	"berth/jobs"
)

// hostChecks is what the dashboard's first-run checklist says about this machine: the facts this
// process found at start (bubblewrap, prlimit and the run user; whether it runs jobs). `berth
// doctor` (cmd/berth/doctor.go) is the fuller set; this is the part a server knows without running anything.
func hostChecks(d jobs.Deps, c config) func(context.Context) []handlers.HostCheck {
	return func(context.Context) []handlers.HostCheck {
		out := []handlers.HostCheck{}
		if d.Jail != nil {
			detail := "bubblewrap at " + d.Jail.Bwrap + ", prlimit at " + d.Jail.Prlimit
			if d.Jail.Identity != nil {
				detail += "; jailed commands run as " + jail.RunUser
			}
			out = append(out, handlers.HostCheck{Name: "Command jail (bubblewrap)", OK: true, Detail: detail})
		} else {
			out = append(out, handlers.HostCheck{Name: "Command jail (bubblewrap)", OK: false,
				Detail: "Not available: runs on contained environments are refused.", Fix: jail.Fix})
		}
		if c.Workers {
			out = append(out, handlers.HostCheck{Name: "Background workers", OK: true, Detail: "This process runs jobs (provisioning, runs, cleanup)."})
		} else {
			out = append(out, handlers.HostCheck{Name: "Background workers", OK: true,
				Detail: "This process serves pages only (--workers=false): runs need a `berth worker` on this database."})
		}
		return out
	}
}
