package handlers

import (
	"context"

	"berth/db"
	"berth/views"
)

// HostCheck is one finding about the machine Berth runs on (bubblewrap, workers, …), for the
// instance admin's first-run checklist. cmd/berth supplies them (Deps.HostChecks).
type HostCheck struct {
	Name   string
	OK     bool
	Detail string
	Fix    string // what to do when not OK
}

// onboarding is the first-run checklist an instance administrator sees on the dashboard until
// every step is done: the host's findings, a first company, a first environment probed, a first
// project and a first successful run. Each step links to where it is done.
func (s *Server) onboarding(ctx context.Context) (*views.Onboarding, error) {
	o, err := db.OnboardingState(ctx, s.pool)
	if err != nil {
		return nil, err
	}
	var checks []HostCheck
	if s.hostChecks != nil {
		checks = s.hostChecks(ctx)
	}
	v := &views.Onboarding{OpenRequests: o.OpenSourceRequests}
	hostOK := true
	for _, c := range checks {
		hostOK = hostOK && c.OK
		v.Host = append(v.Host, views.HostFinding{Name: c.Name, OK: c.OK, Detail: c.Detail, Fix: c.Fix})
	}
	companyHref := "#create-company"
	if o.FirstCompanyID != "" {
		companyHref = "/companies/" + o.FirstCompanyID
	}
	envHref, projectHref := companyHref, companyHref
	if o.FirstCompanyID != "" {
		envHref = "/companies/" + o.FirstCompanyID + "/environments"
	}
	if o.FirstEnvironmentID != "" {
		envHref = "/environments/" + o.FirstEnvironmentID
	}
	if o.FirstProjectID != "" {
		projectHref = "/projects/" + o.FirstProjectID
	}
	probed := o.ProbedEnvironments > 0 || (o.Environments > 0 && o.LocalEnvironmentOnly && hostOK)
	v.Steps = []views.OnboardingStep{
		{Key: "host", Title: "Check this machine", Done: hostOK && len(checks) > 0, Href: "#host-checks",
			Hint: "Berth runs every command in a bubblewrap jail; the findings below say what this machine offers."},
		{Key: "company", Title: "Create the first company", Done: o.Companies > 0, Href: companyHref,
			Hint: "A company holds projects, environments and people. You become its first board member."},
		{Key: "environment", Title: "Add an environment and probe it", Done: probed, Href: envHref,
			Hint: "Where commands run: local (this host, jailed), sandbox or SSH. A probe checks it works; a local one needs none."},
		{Key: "project", Title: "Create a project with a workspace", Done: o.Projects > 0, Href: projectHref,
			Hint: "A project points at a git repository or a directory and says how tasks get their workspaces."},
		{Key: "run", Title: "Run a first task", Done: o.SucceededRuns > 0, Href: projectHref,
			Hint: "Give a task a command and press Run: the run page shows each step and the log as it happens."},
	}
	all := true
	for _, st := range v.Steps {
		all = all && st.Done
	}
	v.Done = all
	return v, nil
}
