package handlers

import (
	"context"
	"strings"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// planSteps phrases a plan trace for a page: an effect that names an environment or a workspace
// by id shows its name (envName, reuseName; "" when unknown); the codes stay on the step.
func planSteps(trace []workspace.TraceStep, envName func(id string) string, reuseName string) []views.PlanStep {
	out := make([]views.PlanStep, 0, len(trace))
	for _, t := range trace {
		st := views.PlanStep{Rule: t.Rule, Effect: t.Effect, Reason: t.Reason}
		if id, ok := strings.CutPrefix(t.Effect, "environment="); ok {
			if name := envName(id); name != "" {
				st.EffectText = "environment " + name
			}
		}
		if _, ok := strings.CutPrefix(t.Effect, "reuse="); ok && reuseName != "" {
			st.EffectText = "reuse " + reuseName
		}
		out = append(out, st)
	}
	return out
}

// auditTargetNames names the targets of events (of any companies the caller may read), keyed
// by company, type and id as auditTargetKey builds it.
func (s *Server) auditTargetNames(ctx context.Context, events []db.AuditEvent) (map[string]string, error) {
	byCompany := map[string][]string{}
	for _, e := range events {
		if e.CompanyID != "" && e.TargetID != "" {
			byCompany[e.CompanyID] = append(byCompany[e.CompanyID], e.TargetID)
		}
	}
	out := map[string]string{}
	for cid, ids := range byCompany {
		names, err := db.AuditTargetNames(ctx, s.pool, cid, ids)
		if err != nil {
			return nil, err
		}
		for k, v := range names {
			out[cid+"/"+k] = v
		}
	}
	return out, nil
}

// auditTargetKey is the key of an event's target in auditTargetNames' answer.
func auditTargetKey(e db.AuditEvent) string {
	return e.CompanyID + "/" + e.TargetType + "/" + e.TargetID
}

// auditTargetLink is an event's target name and page: the page only when the target still
// exists (it has a name) or is a page of its own that says it is gone.
func auditTargetLink(e db.AuditEvent, names map[string]string) (name, href string) {
	name = names[auditTargetKey(e)]
	if name != "" || e.TargetType == "image_setup_session" {
		href = views.TargetURL(e.CompanyID, e.TargetType, e.TargetID)
	}
	return name, href
}
